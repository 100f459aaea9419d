package tier

import (
	"bytes"
	"context"
	"testing"

	"github.com/ursula/ursula/storage/objstore"
)

// anyBytes is a Verifier that accepts every range as it is.
type anyBytes struct{}

func (anyBytes) Span(lo, hi int64) (int64, int64) { return lo, hi }
func (anyBytes) Check(int64, []byte) error        { return nil }

// A read across blocks returns exactly its bytes, in a buffer of its own:
// writing into it changes neither the cache's blocks nor later reads.
func TestCacheReadAtAcrossBlocks(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	obj := make([]byte, 100)
	for i := range obj {
		obj[i] = byte(i)
	}
	if err := s.Put(ctx, "k", obj); err != nil {
		t.Fatal(err)
	}
	c := NewCache(s, 4, 1<<10)
	for _, r := range []struct{ off, n int64 }{
		{0, 100}, // 25 blocks: more parts than ReadAt keeps on its stack
		{1, 2},   // inside one block
		{3, 2},   // across two
		{5, 30},  // partial first and last blocks
		{96, 4},  // the last block
	} {
		got, err := c.ReadAt(ctx, "k", int64(len(obj)), r.off, r.n, anyBytes{})
		if err != nil {
			t.Fatalf("[%d, %d): %v", r.off, r.off+r.n, err)
		}
		if want := obj[r.off : r.off+r.n]; !bytes.Equal(got, want) {
			t.Fatalf("[%d, %d): %v, want %v", r.off, r.off+r.n, got, want)
		}
	}
	got, _ := c.ReadAt(ctx, "k", int64(len(obj)), 2, 10, anyBytes{})
	for i := range got {
		got[i] = 0xff
	}
	again, _ := c.ReadAt(ctx, "k", int64(len(obj)), 0, 16, anyBytes{})
	if !bytes.Equal(again, obj[:16]) {
		t.Fatalf("a read written into changed the cache: %v", again)
	}
	if _, err := c.ReadAt(ctx, "k", int64(len(obj)), 90, 20, anyBytes{}); err == nil {
		t.Fatal("a read past the object's end succeeded")
	}
}
