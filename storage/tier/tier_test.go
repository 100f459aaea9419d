package tier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// putChunk stores a chunk of appends starting at start and returns its ref.
func putChunk(t *testing.T, s objstore.Store, key string, start uint64, appends ...string) *storagev1.ColdRef {
	t.Helper()
	var segs [][]byte
	var recs []uint64
	pos := start
	for _, a := range appends {
		segs = append(segs, []byte(a))
		pos += uint64(len(a))
		recs = append(recs, pos)
	}
	body, crc := coldfmt.EncodeChunk(start, segs, recs)
	if err := s.Put(context.Background(), key, body); err != nil {
		t.Fatal(err)
	}
	return &storagev1.ColdRef{Start: start, End: pos, Key: key, Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: uint64(len(body)), Records: uint32(len(recs)), Crc32C: crc}
}

func TestReaderCutsOnBoundaries(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 4, 64)) // tiny blocks: reads span many
	bin := putChunk(t, s, "b/c/1", 10, "aaaa", "bbbbbb", "cc")
	data, end, err := r.Read(ctx, bin, 10, 22, 7, Unit{})
	if err != nil || string(data) != "aaaa" || end != 14 {
		t.Fatalf("limit 7 from 10: %q end %d err %v (want the first append)", data, end, err)
	}
	data, end, _ = r.Read(ctx, bin, 14, 22, 3, Unit{})
	if string(data) != "bbb" || end != 17 {
		t.Fatalf("an append larger than the limit is cut at the limit: %q %d", data, end)
	}
	data, end, _ = r.Read(ctx, bin, 12, 100, 100, Unit{})
	if string(data) != "aabbbbbbcc" || end != 22 {
		t.Fatalf("read to the chunk end: %q %d", data, end)
	}
	js := putChunk(t, s, "b/c/2", 0, "{\"a\":1}\n{\"b\":2}\n", "{\"c\":3}\n")
	data, end, _ = r.Read(ctx, js, 0, 24, 10, Unit{JSON: true})
	if string(data) != "{\"a\":1}\n" || end != 8 {
		t.Fatalf("JSON cut: %q %d", data, end)
	}
	data, _, _ = r.Read(ctx, js, 0, 24, 3, Unit{JSON: true})
	if string(data) != "{\"a\":1}\n" {
		t.Fatalf("JSON message larger than the limit is returned whole: %q", data)
	}
	txt := putChunk(t, s, "b/c/3", 0, "é✓é")
	data, end, _ = r.Read(ctx, txt, 0, 7, 4, Unit{Text: true})
	if string(data) != "é" || end != 2 {
		t.Fatalf("text cut inside a rune: %q %d", data, end)
	}
	data, end, _ = r.Read(ctx, txt, 2, 7, 1, Unit{Text: true})
	if string(data) != "✓" || end != 5 {
		t.Fatalf("limit inside the first rune returns it whole: %q %d", data, end)
	}
}

func TestReaderDescendsPages(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 1024, 1<<20))
	var leaves []*storagev1.ColdRef
	var want strings.Builder
	for i := range 5 {
		a := strings.Repeat(string(rune('a'+i)), 3)
		leaves = append(leaves, putChunk(t, s, "b/c/"+a, uint64(3*i), a))
		want.WriteString(a)
	}
	body, digest := coldfmt.EncodePage(leaves)
	if err := s.Put(ctx, "b/p/1", body); err != nil {
		t.Fatal(err)
	}
	page := &storagev1.ColdRef{Start: 0, End: 15, Key: "b/p/1", Kind: storagev1.ColdKind_COLD_KIND_PAGE, Size: uint64(len(body)), Level: 1, Crc32C: digest}
	var got strings.Builder
	for pos := uint64(0); pos < 15; {
		leaf, err := r.Leaf(ctx, page, pos)
		if err != nil {
			t.Fatal(err)
		}
		data, end, err := r.Read(ctx, leaf, pos, 15, 100, Unit{})
		if err != nil {
			t.Fatal(err)
		}
		got.Write(data)
		pos = end
	}
	if got.String() != want.String() {
		t.Fatalf("through the page: %q", got.String())
	}
	if _, err := r.Leaf(ctx, page, 99); err == nil {
		t.Fatal("a position outside the page resolved")
	}
}

func TestCheckFormatEpoch(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	if err := CheckFormatEpoch(ctx, s); err != nil {
		t.Fatalf("empty root: %v", err)
	}
	if err := CheckFormatEpoch(ctx, s); err != nil {
		t.Fatalf("root with our marker: %v", err)
	}
	foreign := objstore.NewMemory()
	_ = foreign.Put(ctx, "someone/else.txt", []byte("x"))
	if err := CheckFormatEpoch(ctx, foreign); err == nil || !strings.Contains(err.Error(), "no URSULA_FORMAT_EPOCH") {
		t.Fatalf("foreign root: %v", err)
	}
	other := objstore.NewMemory()
	epoch1 := objstore.NewMemory() // chunks without checksums
	_ = epoch1.Put(ctx, coldfmt.FormatEpochKey, []byte("1\n"))
	if err := CheckFormatEpoch(ctx, epoch1); err == nil {
		t.Fatal("a root of format epoch 1 was accepted")
	}
	_ = other.Put(ctx, coldfmt.FormatEpochKey, []byte("7\n"))
	if err := CheckFormatEpoch(ctx, other); err == nil {
		t.Fatal("another format epoch was accepted")
	}
}

// TestCheckFormatEpochConcurrent: nodes of a cluster start together on an
// empty shared root; each must accept the marker another one wrote.
func TestCheckFormatEpochConcurrent(t *testing.T) {
	for range 20 {
		s := objstore.NewMemory()
		errs := make(chan error, 5)
		for range 5 {
			go func() { errs <- CheckFormatEpoch(context.Background(), s) }()
		}
		for range 5 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRecordIndex: record lookups in a JSON leaf larger than several
// index steps answer as a count from the leaf's start would, with the
// index built once and kept.
func TestRecordIndex(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 4096, 64<<20))
	var appends []string
	starts := []uint64{1000} // starts[k] is where the leaf's k-th message starts
	pos := uint64(1000)
	for i := range 300 {
		var a strings.Builder
		for j := range 1 + i%7 {
			m := fmt.Sprintf(`{"i":%d,"j":%d,"pad":"%s"}`, i, j, strings.Repeat("x", (i*31+j*17)%400)) + "\n"
			a.WriteString(m)
			pos += uint64(len(m))
			starts = append(starts, pos)
		}
		appends = append(appends, a.String())
	}
	leaf := putChunk(t, s, "b/c/json", 1000, appends...)
	if leaf.GetEnd()-leaf.GetStart() < 3*recordStep {
		t.Fatalf("leaf of %d bytes spans too few index steps", leaf.GetEnd()-leaf.GetStart())
	}
	const first = 50
	leaf.FirstRecord, leaf.NextRecord = first, first+uint64(len(starts)-1)
	for k, p := range starts {
		got, err := r.RecordAt(ctx, leaf, p)
		if err != nil || got != first+uint64(k) {
			t.Fatalf("RecordAt(%d) = %d %v, want %d", p, got, err, first+k)
		}
		if k == len(starts)-1 {
			break // the leaf's end: the next leaf's first record
		}
		at, err := r.RecordPos(ctx, leaf, first+uint64(k))
		if err != nil || at != p {
			t.Fatalf("RecordPos(%d) = %d %v, want %d", first+k, at, err, p)
		}
	}
	if before := r.records.get(leaf.GetKey()); len(before) != int((leaf.GetEnd()-leaf.GetStart()+recordStep-1)/recordStep) || before[0] != 0 {
		t.Fatalf("index %v", before)
	}
	// An index entry claiming other records than the leaf holds is
	// corrupt.
	bad := putChunk(t, s, "b/c/bad", 0, "1\n2\n")
	bad.FirstRecord, bad.NextRecord = 0, 3
	if _, err := r.RecordAt(ctx, bad, 2); !errors.Is(err, coldfmt.ErrCorrupt) {
		t.Fatalf("a leaf with fewer records than its entry: %v", err)
	}
}
