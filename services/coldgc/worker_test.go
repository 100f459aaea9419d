package coldgc

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// fakeNode is the node side of the ColdGCService for one group.
type fakeNode struct {
	coldgcv1.ColdGCServiceClient // other methods are not called
	mu                           sync.Mutex
	queue                        []*storagev1.GCEntry
	acked                        []uint64
	compactions                  []*coldgcv1.Compaction
	swaps                        []*storagev1.ColdSwap
}

func (n *fakeNode) GetGCQueue(context.Context, *coldgcv1.GetGCQueueRequest, ...grpc.CallOption) (*coldgcv1.GetGCQueueResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &coldgcv1.GetGCQueueResponse{Entries: n.queue, Total: uint64(len(n.queue)), GroupCount: 1}, nil
}

func (n *fakeNode) AckGC(_ context.Context, in *coldgcv1.AckGCRequest, _ ...grpc.CallOption) (*coldgcv1.AckGCResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.acked = append(n.acked, in.GetSeqs()...)
	return &coldgcv1.AckGCResponse{}, nil
}

func (n *fakeNode) ListCompactions(context.Context, *coldgcv1.ListCompactionsRequest, ...grpc.CallOption) (*coldgcv1.ListCompactionsResponse, error) {
	return &coldgcv1.ListCompactionsResponse{Compactions: n.compactions}, nil
}

func (n *fakeNode) CommitCompaction(_ context.Context, in *coldgcv1.CommitCompactionRequest, _ ...grpc.CallOption) (*coldgcv1.CommitCompactionResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.swaps = append(n.swaps, in.GetSwap())
	return &coldgcv1.CommitCompactionResponse{}, nil
}

func newWorker(t *testing.T, node *fakeNode, store objstore.Store) *Worker {
	t.Helper()
	w, err := New(Config{Interval: time.Second, CompactInterval: time.Second, SmallChunkBytes: 1 << 10, MaxChunkBytes: 1 << 20}, node, store, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func putChunk(t *testing.T, s objstore.Store, key string, start uint64, data string) *storagev1.ColdRef {
	t.Helper()
	end := start + uint64(len(data))
	body, crc := coldfmt.EncodeChunk(start, [][]byte{[]byte(data)}, []uint64{end})
	if err := s.Put(t.Context(), key, body); err != nil {
		t.Fatal(err)
	}
	return &storagev1.ColdRef{Start: start, End: end, Key: key, Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: uint64(len(body)), Records: 1, Crc32C: crc}
}

func flip(t *testing.T, s objstore.Store, key string, off int) {
	t.Helper()
	b, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Clone(b)
	b[off] ^= 0x01
	if err := s.Put(t.Context(), key, b); err != nil {
		t.Fatal(err)
	}
}

func exists(t *testing.T, s objstore.Store, key string) bool {
	t.Helper()
	_, err := s.Head(t.Context(), key)
	return err == nil
}

// TestReclaimCorruptPage: a page in the GC queue whose body does not match
// its checksum is not trusted to name objects: the worker deletes the page
// alone (what it indexed is left to the orphan sweep), counts it and
// acknowledges the entry; an intact page is reclaimed with everything it
// indexes.
func TestReclaimCorruptPage(t *testing.T) {
	store := objstore.NewMemory()
	a := putChunk(t, store, "b/p1/1/c/a", 0, "aaaa")
	b := putChunk(t, store, "b/p1/1/c/b", 4, "bbbb")
	page1, crc1 := coldfmt.EncodePage([]*storagev1.ColdRef{a, b})
	c := putChunk(t, store, "b/p1/1/c/c", 8, "cccc")
	page2, crc2 := coldfmt.EncodePage([]*storagev1.ColdRef{c})
	for k, body := range map[string][]byte{"b/p1/1/p/1/good": page1, "b/p1/1/p/1/bad": page2} {
		if err := store.Put(t.Context(), k, body); err != nil {
			t.Fatal(err)
		}
	}
	flip(t, store, "b/p1/1/p/1/bad", len(page2)/2)
	node := &fakeNode{queue: []*storagev1.GCEntry{
		{Seq: 1, Bucket: "b", Kind: storagev1.GCKind_GC_KIND_PAGE, Key: "b/p1/1/p/1/good", Crc32C: crc1},
		{Seq: 2, Bucket: "b", Kind: storagev1.GCKind_GC_KIND_PAGE, Key: "b/p1/1/p/1/bad", Crc32C: crc2},
	}}
	w := newWorker(t, node, store)
	if n, err := w.Reclaim(t.Context(), ""); err != nil || n != 2 {
		t.Fatalf("Reclaim = %d, %v", n, err)
	}
	for key, want := range map[string]bool{
		"b/p1/1/p/1/good": false, "b/p1/1/c/a": false, "b/p1/1/c/b": false,
		"b/p1/1/p/1/bad": false, "b/p1/1/c/c": true, // left to the orphan sweep
	} {
		if got := exists(t, store, key); got != want {
			t.Errorf("%s exists: %v, want %v", key, got, want)
		}
	}
	if got := w.Stats().CorruptObjects.Load(); got != 1 {
		t.Fatalf("corrupt objects %d, want 1", got)
	}
}

// TestCompactRefusesCorruptChunk: a compaction never merges a chunk that
// fails its checksum (the merged chunk would carry the damaged bytes under
// a fresh, valid checksum): nothing is uploaded or committed.
func TestCompactRefusesCorruptChunk(t *testing.T) {
	store := objstore.NewMemory()
	a := putChunk(t, store, "b/h/1/c/a", 0, "aaaa")
	b := putChunk(t, store, "b/h/1/c/b", 4, "bbbb")
	flip(t, store, "b/h/1/c/b", 2)
	node := &fakeNode{compactions: []*coldgcv1.Compaction{{Bucket: "b", Stream: "s", Incarnation: 1, Run: []*storagev1.ColdRef{a, b}}}}
	w := newWorker(t, node, store)
	if err := w.Compact(t.Context()); err == nil {
		t.Fatal("a compaction over a damaged chunk succeeded")
	}
	if len(node.swaps) != 0 {
		t.Fatalf("committed %v", node.swaps)
	}
	var keys []string
	_ = store.List(t.Context(), "b/h/1/", func(in objstore.Info) error { keys = append(keys, in.Key); return nil })
	if len(keys) != 2 {
		t.Fatalf("objects after the refused compaction: %v", keys)
	}
	if got := w.Stats().CorruptObjects.Load(); got != 1 {
		t.Fatalf("corrupt objects %d, want 1", got)
	}
	// Intact chunks compact into one verified chunk.
	store2 := objstore.NewMemory()
	a, b = putChunk(t, store2, "b/h/1/c/a", 0, "aaaa"), putChunk(t, store2, "b/h/1/c/b", 4, "bbbb")
	node = &fakeNode{compactions: []*coldgcv1.Compaction{{Bucket: "b", Stream: "s", Incarnation: 1, Run: []*storagev1.ColdRef{a, b}}}}
	if err := newWorker(t, node, store2).Compact(t.Context()); err != nil || len(node.swaps) != 1 {
		t.Fatalf("compaction: %v, %v", err, node.swaps)
	}
	ch := node.swaps[0].GetChunk()
	body, err := store2.Get(t.Context(), ch.GetKey())
	if err != nil {
		t.Fatal(err)
	}
	data, recs, err := coldfmt.DecodeChunk(0, 8, body, ch.GetCrc32C())
	if err != nil || string(data) != "aaaabbbb" || len(recs) != 2 {
		t.Fatalf("compacted chunk: %q %v %v", data, recs, err)
	}
}

// heldNode answers as a node whose cold GC a backup holds: the queue is
// not handed out, and the sweep's calls answer COLD_GC_HELD (refsHeld:
// only the reference lookups, as when a hold begins during a sweep).
type heldNode struct {
	fakeNode
	refsHeld bool
}

var errHeld = grpcerr.ToStatus(errcode.New(errcode.ColdGCHeld, "cold GC held by a backup"))

func (n *heldNode) GetGCQueue(context.Context, *coldgcv1.GetGCQueueRequest, ...grpc.CallOption) (*coldgcv1.GetGCQueueResponse, error) {
	return &coldgcv1.GetGCQueueResponse{Total: uint64(len(n.queue)), GroupCount: 1, Held: true}, nil
}

func (n *heldNode) ListLivePrefixes(context.Context, *coldgcv1.ListLivePrefixesRequest, ...grpc.CallOption) (*coldgcv1.ListLivePrefixesResponse, error) {
	if n.refsHeld {
		return &coldgcv1.ListLivePrefixesResponse{Prefixes: []string{coldfmt.StreamPrefix("b", "s", 1)}}, nil
	}
	return nil, errHeld
}

func (n *heldNode) GetColdReferences(context.Context, *coldgcv1.GetColdReferencesRequest, ...grpc.CallOption) (*coldgcv1.GetColdReferencesResponse, error) {
	return nil, errHeld
}

// TestHeldColdGCIsAQuietSkip: while a backup holds the cold GC, a pass
// and a sweep delete nothing, report no error and count the skip.
func TestHeldColdGCIsAQuietSkip(t *testing.T) {
	store := objstore.NewMemory()
	queued := coldfmt.StreamPrefix("b", "gone", 1) + "c/x"
	live := coldfmt.StreamPrefix("b", "s", 1) + "c/y"
	orphan := "b/" + strings.Repeat("0", 32) + "/9/c/z"
	for _, k := range []string{queued, live, orphan} {
		if err := store.Put(t.Context(), k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, refsHeld := range []bool{false, true} {
		node := &heldNode{fakeNode: fakeNode{queue: []*storagev1.GCEntry{{Seq: 1, Bucket: "b", Kind: storagev1.GCKind_GC_KIND_OBJECT, Key: queued}}}, refsHeld: refsHeld}
		w, err := New(Config{Interval: time.Second, SweepInterval: time.Hour, OrphanAge: time.Hour}, node, store, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		w.now = func() time.Time { return time.Now().Add(48 * time.Hour) } // every object is old enough
		if n, err := w.Reclaim(t.Context(), ""); n != 0 || err != nil {
			t.Fatalf("Reclaim while held: %d, %v", n, err)
		}
		if n, err := w.Sweep(t.Context()); n != 0 || err != nil {
			t.Fatalf("Sweep while held (references only %v): %d, %v", refsHeld, n, err)
		}
		if got := w.Stats().HeldSkips.Load(); got != 2 {
			t.Fatalf("held skips %d, want 2", got)
		}
		if w.Stats().Errors.Load() != 0 || len(node.acked) != 0 {
			t.Fatal("a held pass counted an error or acknowledged an entry")
		}
		for _, k := range []string{queued, live, orphan} {
			if _, err := store.Get(t.Context(), k); err != nil {
				t.Fatalf("%s: %v (deleted while held)", k, err)
			}
		}
	}
}
