package grpcmem

import (
	"testing"

	"google.golang.org/grpc/mem"
)

func TestGetSizesAndReuse(t *testing.T) {
	var p Pool
	for _, n := range []int{0, 1, 256, 257, 4096, 200 << 10, 1 << 20} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d): len %d", n, len(*b))
		}
		want := tiers[tier(n)]
		if cap(*b) != want {
			t.Fatalf("Get(%d): cap %d, want the tier of %d", n, cap(*b), want)
		}
		p.Put(b)
	}
	big := p.Get(2 << 20)
	if len(*big) != 2<<20 {
		t.Fatalf("Get beyond the largest tier: len %d", len(*big))
	}
	p.Put(big) // not kept: no tier of its capacity

	// A buffer that went back comes out again with what it held: the pool
	// does not clear. sync.Pool may drop a buffer (it does at random under
	// the race detector), so a reuse is looked for over many tries.
	for range 100 {
		b := p.Get(100)
		copy(*b, "kept")
		p.Put(b)
		c := p.Get(50)
		if &(*c)[:1][0] == &(*b)[:1][0] {
			if string((*c)[:4]) != "kept" {
				t.Fatalf("reused buffer holds %q, want its old bytes", (*c)[:4])
			}
			return
		}
		p.Put(c)
	}
	t.Fatal("a buffer put back never came out again in 100 tries")
}

func TestPutOfAForeignCapacityIsDropped(t *testing.T) {
	var p Pool
	odd := make([]byte, 10, 300)
	p.Put(&odd)
	got := p.Get(10)
	if cap(*got) == 300 {
		t.Fatal("a buffer of no tier's capacity was pooled")
	}
}

func TestInstall(t *testing.T) {
	Install()
	Install()
	if mem.DefaultBufferPool() != mem.BufferPool(installed) {
		t.Fatalf("default pool %T, want the package's pool", mem.DefaultBufferPool())
	}
}
