package powerloss

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ursula/ursula/storage/wal"
)

var (
	// ErrPowerLost is returned by every call on an FS, and on every File
	// opened through it, after its PowerLoss: the process using it died
	// with the host.
	ErrPowerLost = errors.New("powerloss: the power was lost: this file system and its open files are gone (open a new FS over the root)")
	// ErrNotModelled is returned for operations the model does not cover
	// (renaming or removing a directory, a path outside the root).
	ErrNotModelled = errors.New("powerloss: not modelled")
)

// FS is a wal.FS over a real directory that tracks what was made durable.
// It is safe for concurrent use: every call holds one lock, the real system
// call included.
type FS struct {
	root string // absolute and clean

	mu   sync.Mutex
	top  *node
	open map[*file]struct{}
	lost bool
	boot string
}

var (
	_ wal.FS       = (*FS)(nil)
	_ wal.BootIDer = (*FS)(nil)
)

// bootSeq numbers the boots the model stands for, one per FS.
var bootSeq atomic.Uint64

// BootID implements wal.BootIDer: an FS stands for one boot of its
// machine, so the FS opened over the root after a power loss (or any other
// new FS) is a new boot, and the journals it holds are not trusted as a
// surviving page cache.
func (f *FS) BootID() string { return f.boot }

// New returns an FS over the directory root, which must exist. Everything
// under root when the FS first looks at it counts as durable. New does no
// I/O.
func New(root string) *FS {
	abs, err := filepath.Abs(root)
	if err != nil {
		abs = filepath.Clean(root)
	}
	return &FS{root: abs, top: newDir(), open: map[*file]struct{}{}, boot: fmt.Sprintf("powerloss-%d-%d", os.Getpid(), bootSeq.Add(1))}
}

// node is a file or a directory as the model knows it.
type node struct {
	dir bool

	// A file: cur is its content as last written (what the real file
	// holds), synced its content as of its last Sync. Nothing below dirty
	// changed since that Sync: cur[:dirty] == synced[:dirty].
	cur, synced []byte
	dirty       int

	// A directory: its entries now and as its last Sync left them, for the
	// names in known (the names it has looked at; the others are left
	// alone).
	entries, durable map[string]*node
	known            map[string]bool
}

func newDir() *node {
	return &node{dir: true, entries: map[string]*node{}, durable: map[string]*node{}, known: map[string]bool{}}
}

// write records p written at offset at.
func (n *node) write(at int, p []byte) {
	old := len(n.cur)
	if end := at + len(p); end > old {
		n.cur = append(n.cur, make([]byte, end-old)...)
	}
	copy(n.cur[at:], p)
	n.dirty = min(n.dirty, at, old)
}

// truncate records a Truncate to size.
func (n *node) truncate(size int) {
	old := len(n.cur)
	if size <= old {
		n.cur = n.cur[:size]
	} else {
		n.cur = append(n.cur, make([]byte, size-old)...)
	}
	n.dirty = min(n.dirty, size, old)
}

// sync makes a file's content durable, or a directory's entries.
func (n *node) sync() {
	if n.dir {
		for name := range n.known {
			if e := n.entries[name]; e != nil {
				n.durable[name] = e
			} else {
				delete(n.durable, name)
			}
		}
		return
	}
	n.synced = append(n.synced[:n.dirty], n.cur[n.dirty:]...)
	n.dirty = len(n.cur)
}

// split returns the path components of name below the root.
func (f *FS) split(op, name string) ([]string, string, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: err}
	}
	rel, err := filepath.Rel(f.root, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: outside the root %s", ErrNotModelled, f.root)}
	}
	if rel == "." {
		return nil, abs, nil
	}
	return strings.Split(rel, string(filepath.Separator)), abs, nil
}

// child returns the entry name of directory d (at real path dir), looking
// at the real directory the first time: what is there then is durable.
func (f *FS) child(d *node, dir, name string) (*node, error) {
	if d.known[name] {
		return d.entries[name], nil
	}
	path := filepath.Join(dir, name)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.known[name] = true
		return nil, nil
	case err != nil:
		return nil, err
	}
	n := newDir()
	if !fi.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		n = &node{cur: data, synced: append([]byte(nil), data...), dirty: len(data)}
	}
	d.known[name] = true
	d.entries[name] = n
	d.durable[name] = n
	return n, nil
}

// walk returns the directory at parts and its real path; mkdir creates
// what is missing.
func (f *FS) walk(op string, parts []string, mkdir bool, perm fs.FileMode) (*node, string, error) {
	d, path := f.top, f.root
	for _, name := range parts {
		c, err := f.child(d, path, name)
		if err != nil {
			return nil, "", &fs.PathError{Op: op, Path: filepath.Join(path, name), Err: err}
		}
		next := filepath.Join(path, name)
		switch {
		case c == nil && mkdir:
			if err := os.Mkdir(next, perm); err != nil {
				return nil, "", err
			}
			c = newDir()
			d.entries[name] = c
		case c == nil:
			return nil, "", &fs.PathError{Op: op, Path: next, Err: fs.ErrNotExist}
		case !c.dir:
			return nil, "", &fs.PathError{Op: op, Path: next, Err: syscall.ENOTDIR}
		}
		d, path = c, next
	}
	return d, path, nil
}

// entry resolves name to its directory, the entry's base name and the
// entry (nil if absent). The root itself has no directory.
func (f *FS) entry(op, name string) (dir *node, base string, n *node, err error) {
	parts, _, err := f.split(op, name)
	if err != nil {
		return nil, "", nil, err
	}
	if len(parts) == 0 {
		return nil, "", f.top, nil
	}
	dir, dirPath, err := f.walk(op, parts[:len(parts)-1], false, 0)
	if err != nil {
		return nil, "", nil, err
	}
	base = parts[len(parts)-1]
	n, err = f.child(dir, dirPath, base)
	if err != nil {
		return nil, "", nil, &fs.PathError{Op: op, Path: name, Err: err}
	}
	return dir, base, n, nil
}

// OpenFile implements wal.FS. A directory opened read-only returns a File
// whose Sync makes the directory's entries durable.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (wal.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return nil, ErrPowerLost
	}
	dir, base, n, err := f.entry("open", name)
	if err != nil {
		return nil, err
	}
	osf, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if n == nil {
		n = &node{}
		dir.entries[base] = n
	}
	if !n.dir && flag&os.O_TRUNC != 0 && flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		n.truncate(0)
	}
	h := &file{fs: f, n: n, f: osf, append: flag&os.O_APPEND != 0}
	f.open[h] = struct{}{}
	return h, nil
}

// Remove implements wal.FS. Removing a directory is not modelled.
func (f *FS) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return ErrPowerLost
	}
	dir, base, n, err := f.entry("remove", name)
	if err != nil {
		return err
	}
	if n != nil && n.dir {
		return &fs.PathError{Op: "remove", Path: name, Err: fmt.Errorf("%w: removing a directory", ErrNotModelled)}
	}
	if err := os.Remove(name); err != nil {
		return err
	}
	delete(dir.entries, base)
	return nil
}

// Rename implements wal.FS. Renaming a directory is not modelled.
func (f *FS) Rename(oldpath, newpath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return ErrPowerLost
	}
	odir, obase, n, err := f.entry("rename", oldpath)
	if err != nil {
		return err
	}
	ndir, nbase, _, err := f.entry("rename", newpath)
	if err != nil {
		return err
	}
	if n != nil && n.dir {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fmt.Errorf("%w: renaming a directory", ErrNotModelled)}
	}
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	delete(odir.entries, obase)
	ndir.entries[nbase] = n
	return nil
}

// MkdirAll implements wal.FS.
func (f *FS) MkdirAll(path string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return ErrPowerLost
	}
	parts, _, err := f.split("mkdir", path)
	if err != nil {
		return err
	}
	_, _, err = f.walk("mkdir", parts, true, perm)
	return err
}

// ReadDir implements wal.FS.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return nil, ErrPowerLost
	}
	if _, _, err := f.split("readdir", name); err != nil {
		return nil, err
	}
	return os.ReadDir(name)
}

// file is a File opened through an FS.
type file struct {
	fs     *FS
	n      *node
	f      *os.File
	off    int
	append bool
}

var _ wal.File = (*file)(nil)

// check reports why h cannot be used; called with h.fs.mu held.
func (h *file) check() error {
	switch {
	case h.fs.lost:
		return ErrPowerLost
	case h.f == nil:
		return os.ErrClosed
	}
	return nil
}

func (h *file) Read(p []byte) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.f.Read(p)
	h.off += n
	return n, err
}

func (h *file) Write(p []byte) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.f.Write(p)
	at := h.off
	if h.append {
		at = len(h.n.cur)
	}
	if n > 0 {
		h.n.write(at, p[:n])
	}
	h.off = at + n
	return n, err
}

func (h *file) WriteAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return 0, err
	}
	n, err := h.f.WriteAt(p, off)
	if n > 0 {
		h.n.write(int(off), p[:n])
	}
	return n, err
}

func (h *file) Truncate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return err
	}
	if err := h.f.Truncate(size); err != nil {
		return err
	}
	h.n.truncate(int(size))
	return nil
}

// Sync makes the file's content durable or, on a directory, its entries.
// It does not fsync the real file.
func (h *file) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return err
	}
	h.n.sync()
	return nil
}

func (h *file) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return err
	}
	err := h.f.Close()
	h.f = nil
	delete(h.fs.open, h)
	return err
}
