package tier

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"

	"github.com/ursula/ursula/storage/objstore"
)

// Cache reads objects in fixed-size blocks through an LRU bounded by
// bytes. Objects are immutable, so a cached block never goes stale; a
// block being fetched is fetched once however many readers want it.
type Cache struct {
	store     objstore.Store
	blockSize int64
	capacity  int64

	mu       sync.Mutex
	lru      *list.List // of *block, most recent first
	blocks   map[blockID]*list.Element
	inflight map[blockID]*fetch
	size     int64

	hits, misses, fetchErrors atomic.Uint64
}

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
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	size := c.size
	c.mu.Unlock()
	return CacheStats{Bytes: size, Hits: c.hits.Load(), Misses: c.misses.Load(), FetchErrors: c.fetchErrors.Load()}
}

// ReadAt returns n bytes at off of an object of objSize bytes. The result
// may share memory with the cache and must not be modified.
func (c *Cache) ReadAt(ctx context.Context, key string, objSize, off, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	first, last := off/c.blockSize, (off+n-1)/c.blockSize
	if first == last {
		b, err := c.block(ctx, key, objSize, first)
		if err != nil {
			return nil, err
		}
		lo := off - first*c.blockSize
		return b[lo:min(lo+n, int64(len(b)))], nil
	}
	out := make([]byte, 0, n)
	for i := first; i <= last; i++ {
		b, err := c.block(ctx, key, objSize, i)
		if err != nil {
			return nil, err
		}
		lo := max(off-i*c.blockSize, 0)
		hi := min(off+n-i*c.blockSize, int64(len(b)))
		out = append(out, b[lo:hi]...)
	}
	return out, nil
}

func (c *Cache) block(ctx context.Context, key string, objSize, index int64) ([]byte, error) {
	id := blockID{key, index}
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
	off := index * c.blockSize
	// The fetch outlives a cancelled reader that others may be waiting on.
	f.data, f.err = c.store.GetRange(context.WithoutCancel(ctx), key, off, min(c.blockSize, objSize-off))
	c.mu.Lock()
	delete(c.inflight, id)
	if f.err == nil {
		c.add(id, f.data)
	} else {
		c.fetchErrors.Add(1)
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
