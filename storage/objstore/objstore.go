package objstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Store is a flat key space of immutable-ish objects under one root prefix.
// Keys are relative to the root, use '/' separators, never start with '/'
// (see ValidateKey for the full rules). Every method is safe for concurrent
// use.
type Store interface {
	// Put writes an object whole (replacing any). Bodies above the store's
	// multipart threshold go up in parts (S3).
	Put(ctx context.Context, key string, body []byte) error
	// PutIfAbsent writes the object only when no object has that key;
	// created is false (and nothing changed) when one exists. S3:
	// If-None-Match: *.
	PutIfAbsent(ctx context.Context, key string, body []byte) (created bool, err error)
	// Get reads a whole object.
	Get(ctx context.Context, key string) ([]byte, error)
	// GetRange reads n bytes at off (fewer only at the object's end; off
	// at or beyond the end is an error wrapping ErrInvalidRange, and so
	// are off < 0 and n <= 0, so an empty object has no valid range).
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	// Head returns an object's size and modification time.
	Head(ctx context.Context, key string) (Info, error)
	// List calls fn for every object whose key starts with prefix, in key
	// order, recursively; fn returning an error stops the listing and List
	// returns it.
	List(ctx context.Context, prefix string, fn func(Info) error) error
	// Delete removes objects; a missing key is not an error.
	Delete(ctx context.Context, keys ...string) error
}

// Info describes one object.
type Info struct {
	// Key is the object's key, relative to the store's root.
	Key string
	// Size is the object's length in bytes.
	Size int64
	// Modified is when the object was last written. Its precision is the
	// store's: S3 reports whole seconds from Head and milliseconds from List.
	Modified time.Time
}

var (
	// ErrNotFound reports that no object has the key. Get, GetRange and
	// Head of a missing key return an error wrapping it; nothing else does.
	ErrNotFound = errors.New("objstore: object not found")
	// ErrInvalidRange reports a GetRange whose offset is at or beyond the
	// object's end, or whose offset or length is not usable (off < 0,
	// n <= 0).
	ErrInvalidRange = errors.New("objstore: invalid range")
	// ErrInvalidKey reports a key (or List prefix) that breaks the rules of
	// ValidateKey. Every store rejects such keys before any I/O.
	ErrInvalidKey = errors.New("objstore: invalid key")
	// ErrInvalidConfig reports a configuration that cannot be used.
	ErrInvalidConfig = errors.New("objstore: invalid config")
)

// MaxKeyBytes is the longest key accepted, in bytes (S3's limit, which
// includes the store's root prefix there).
const MaxKeyBytes = 1024

// reservedPrefix starts the names of the filesystem store's temp files; no
// key segment may start with it, so a temp file is never mistaken for an
// object and an object never for a temp file.
const reservedPrefix = ".objstore-tmp"

// Error is the error every store method returns: the operation, the key
// (or List prefix) and the cause. Test the cause with errors.Is against
// ErrNotFound, ErrInvalidRange and ErrInvalidKey; anything else (a refused
// connection, a 5xx, a full disk) is a failure of the store, not an answer
// about the object.
type Error struct {
	// Op is the operation: put, put-if-absent, get, get-range, head, list
	// or delete.
	Op string
	// Key is the object's key, or the prefix for list.
	Key string
	// Err is the cause.
	Err error
}

func (e *Error) Error() string {
	// The sentinels carry the package prefix on their own; do not repeat it.
	return "objstore: " + e.Op + " " + strconv.Quote(e.Key) + ": " +
		strings.TrimPrefix(e.Err.Error(), "objstore: ")
}

func (e *Error) Unwrap() error { return e.Err }

func opError(op, key string, err error) error {
	return &Error{Op: op, Key: key, Err: err}
}

// Operation names, as they appear in Error.Op.
const (
	opPut         = "put"
	opPutIfAbsent = "put-if-absent"
	opGet         = "get"
	opGetRange    = "get-range"
	opHead        = "head"
	opList        = "list"
	opDelete      = "delete"
)

// ValidateKey reports whether key can name an object in every store. A key
// is valid UTF-8 of 1 to MaxKeyBytes bytes made of '/'-separated segments,
// where no segment is empty, "." or "..", or starts with ".objstore-tmp"
// (reserved for the filesystem store's temp files); it contains no
// backslash and no control character (U+0000–U+001F, U+007F). So a key
// never starts or ends with '/' and never has "//".
//
// The error wraps ErrInvalidKey and says which rule was broken.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyBytes)
	}
	if key[0] == '/' {
		return fmt.Errorf("%w: starts with '/'", ErrInvalidKey)
	}
	if err := validateChars(key); err != nil {
		return err
	}
	for seg := range strings.SplitSeq(key, "/") {
		if err := validateSegment(seg); err != nil {
			return err
		}
	}
	return nil
}

// validatePrefix checks a List prefix: "" lists everything; otherwise the
// rules of ValidateKey hold for every segment but the last, which may be
// any (even empty) beginning of a segment, so "a/" and "a/b" are
// valid prefixes and "a/../" is not.
func validatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxKeyBytes {
		return fmt.Errorf("%w: prefix of %d bytes, more than %d", ErrInvalidKey, len(prefix), MaxKeyBytes)
	}
	if prefix[0] == '/' {
		return fmt.Errorf("%w: starts with '/'", ErrInvalidKey)
	}
	if err := validateChars(prefix); err != nil {
		return err
	}
	segs := strings.Split(prefix, "/")
	for _, seg := range segs[:len(segs)-1] {
		if err := validateSegment(seg); err != nil {
			return err
		}
	}
	return nil
}

func validateChars(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 0:
			return fmt.Errorf("%w: contains NUL", ErrInvalidKey)
		case c == '\\':
			return fmt.Errorf("%w: contains a backslash", ErrInvalidKey)
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("%w: contains control character %#02x", ErrInvalidKey, c)
		}
	}
	return nil
}

func validateSegment(seg string) error {
	switch {
	case seg == "":
		return fmt.Errorf("%w: empty segment (leading, trailing or doubled '/')", ErrInvalidKey)
	case seg == "." || seg == "..":
		return fmt.Errorf("%w: %q segment", ErrInvalidKey, seg)
	case strings.HasPrefix(seg, reservedPrefix):
		return fmt.Errorf("%w: segment %q starts with the reserved %q", ErrInvalidKey, seg, reservedPrefix)
	}
	return nil
}

// checkRange validates GetRange's arguments before any I/O.
func checkRange(off, n int64) error {
	if off < 0 || n <= 0 {
		return fmt.Errorf("%w: offset %d, length %d", ErrInvalidRange, off, n)
	}
	return nil
}

// rangeEnd clamps the end of [off, off+n) to size; off < size.
func rangeEnd(off, n, size int64) int64 {
	if n > size-off {
		return size
	}
	return off + n
}

// pastEnd is the error of a GetRange whose offset is at or past the end.
func pastEnd(off, size int64) error {
	return fmt.Errorf("%w: offset %d at or beyond the end (size %d)", ErrInvalidRange, off, size)
}
