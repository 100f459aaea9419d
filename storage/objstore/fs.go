package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// FS is a Store of files under a directory: the key "a/b" is the file
// <dir>/a/b. Writes are crash-safe (see the package documentation). A key
// cannot be both an object and the directory of others ("a" and "a/b"):
// the second write fails.
type FS struct {
	root string
}

// NewFS returns a store rooted at dir, creating the directory if needed.
func NewFS(dir string) (*FS, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: fs: empty directory", ErrInvalidConfig)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("objstore: fs: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("objstore: fs: create root: %w", err)
	}
	return &FS{root: abs}, nil
}

var _ Store = (*FS)(nil)

// Dir returns the store's root directory.
func (s *FS) Dir() string { return s.root }

// Location names the store by its absolute root directory.
func (s *FS) Location() (location, endpoint string) { return s.root, "" }

func (s *FS) path(key string) string {
	return filepath.Join(s.root, filepath.FromSlash(key))
}

// Put implements Store: a temp file in the object's directory, fsync,
// rename over the final name, fsync of the directory.
func (s *FS) Put(ctx context.Context, key string, body []byte) error {
	if err := ValidateKey(key); err != nil {
		return opError(opPut, key, err)
	}
	if err := ctx.Err(); err != nil {
		return opError(opPut, key, err)
	}
	final := s.path(key)
	tmp, err := s.writeTemp(final, body)
	if err != nil {
		return opError(opPut, key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return opError(opPut, key, s.conflict(final, err))
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return opError(opPut, key, err)
	}
	return nil
}

// PutIfAbsent implements Store: a temp file in the object's directory,
// fsync, link(2) to the final name (which fails when the name exists, so
// of concurrent callers exactly one wins), unlink of the temp file, fsync
// of the directory. When the link succeeded but the cleanup or the fsync
// after it failed, it returns true with the error.
func (s *FS) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, error) {
	if err := ValidateKey(key); err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	if err := ctx.Err(); err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	final := s.path(key)
	if fi, err := os.Lstat(final); err == nil && fi.Mode().IsRegular() {
		return false, nil // the common case of a lost race, without writing
	}
	tmp, err := s.writeTemp(final, body)
	if err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	linkErr := os.Link(tmp, final)
	rmErr := os.Remove(tmp)
	switch {
	case errors.Is(linkErr, fs.ErrExist):
		if fi, err := os.Lstat(final); err == nil && !fi.Mode().IsRegular() {
			return false, opError(opPutIfAbsent, key, s.conflict(final, linkErr))
		}
		return false, nil
	case linkErr != nil:
		return false, opError(opPutIfAbsent, key, s.conflict(final, linkErr))
	case rmErr != nil:
		return true, opError(opPutIfAbsent, key, fmt.Errorf("remove temp file: %w", rmErr))
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return true, opError(opPutIfAbsent, key, err)
	}
	return true, nil
}

// writeTemp writes body to a synced temp file in final's directory,
// creating the directories on the way, and returns its path.
func (s *FS) writeTemp(final string, body []byte) (string, error) {
	dir := filepath.Dir(final)
	var f *os.File
	// A concurrent Delete may remove a directory that was just created
	// because it looked empty; the temp file inside keeps it from then on.
	for attempt := 0; ; attempt++ {
		err := s.mkdirs(dir)
		if err == nil {
			f, err = os.CreateTemp(dir, reservedPrefix+"-*")
		}
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 10 {
			return "", s.conflict(final, err)
		}
	}
	tmp := f.Name()
	_, err := f.Write(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("write temp file: %w", err)
	}
	return tmp, nil
}

// mkdirs creates dir and its missing parents below the root, syncing the
// parent of each directory it creates so the new entries are durable.
func (s *FS) mkdirs(dir string) error {
	if dir == s.root {
		return nil
	}
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%q is an object, not a directory", s.keyOf(dir))
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if err := s.mkdirs(parent); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

// conflict explains the errors of a key that collides with the directory
// of other keys, or whose directory is an object.
func (s *FS) conflict(final string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("a parent of the key is an object: %w", err)
	}
	if fi, serr := os.Lstat(final); serr == nil && fi.IsDir() {
		return fmt.Errorf("the key is the directory of other keys: %w", err)
	}
	return err
}

func (s *FS) keyOf(path string) string {
	rel, err := filepath.Rel(s.root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(rel)
}

// Get implements Store.
func (s *FS) Get(ctx context.Context, key string) ([]byte, error) {
	f, size, err := s.open(ctx, opGet, key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body := make([]byte, size)
	if _, err := io.ReadFull(f, body); err != nil {
		return nil, opError(opGet, key, err)
	}
	return body, nil
}

// GetRange implements Store.
func (s *FS) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	if err := checkRange(off, n); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	f, size, err := s.open(ctx, opGetRange, key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if off >= size {
		return nil, opError(opGetRange, key, pastEnd(off, size))
	}
	body := make([]byte, rangeEnd(off, n, size)-off)
	if _, err := f.ReadAt(body, off); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	return body, nil
}

// open opens the object's file. Objects are replaced by rename, never
// rewritten in place, so the open file stays one whole version.
func (s *FS) open(ctx context.Context, op, key string) (*os.File, int64, error) {
	if err := ValidateKey(key); err != nil {
		return nil, 0, opError(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, opError(op, key, err)
	}
	f, err := os.Open(s.path(key))
	if err != nil {
		return nil, 0, opError(op, key, fsNotFound(err))
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, opError(op, key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, opError(op, key, ErrNotFound) // a directory of other keys
	}
	return f, fi.Size(), nil
}

// Head implements Store.
func (s *FS) Head(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, opError(opHead, key, err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, opError(opHead, key, err)
	}
	fi, err := os.Lstat(s.path(key))
	if err != nil {
		return Info{}, opError(opHead, key, fsNotFound(err))
	}
	if !fi.Mode().IsRegular() {
		return Info{}, opError(opHead, key, ErrNotFound)
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// fsNotFound turns the errors that mean "no such object" into ErrNotFound.
func fsNotFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return ErrNotFound
	}
	return err
}

// fnError carries the error of List's fn out of the walk, which stops.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// List implements Store. It walks the directories in key order: the
// entries of a directory sorted by name, where a subdirectory sorts as
// name+"/" (every key below it starts with that), skipping temp files.
func (s *FS) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := validatePrefix(prefix); err != nil {
		return opError(opList, prefix, err)
	}
	// Start at the deepest directory the prefix names whole.
	start := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i+1]
	}
	err := s.walk(ctx, start, prefix, fn)
	var fe fnError
	switch {
	case errors.As(err, &fe):
		return fe.err
	case err != nil:
		return opError(opList, prefix, err)
	}
	return nil
}

// walk lists the directory of key prefix dirKey ("" or ending in '/').
func (s *FS) walk(ctx context.Context, dirKey, prefix string, fn func(Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(filepath.Join(s.root, filepath.FromSlash(dirKey)))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil // nothing under this prefix, or removed meanwhile
		}
		return err
	}
	type entry struct {
		key string // the entry's key; a directory's ends in '/'
		de  fs.DirEntry
	}
	list := make([]entry, 0, len(entries))
	for _, de := range entries {
		name := de.Name()
		if strings.HasPrefix(name, reservedPrefix) {
			continue
		}
		key := dirKey + name
		if de.IsDir() {
			key += "/"
			// Descend only where keys can start with prefix.
			if !strings.HasPrefix(key, prefix) && !strings.HasPrefix(prefix, key) {
				continue
			}
		} else if !de.Type().IsRegular() || !strings.HasPrefix(key, prefix) {
			continue
		}
		list = append(list, entry{key, de})
	}
	slices.SortFunc(list, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	for _, e := range list {
		if e.de.IsDir() {
			if err := s.walk(ctx, e.key, prefix, fn); err != nil {
				return err
			}
			continue
		}
		fi, err := e.de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since ReadDir
		}
		if err != nil {
			return err
		}
		if err := fn(Info{Key: e.key, Size: fi.Size(), Modified: fi.ModTime()}); err != nil {
			return fnError{err}
		}
	}
	return nil
}

// Delete implements Store. After removing a file it removes the parent
// directories that became empty (best effort, never the root). Every key
// is tried; the error joins the failures.
func (s *FS) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := ValidateKey(key); err != nil {
			return opError(opDelete, key, err)
		}
	}
	var errs []error
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			errs = append(errs, opError(opDelete, key, err))
			break
		}
		if err := s.delete(key); err != nil {
			errs = append(errs, opError(opDelete, key, err))
		}
	}
	return errors.Join(errs...)
}

func (s *FS) delete(key string) error {
	path := s.path(key)
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(fsNotFound(err), ErrNotFound) {
			return nil
		}
		return err
	}
	if fi.IsDir() {
		return nil // the directory of other keys: no object has this key
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	dir := filepath.Dir(path)
	if err := syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Remove the directories left empty; a directory that is not empty
	// (or already gone) ends it.
	for dir != s.root {
		if err := os.Remove(dir); err != nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	return nil
}

// syncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	return nil
}
