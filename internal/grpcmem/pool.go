package grpcmem

import (
	"sync"

	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// tiers are the capacities the pool keeps, smallest first: grpc-go's
// (256 B for small messages, 4 KiB, 16 KiB HTTP/2 frames, 32 KiB, 1 MiB)
// and two between the last two, so that a read response of a few hundred
// KiB does not hold a megabyte.
var tiers = [...]int{256, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20}

// Pool is a mem.BufferPool that does not zero the buffers it hands out
// (see the package documentation). Buffers larger than the largest tier
// are allocated and left to the collector.
type Pool struct {
	pools [len(tiers)]sync.Pool
}

var _ mem.BufferPool = (*Pool)(nil)

// installed is the pool Install installs.
var installed = new(Pool)

var installOnce sync.Once

// Install makes the package's Pool grpc-go's default buffer pool, the one servers,
// clients and the proto codec use unless told otherwise. It must run
// before the process creates any gRPC server or connection (grpc-go reads
// the default without a lock); later calls do nothing.
func Install() {
	installOnce.Do(func() { experimental.SetDefaultBufferPool(installed) })
}

// tier returns the index of the smallest tier of at least n bytes, or -1.
func tier(n int) int {
	for i, size := range tiers {
		if n <= size {
			return i
		}
	}
	return -1
}

// Get returns a buffer of length n whose bytes are whatever an earlier
// user left in it.
func (p *Pool) Get(n int) *[]byte {
	i := tier(n)
	if i < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.pools[i].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, tiers[i])
	return &b
}

// Put returns a buffer that Get handed out (or a prefix of it); one of
// another capacity is left to the collector.
func (p *Pool) Put(b *[]byte) {
	c := cap(*b)
	if i := tier(c); i >= 0 && tiers[i] == c {
		p.pools[i].Put(b)
	}
}
