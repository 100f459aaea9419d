package node

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
)

// Rules of server.admin_token_file.
const (
	// minAdminTokenBytes is the shortest token accepted.
	minAdminTokenBytes = 32
	// maxAdminTokenFileBytes bounds what is read of the file.
	maxAdminTokenFileBytes = 4096
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
	tok, err := readAdminToken(path)
	if err != nil {
		return nil, fmt.Errorf("server.admin_token_file %s: %w", path, err)
	}
	d := adminToken(sha256.Sum256(tok))
	clear(tok)
	return &d, nil
}

func readAdminToken(path string) ([]byte, error) {
	li, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if err := checkTokenFileMode(li.Mode()); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The file opened must be the one checked (not swapped in between).
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(li, fi) {
		return nil, errors.New("the file changed while it was read")
	}
	if err := checkTokenFileMode(fi.Mode()); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAdminTokenFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxAdminTokenFileBytes {
		clear(b)
		return nil, fmt.Errorf("the file is larger than %d bytes; it must hold one token", maxAdminTokenFileBytes)
	}
	tok, err := parseAdminToken(b)
	if err != nil {
		clear(b)
		return nil, err
	}
	return tok, nil
}

func checkTokenFileMode(m fs.FileMode) error {
	switch {
	case m&fs.ModeSymlink != 0:
		return errors.New("the file is a symlink; name the regular file itself")
	case !m.IsRegular():
		return fmt.Errorf("not a regular file (%s)", m.Type())
	case m.Perm()&0o077 != 0:
		return fmt.Errorf("mode %04o lets group or others read or write it; chmod 600 (or 400) it", m.Perm())
	}
	return nil
}

// parseAdminToken checks the file's content and returns the token.
func parseAdminToken(b []byte) ([]byte, error) {
	tok := bytes.TrimSuffix(b, []byte("\n"))
	switch {
	case bytes.IndexByte(tok, '\r') >= 0:
		return nil, errors.New("the token contains a carriage return")
	case bytes.IndexByte(tok, 0) >= 0:
		return nil, errors.New("the token contains a NUL byte")
	case bytes.IndexByte(tok, '\n') >= 0:
		return nil, errors.New("the file holds more than one line; it must hold one token (one trailing newline is allowed)")
	case bytes.ContainsFunc(tok, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return nil, errors.New("the token contains a control character")
	case len(bytes.TrimSpace(tok)) != len(tok):
		return nil, errors.New("the token begins or ends with a blank")
	case len(tok) < minAdminTokenBytes:
		return nil, fmt.Errorf("the token is %d bytes; it must be at least %d", len(tok), minAdminTokenBytes)
	}
	return tok, nil
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
