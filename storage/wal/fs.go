package wal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// File is the subset of *os.File the journal and the snapshot store use.
type File interface {
	io.Reader
	io.Writer
	io.Closer
	io.WriterAt
	// Sync flushes the file to stable storage.
	Sync() error
	// Truncate changes the size of the file.
	Truncate(size int64) error
}

// FS is the file-system seam used by the journal and the snapshot store.
// Tests and fault injection wrap it; production code uses OSFS.
type FS interface {
	// OpenFile opens a file like os.OpenFile. Opening a directory read-only
	// must return a File whose Sync flushes the directory entry.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Remove removes a file.
	Remove(name string) error
	// Rename renames a file atomically.
	Rename(oldpath, newpath string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(path string, perm fs.FileMode) error
	// ReadDir lists a directory sorted by name.
	ReadDir(name string) ([]fs.DirEntry, error)
}

// OSFS is the FS of the operating system.
type OSFS struct{}

// OpenFile implements FS.
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// Rename implements FS.
func (OSFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// MkdirAll implements FS.
func (OSFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }

// ReadDir implements FS.
func (OSFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }

// SyncDir fsyncs a directory so that creations, renames and removals in it
// are durable.
func SyncDir(fsys FS, dir string) error {
	d, err := fsys.OpenFile(dir, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return d.Close()
}

// MkdirDurable creates dir and its missing parents and syncs the parent of
// every directory it created: a new directory's entry is only durable once
// its parent is synced, and a power loss that took raft-log/ or a shard's
// directory would take every journal in it, synced or not.
func MkdirDurable(fsys FS, dir string) error {
	var made []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		f, err := fsys.OpenFile(d, os.O_RDONLY, 0)
		if err == nil {
			_ = f.Close()
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("open dir %s: %w", d, err)
		}
		made = append(made, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(made) == 0 {
		return nil
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range made {
		if err := SyncDir(fsys, filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// ReadFile reads a whole file through fsys.
func ReadFile(fsys FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFileAtomic writes data to name via name.tmp: write, fsync, rename,
// fsync the directory.
func WriteFileAtomic(fsys FS, dir, name string, data ...[]byte) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	for _, part := range data {
		if _, err := f.Write(part); err != nil {
			_ = f.Close()
			return fmt.Errorf("write %s: %w", tmp, err)
		}
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return SyncDir(fsys, dir)
}
