package node

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/ursula/ursula/internal/pki"
)

// adminToken is the digest of the admin bearer token: requests are checked
// by comparing digests in constant time, and the token itself is not kept.
type adminToken [sha256.Size]byte

// loadAdminToken reads server.admin_token_file. The file must be a regular
// file (not a symlink), not readable or writable by group or others, and
// hold exactly one token of at least 32 bytes with no carriage return, NUL,
// other control character or inner newline, and no surrounding blanks; one
// trailing newline is allowed and is not part of the token. An empty path
// means no token (nil). Errors name the file and the broken rule, never the
// token.
func loadAdminToken(path string) (*adminToken, error) {
	if path == "" {
		return nil, nil
	}
	tok, err := pki.ReadTokenFile(path)
	if err != nil {
		return nil, fmt.Errorf("server.admin_token_file %s: %w", path, err)
	}
	d := adminToken(sha256.Sum256(tok))
	clear(tok)
	return &d, nil
}

// allows reports whether r carries the token as "Authorization: Bearer
// <token>". The digests are compared in constant time.
func (t *adminToken) allows(r *http.Request) bool {
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(cred))
	return subtle.ConstantTimeCompare(got[:], t[:]) == 1
}
