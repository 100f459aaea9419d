package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Rules of a bearer token and of the files secrets live in.
const (
	// MinTokenBytes is the shortest bearer token accepted.
	MinTokenBytes = 32
	// maxTokenFileBytes bounds a file of one token.
	maxTokenFileBytes = 4096
	// MaxSecretFileBytes bounds any file of secrets (a list of tokens).
	MaxSecretFileBytes = 64 << 10
)

// ReadSecretFile reads a file holding secrets: it must be a regular file
// (not a symlink), not readable or writable by group or others, and at
// most max bytes; the file opened must be the one checked. Errors name the
// broken rule, never the content.
func ReadSecretFile(path string, max int) ([]byte, error) {
	li, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if err := checkSecretFileInfo(li); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(li, fi) {
		return nil, errors.New("the file changed while it was read")
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		clear(b)
		return nil, fmt.Errorf("the file is larger than %d bytes", max)
	}
	return b, nil
}

// CheckSecretFileMode refuses a symlink, a file that is not regular, and a
// file group or others may read or write.
func CheckSecretFileMode(m fs.FileMode) error {
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

// checkSecretFileInfo is CheckSecretFileMode, except that a file root
// manages for a process that is not root may also be readable (never
// writable) by its group: only root can have written it, and it is how
// Kubernetes mounts a Secret for such a process (owner root, group the
// pod's fsGroup, mode 0440) and how a host hands a service's group a file
// root manages (0640).
func checkSecretFileInfo(fi fs.FileInfo) error {
	m := fi.Mode()
	if rootManaged(fi) && m.IsRegular() && m.Perm()&0o037 == 0 {
		return nil
	}
	return CheckSecretFileMode(m)
}

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid

// rootManaged reports whether root owns the file and this process is not
// root.
func rootManaged(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0 && geteuid() != 0
}

// CheckSecretFileOwner refuses a secret file a server should not trust: one
// owned by another user than the process's or root, or in a directory
// group or others may write (where another user could replace it).
func CheckSecretFileOwner(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != geteuid() && st.Uid != 0 {
		return fmt.Errorf("the file is owned by uid %d, not by this process's user (uid %d) or root", st.Uid, geteuid())
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if di.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("its directory %s (mode %04o) is writable by group or others; keep secrets in a directory only the server's user may write", dir, di.Mode().Perm())
	}
	return nil
}

// ReadTokenFile reads a file holding one bearer token (ReadSecretFile's
// rules, then ParseToken's).
func ReadTokenFile(path string) ([]byte, error) {
	b, err := ReadSecretFile(path, maxTokenFileBytes)
	if err != nil {
		return nil, err
	}
	tok, err := ParseToken(bytes.TrimSuffix(b, []byte("\n")))
	if err != nil {
		clear(b)
		return nil, err
	}
	return tok, nil
}

// ParseToken checks a bearer token: at least MinTokenBytes, no carriage
// return, NUL, other control character or inner newline, and no
// surrounding blank.
func ParseToken(tok []byte) ([]byte, error) {
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
	case len(tok) < MinTokenBytes:
		return nil, fmt.Errorf("the token is %d bytes; it must be at least %d", len(tok), MinTokenBytes)
	}
	return tok, nil
}
