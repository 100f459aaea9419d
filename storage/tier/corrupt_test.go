package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// countingStore records the ranges read from it.
type countingStore struct {
	objstore.Store
	mu     sync.Mutex
	ranges []string
	bytes  int64
}

func (s *countingStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	s.mu.Lock()
	s.ranges = append(s.ranges, fmt.Sprintf("%s[%d,%d)", key, off, off+n))
	s.bytes += n
	s.mu.Unlock()
	return s.Store.GetRange(ctx, key, off, n)
}

func (s *countingStore) reset() (int64, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, r := s.bytes, s.ranges
	s.bytes, s.ranges = 0, nil
	return n, r
}

// damage flips one bit of an object in the store.
func damage(t *testing.T, s objstore.Store, key string, off int) {
	t.Helper()
	b, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Clone(b)
	if off < 0 {
		off += len(b)
	}
	b[off] ^= 0x10
	if err := s.Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

// bigChunk stores a chunk of four full checksum blocks and a bit and
// returns its reference and data.
func bigChunk(t *testing.T, s objstore.Store, key string) (*storagev1.ColdRef, []byte) {
	t.Helper()
	data := make([]byte, 4*coldfmt.ChecksumBlockBytes+300)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	ref := putChunk(t, s, key, 1000, string(data[:coldfmt.ChecksumBlockBytes+7]), string(data[coldfmt.ChecksumBlockBytes+7:]))
	return ref, data
}

// TestRangedReadVerifiesWhatItFetches: a ranged read of a chunk fetches
// its footer and the checksum blocks it needs, verifies them, and serves
// them; a block damaged elsewhere in the chunk does not stop it.
func TestRangedReadVerifiesWhatItFetches(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: objstore.NewMemory()}
	r := NewReader(NewCache(s, 2*coldfmt.ChecksumBlockBytes, 64<<20))
	ref, data := bigChunk(t, s, "b/c/big")
	damage(t, s, "b/c/big", 3*coldfmt.ChecksumBlockBytes+11) // in block 3
	s.reset()
	got, end, err := r.Read(ctx, ref, 1000+10, 1000+20, 10, Unit{})
	if err != nil || !bytes.Equal(got, data[10:20]) || end != 1000+20 {
		t.Fatalf("read [10, 20): %q %d %v", got, end, err)
	}
	n, ranges := s.reset()
	footer := int64(ref.GetSize()) - int64(len(data))
	if want := footer + 2*coldfmt.ChecksumBlockBytes; n != want {
		t.Fatalf("fetched %d bytes (%v), want the footer and one cache block: %d", n, ranges, want)
	}
	// The damaged block is refused, whichever read reaches it.
	_, _, err = r.Read(ctx, ref, 1000+3*coldfmt.ChecksumBlockBytes, ref.GetEnd(), 100, Unit{})
	if !errors.Is(err, coldfmt.ErrCorrupt) {
		t.Fatalf("read of the damaged block: %v, want ErrCorrupt", err)
	}
	if st := r.Cache().Stats(); st.ChecksumFailures != 1 {
		t.Fatalf("checksum failures %d, want 1", st.ChecksumFailures)
	}
}

// TestCorruptObjectsAreNeverServed: whatever is damaged (a data byte in
// any block, the footer, a page, the object's length, or another object
// put at the key), every kind of read refuses with ErrCorrupt and returns
// no bytes, the failure is counted, nothing bad is cached (a repaired
// object reads fine at once), and other objects still read.
func TestCorruptObjectsAreNeverServed(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		damage func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int)
	}{
		{"first data byte", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) { damage(t, s, ref.GetKey(), 0) }},
		{"last data byte", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) { damage(t, s, ref.GetKey(), n-1) }},
		{"a block crc", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) { damage(t, s, ref.GetKey(), n+1) }},
		{"a record end", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) { damage(t, s, ref.GetKey(), -30) }},
		{"the footer crc", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) { damage(t, s, ref.GetKey(), -6) }},
		{"truncated", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) {
			b, _ := s.Get(ctx, ref.GetKey())
			_ = s.Put(ctx, ref.GetKey(), b[:n/2])
		}},
		{"another chunk at the key", func(t *testing.T, s objstore.Store, ref *storagev1.ColdRef, n int) {
			body, _ := coldfmt.EncodeChunk(ref.GetStart(), [][]byte{bytes.Repeat([]byte("z"), n)}, []uint64{ref.GetEnd()})
			_ = s.Put(ctx, ref.GetKey(), body)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := objstore.NewMemory()
			r := NewReader(NewCache(s, 4096, 64<<20))
			ref := putChunk(t, s, "b/c/1", 0, "{\"a\":1}\n", "{\"b\":2}\n{\"c\":3}\n")
			ref.FirstRecord, ref.NextRecord = 0, 3
			good, _ := s.Get(ctx, ref.GetKey())
			other := putChunk(t, s, "b/c/2", 24, "untouched")
			n := int(ref.GetEnd() - ref.GetStart())
			tt.damage(t, s, ref, n)
			reads := map[string]func() ([]byte, error){
				"Read": func() ([]byte, error) {
					b, _, err := r.Read(ctx, ref, 0, 24, 100, Unit{JSON: true})
					return b, err
				},
				"Boundary": func() ([]byte, error) { _, err := r.Boundary(ctx, ref, 3, true); return nil, err },
				"UnitEnd":  func() ([]byte, error) { _, _, err := r.UnitEnd(ctx, ref, 8, 1, 24, true); return nil, err },
				"RecordPos": func() ([]byte, error) {
					_, err := r.RecordPos(ctx, ref, 2)
					return nil, err
				},
				"RecordAt": func() ([]byte, error) { _, err := r.RecordAt(ctx, ref, 16); return nil, err },
			}
			for name, read := range reads {
				b, err := read()
				if !errors.Is(err, coldfmt.ErrCorrupt) || b != nil {
					t.Fatalf("%s: %q, %v; want no bytes and ErrCorrupt", name, b, err)
				}
			}
			if st := r.Cache().Stats(); st.ChecksumFailures == 0 {
				t.Fatal("no checksum failure counted")
			}
			if b, _, err := r.Read(ctx, other, 24, 33, 100, Unit{}); err != nil || string(b) != "untouched" {
				t.Fatalf("another object: %q, %v", b, err)
			}
			// Nothing damaged was cached: the repaired object reads back.
			if err := s.Put(ctx, ref.GetKey(), good); err != nil {
				t.Fatal(err)
			}
			if b, _, err := r.Read(ctx, ref, 0, 24, 100, Unit{JSON: true}); err != nil || string(b) != "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n" {
				t.Fatalf("after the repair: %q, %v", b, err)
			}
		})
	}
}

// TestCorruptPageRefused: a page whose body does not match its
// reference's checksum is not descended (its entries name the objects
// reads fetch).
func TestCorruptPageRefused(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 1024, 1<<20))
	leaf := putChunk(t, s, "b/c/a", 0, "aaa")
	body, digest := coldfmt.EncodePage([]*storagev1.ColdRef{leaf})
	_ = s.Put(ctx, "b/p/1", body)
	page := &storagev1.ColdRef{Start: 0, End: 3, Key: "b/p/1", Kind: storagev1.ColdKind_COLD_KIND_PAGE, Size: uint64(len(body)), Level: 1, Crc32C: digest}
	damage(t, s, "b/p/1", len(body)/2)
	if _, err := r.Leaf(ctx, page, 1); !errors.Is(err, coldfmt.ErrCorrupt) {
		t.Fatalf("Leaf through a damaged page: %v", err)
	}
	if _, err := r.Page(ctx, page); !errors.Is(err, coldfmt.ErrCorrupt) {
		t.Fatalf("Page: %v", err)
	}
}

// TestCorruptFillSharedByWaiters: readers waiting on one fill of a damaged
// block all get the error and none gets bytes.
func TestCorruptFillSharedByWaiters(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 4096, 1<<20))
	ref, _ := bigChunk(t, s, "b/c/big")
	damage(t, s, "b/c/big", 100)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			b, _, err := r.Read(ctx, ref, 1000, 1100, 100, Unit{})
			if b != nil {
				err = fmt.Errorf("served %d bytes", len(b))
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, coldfmt.ErrCorrupt) {
			t.Fatalf("a reader got %v", err)
		}
	}
}
