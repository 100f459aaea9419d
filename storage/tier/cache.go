package tier

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// Cache reads objects in fixed-size blocks through an LRU bounded by
// bytes. Objects are immutable, so a cached block never goes stale; a
// block being fetched is fetched once however many readers want it.
//
// Nothing enters the cache unverified: a block is checked by the reader's
// Verifier on the fill path, before it is cached or handed to anyone (the
// reader that fetched it and every reader waiting on the same fetch); a
// block that fails its check is neither cached nor served, so the next
// read fetches it again. Sealed ranges (a chunk's footer, an index page,
// a small snapshot) are verified as a whole the same way.
type Cache struct {
	store     objstore.Store
	blockSize int64
	capacity  int64

	mu       sync.Mutex
	lru      *list.List // of *block, most recent first
	blocks   map[blockID]*list.Element
	inflight map[blockID]*fetch
	size     int64

	hits, misses, fetchErrors, checksumFailures atomic.Uint64
}

// sealedIndex is the block index of an object's sealed range: each object
// has at most one (see ReadSealed).
const sealedIndex = -1

type blockID struct {
	key   string
	index int64
}

type block struct {
	id   blockID
	data []byte
}

type fetch struct {
	done chan struct{}
	data []byte
	err  error
}

// Verifier checks the bytes of an object the cache fetched, before they
// are cached or served.
type Verifier interface {
	// Span widens the byte range [lo, hi) a fill wants to the range Check
	// needs to see (whole checksum blocks).
	Span(lo, hi int64) (int64, int64)
	// Check verifies data, the object's bytes from off; an error wrapping
	// coldfmt.ErrCorrupt means they differ from what was committed.
	Check(off int64, data []byte) error
}

// NewCache returns a cache of capacity bytes over store.
func NewCache(store objstore.Store, blockSize, capacity int64) *Cache {
	return &Cache{
		store: store, blockSize: blockSize, capacity: capacity,
		lru: list.New(), blocks: map[blockID]*list.Element{}, inflight: map[blockID]*fetch{},
	}
}

// CacheStats are the cache's counters.
type CacheStats struct {
	Bytes       int64  `json:"bytes"`
	Hits        uint64 `json:"hits"`
	Misses      uint64 `json:"misses"`
	FetchErrors uint64 `json:"fetch_errors"`
	// ChecksumFailures counts fetches whose bytes failed verification
	// (also counted in FetchErrors).
	ChecksumFailures uint64 `json:"checksum_failures"`
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	size := c.size
	c.mu.Unlock()
	return CacheStats{Bytes: size, Hits: c.hits.Load(), Misses: c.misses.Load(), FetchErrors: c.fetchErrors.Load(),
		ChecksumFailures: c.checksumFailures.Load()}
}

// ReadAt returns n bytes at off of an object of size bytes (for a chunk:
// its data length; its footer is a sealed range), each block verified by
// v when it is fetched. The result may share memory with the cache and
// must not be modified.
func (c *Cache) ReadAt(ctx context.Context, key string, size, off, n int64, v Verifier) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	if off < 0 || off+n > size {
		return nil, fmt.Errorf("tier: read [%d, %d) of %q outside its %d bytes", off, off+n, key, size)
	}
	first, last := off/c.blockSize, (off+n-1)/c.blockSize
	if first == last {
		b, err := c.block(ctx, key, size, first, v)
		if err != nil {
			return nil, err
		}
		lo := off - first*c.blockSize
		return b[lo:min(lo+n, int64(len(b)))], nil
	}
	// The blocks' parts are joined once, by bytes.Join: it allocates the
	// result without zeroing it first, which make would do, only for the
	// copy to overwrite every byte (clearing them was 6 % of a node's CPU
	// in a profile of catch-up reads from offset -1, 1.5 % under replay).
	var few [8][]byte
	parts := few[:0]
	for i := first; i <= last; i++ {
		b, err := c.block(ctx, key, size, i, v)
		if err != nil {
			return nil, err
		}
		lo := max(off-i*c.blockSize, 0)
		hi := min(off+n-i*c.blockSize, int64(len(b)))
		parts = append(parts, b[lo:hi])
	}
	return bytes.Join(parts, nil), nil
}

func (c *Cache) block(ctx context.Context, key string, size, index int64, v Verifier) ([]byte, error) {
	lo := index * c.blockSize
	hi := min(lo+c.blockSize, size)
	return c.get(ctx, blockID{key, index}, func(ctx context.Context) ([]byte, error) {
		flo, fhi := v.Span(lo, hi)
		if flo > lo || fhi < hi {
			return nil, fmt.Errorf("tier: verifier span [%d, %d) does not cover [%d, %d) of %q", flo, fhi, lo, hi, key)
		}
		data, err := c.store.GetRange(ctx, key, flo, fhi-flo)
		if err != nil {
			return nil, shortObject(key, err)
		}
		if int64(len(data)) != fhi-flo {
			return nil, fmt.Errorf("%w: %q: %d bytes at %d, want %d", coldfmt.ErrCorrupt, key, len(data), flo, fhi-flo)
		}
		if err := v.Check(flo, data); err != nil {
			return nil, fmt.Errorf("object %q: %w", key, err)
		}
		return data[lo-flo : hi-flo], nil
	})
}

// ReadSealed returns bytes [off, off+n) of an object, fetched as one range
// and verified as a whole by check before they are cached or served. Each
// object has at most one sealed range (a chunk's footer, a whole page, a
// whole small snapshot): it is cached under the object's key alone.
func (c *Cache) ReadSealed(ctx context.Context, key string, off, n int64, check func([]byte) error) ([]byte, error) {
	return c.get(ctx, blockID{key, sealedIndex}, func(ctx context.Context) ([]byte, error) {
		data, err := c.store.GetRange(ctx, key, off, n)
		if err != nil {
			return nil, shortObject(key, err)
		}
		if int64(len(data)) != n {
			return nil, fmt.Errorf("%w: %q: %d bytes at %d, want %d", coldfmt.ErrCorrupt, key, len(data), off, n)
		}
		if err := check(data); err != nil {
			return nil, fmt.Errorf("object %q: %w", key, err)
		}
		return data, nil
	})
}

// shortObject reports a range its committed reference places inside an
// object that the store says lies past its end as a corrupt (truncated)
// object.
func shortObject(key string, err error) error {
	if errors.Is(err, objstore.ErrInvalidRange) {
		return fmt.Errorf("%w: %q is shorter than its reference says: %v", coldfmt.ErrCorrupt, key, err)
	}
	return err
}

// get returns a cached entry or fills it with fill (once, whoever asks
// meanwhile); a failed fill is not cached.
func (c *Cache) get(ctx context.Context, id blockID, fill func(context.Context) ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if el, ok := c.blocks[id]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		c.hits.Add(1)
		return el.Value.(*block).data, nil
	}
	f, waiting := c.inflight[id]
	if !waiting {
		f = &fetch{done: make(chan struct{})}
		c.inflight[id] = f
	}
	c.mu.Unlock()
	if waiting {
		select {
		case <-f.done:
			return f.data, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.misses.Add(1)
	// The fetch outlives a cancelled reader that others may be waiting on.
	f.data, f.err = fill(context.WithoutCancel(ctx))
	c.mu.Lock()
	delete(c.inflight, id)
	if f.err == nil {
		c.add(id, f.data)
	} else {
		c.fetchErrors.Add(1)
		if errors.Is(f.err, coldfmt.ErrCorrupt) {
			c.checksumFailures.Add(1)
		}
		f.data = nil
	}
	c.mu.Unlock()
	close(f.done)
	return f.data, f.err
}

// add inserts a block and evicts the least recently used beyond capacity.
func (c *Cache) add(id blockID, data []byte) {
	c.blocks[id] = c.lru.PushFront(&block{id: id, data: data})
	c.size += int64(len(data))
	for c.size > c.capacity && c.lru.Len() > 1 {
		el := c.lru.Back()
		b := el.Value.(*block)
		c.lru.Remove(el)
		delete(c.blocks, b.id)
		c.size -= int64(len(b.data))
	}
}

// Forget drops an object's blocks (after it was deleted).
func (c *Cache) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		if b := el.Value.(*block); b.id.key == key {
			c.lru.Remove(el)
			delete(c.blocks, b.id)
			c.size -= int64(len(b.data))
		}
		el = next
	}
}
