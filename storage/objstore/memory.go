package objstore

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// Memory is a Store held in a map: for tests and single-process tools. It
// copies bodies in and out, so callers may reuse their slices.
type Memory struct {
	now func() time.Time

	mu      sync.RWMutex
	objects map[string]memObject
}

type memObject struct {
	body     []byte
	modified time.Time
}

// MemoryOption configures a Memory store.
type MemoryOption func(*Memory)

// WithClock makes the store stamp Info.Modified with now() instead of
// time.Now(), so tests can age objects (for example orphan collection).
// now is called under the store's lock and must not call back into it.
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) { m.now = now }
}

// NewMemory returns an empty in-memory store.
func NewMemory(opts ...MemoryOption) *Memory {
	m := &Memory{now: time.Now, objects: make(map[string]memObject)}
	for _, opt := range opts {
		opt(m)
	}
	return m
}

var _ Store = (*Memory)(nil)

// Location names a memory store "memory:": no other process can reach it.
func (m *Memory) Location() (location, endpoint string) { return "memory:", "" }

// Put implements Store.
func (m *Memory) Put(ctx context.Context, key string, body []byte) error {
	if err := ValidateKey(key); err != nil {
		return opError(opPut, key, err)
	}
	if err := ctx.Err(); err != nil {
		return opError(opPut, key, err)
	}
	body = bytes.Clone(body)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objects[key] = memObject{body: body, modified: m.stamp()}
	return nil
}

// PutIfAbsent implements Store.
func (m *Memory) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, error) {
	if err := ValidateKey(key); err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	if err := ctx.Err(); err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	body = bytes.Clone(body)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objects[key]; ok {
		return false, nil
	}
	m.objects[key] = memObject{body: body, modified: m.stamp()}
	return true, nil
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, key string) ([]byte, error) {
	obj, err := m.lookup(ctx, opGet, key)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(obj.body), nil
}

// GetRange implements Store.
func (m *Memory) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	if err := checkRange(off, n); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	obj, err := m.lookup(ctx, opGetRange, key)
	if err != nil {
		return nil, err
	}
	size := int64(len(obj.body))
	if off >= size {
		return nil, opError(opGetRange, key, pastEnd(off, size))
	}
	return bytes.Clone(obj.body[off:rangeEnd(off, n, size)]), nil
}

// Head implements Store.
func (m *Memory) Head(ctx context.Context, key string) (Info, error) {
	obj, err := m.lookup(ctx, opHead, key)
	if err != nil {
		return Info{}, err
	}
	return Info{Key: key, Size: int64(len(obj.body)), Modified: obj.modified}, nil
}

// List implements Store. It lists a snapshot taken when it starts, so fn
// may call back into the store.
func (m *Memory) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := validatePrefix(prefix); err != nil {
		return opError(opList, prefix, err)
	}
	m.mu.RLock()
	infos := make([]Info, 0, len(m.objects))
	for key, obj := range m.objects {
		if strings.HasPrefix(key, prefix) {
			infos = append(infos, Info{Key: key, Size: int64(len(obj.body)), Modified: obj.modified})
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(infos, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return opError(opList, prefix, err)
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Store.
func (m *Memory) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := ValidateKey(key); err != nil {
			return opError(opDelete, key, err)
		}
	}
	if err := ctx.Err(); err != nil && len(keys) > 0 {
		return opError(opDelete, keys[0], err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, key := range keys {
		delete(m.objects, key)
	}
	return nil
}

func (m *Memory) lookup(ctx context.Context, op, key string) (memObject, error) {
	if err := ValidateKey(key); err != nil {
		return memObject{}, opError(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return memObject{}, opError(op, key, err)
	}
	m.mu.RLock()
	obj, ok := m.objects[key]
	m.mu.RUnlock()
	if !ok {
		return memObject{}, opError(op, key, ErrNotFound)
	}
	return obj, nil
}

// stamp is the modification time of a write; m.mu is held.
func (m *Memory) stamp() time.Time {
	return m.now().Round(0) // wall clock only, like the other stores
}
