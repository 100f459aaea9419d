package node

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"

	"github.com/ursula/ursula/internal/pki"
)

// adminToken is the digest of the admin bearer token: requests are checked
// by comparing digests in constant time, and the token itself is not kept.
type adminToken [sha256.Size]byte

// loadAdminToken reads server.admin_token_file. The file must be a regular
// file (not a symlink) owned by this process's user, not readable or
// writable by group or others (a file root owns may be readable by its
// group, package pki), in a directory group and others cannot write, and hold exactly one token of at least 32 bytes with no carriage
// return, NUL, other control character or inner newline, and no
// surrounding blanks; one trailing newline is allowed and is not part of
// the token. An empty path means no token (nil). Errors name the file and
// the broken rule, never the token.
func loadAdminToken(path string) (*adminToken, error) {
	if path == "" {
		return nil, nil
	}
	if err := pki.CheckSecretFileOwner(path); err != nil {
		return nil, fmt.Errorf("server.admin_token_file %s: %w", path, err)
	}
	tok, err := pki.ReadTokenFile(path)
	if err != nil {
		return nil, fmt.Errorf("server.admin_token_file %s: %w", path, err)
	}
	d := adminToken(sha256.Sum256(tok))
	clear(tok)
	return &d, nil
}

// defaultAdminTokenFile is the token file of a node that names none.
const defaultAdminTokenFile = "admin.token"

// ensureAdminToken creates path with a random token (mode 600) unless it
// exists; created reports a new file. The token is never logged.
func ensureAdminToken(path string) (created bool, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create the admin token file %s: %w", path, err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return false, err
	}
	tok := hex.EncodeToString(raw[:])
	_, werr := f.WriteString(tok + "\n")
	serr := f.Sync()
	if err := errors.Join(werr, serr, f.Close()); err != nil {
		_ = os.Remove(path)
		return false, fmt.Errorf("write the admin token file %s: %w", path, err)
	}
	return true, nil
}

// allows reports whether r carries the token as "Authorization: Bearer
// <token>". The digests are compared in constant time.
func (t *adminToken) allows(r *http.Request) bool {
	return t.allowsCredential(r.Header.Get("Authorization"))
}

// allowsCredential reports whether an Authorization value (an HTTP
// header, or the authorization metadata of a gRPC call) is "Bearer
// <token>".
func (t *adminToken) allowsCredential(authorization string) bool {
	scheme, cred, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(cred))
	return subtle.ConstantTimeCompare(got[:], t[:]) == 1
}
