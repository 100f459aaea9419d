package stream

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

// flushAll flushes a stream's whole hot window as the leader would: one
// chunk per piece, external payloads indexed as they are, and a seal for
// every level that fills up (computed from a copy of the index).
func flushAll(t testing.TB, a *applier, name string, inc uint64) *Result {
	t.Helper()
	pieces, levels, ok := a.m.FlushPlan(Key{"b", name}, inc, 1<<30)
	if !ok {
		t.Fatalf("FlushPlan(%s): stream gone", name)
	}
	var chunks []*storagev1.ColdRef
	for i, p := range pieces {
		if p.External != nil {
			chunks = append(chunks, proto.CloneOf(p.External))
			continue
		}
		chunks = append(chunks, &storagev1.ColdRef{Start: p.Start, End: p.End, Key: fmt.Sprintf("%s/c/%d-%d", name, p.Start, i), Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: p.End - p.Start + 8,
			Records: uint32(len(p.Records)), FirstRecord: p.FirstRecord, NextRecord: p.NextRecord})
	}
	if len(levels) == 0 {
		levels = []*storagev1.ColdLevel{{}}
	}
	levels[0].Entries = append(levels[0].Entries, chunks...)
	var seals []*storagev1.ColdSeal
	for k := 0; k < len(levels); k++ {
		for len(levels[k].GetEntries()) >= coldfmt.PageFanout {
			run := levels[k].Entries[:coldfmt.PageFanout]
			body, digest := coldfmt.EncodePage(run)
			key := fmt.Sprintf("%s/p/%d/%d", name, k+1, run[0].GetStart())
			seals = append(seals, &storagev1.ColdSeal{Level: uint32(k), Count: coldfmt.PageFanout, Key: key, Size: uint64(len(body)), Digest: digest})
			levels[k].Entries = levels[k].Entries[coldfmt.PageFanout:]
			if k+1 == len(levels) {
				levels = append(levels, &storagev1.ColdLevel{})
			}
			levels[k+1].Entries = append(levels[k+1].Entries, &storagev1.ColdRef{Start: run[0].GetStart(), End: run[len(run)-1].GetEnd(), Key: key, Kind: storagev1.ColdKind_COLD_KIND_PAGE, Size: uint64(len(body)), Records: coldfmt.PageFanout, Level: uint32(k + 1),
				FirstRecord: run[0].GetFirstRecord(), NextRecord: run[len(run)-1].GetNextRecord(), Crc32C: digest})
		}
	}
	return a.apply(1, &storagev1.ColdFlush{Bucket: "b", Stream: name, Incarnation: inc, Chunks: chunks, Seals: seals})
}

func TestColdFlushIndexesAndFreesHotBytes(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"}).Meta.Incarnation
	var want bytes.Buffer
	for i := range 200 {
		// One append per flush: 200 chunks seal three level-0 pages.
		body := fmt.Appendf(nil, "<%d>", i)
		want.Write(body)
		a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: body})
		if r := flushAll(t, a, "s", inc); r.Err != nil {
			t.Fatalf("flush %d: %v", i, r.Err)
		}
	}
	if a.m.HotBytes() != 0 {
		t.Fatalf("hot bytes after flushing everything: %d", a.m.HotBytes())
	}
	m, _ := a.m.Lookup(Key{"b", "s"})
	if m.ColdEnd != uint64(want.Len()) || m.Tail != m.ColdEnd {
		t.Fatalf("cold end %d tail %d, want %d", m.ColdEnd, m.Tail, want.Len())
	}
	levels, _ := a.m.ColdLevels(Key{"b", "s"}, inc)
	if len(levels) != 2 || len(levels[1].GetEntries()) != 3 || len(levels[0].GetEntries()) != 200-3*coldfmt.PageFanout {
		t.Fatalf("index shape: %d levels", len(levels))
	}
	// Every position resolves to the entry that covers it.
	for pos := uint64(0); pos < m.Tail; pos += 7 {
		_, _, ref, ok := a.m.ReadOwn(Key{"b", "s"}, inc, pos, m.Tail, 0, nil)
		if !ok || ref == nil || ref.GetStart() > pos || ref.GetEnd() <= pos {
			t.Fatalf("position %d resolves to %v", pos, ref)
		}
	}
	// The snapshot carries the index, not the bytes, and restores it.
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap) > 64<<10 {
		t.Fatalf("snapshot of a flushed stream is %d bytes", len(snap))
	}
	b := NewMachine(0)
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	again, _ := b.Snapshot()
	if !bytes.Equal(snap, again) {
		t.Fatal("restore then snapshot changed the encoding")
	}
}

func TestColdFlushRefusals(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "application/octet-stream"}).Meta.Incarnation
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", Body: []byte("0123456789")})
	chunk := func(start, end uint64) *storagev1.ColdRef {
		return &storagev1.ColdRef{Start: start, End: end, Key: fmt.Sprintf("k%d-%d", start, end), Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: end - start + 8}
	}
	state := func() *storagev1.Snapshot {
		raw, _ := a.m.Snapshot()
		var s storagev1.Snapshot
		if err := proto.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		s.AppliedIndex = 0
		return &s
	}
	before := state()
	for _, c := range []struct {
		name string
		cmd  *storagev1.ColdFlush
	}{
		{"gap", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk(2, 5)}}},
		{"past the tail", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk(0, 11)}}},
		{"empty", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc}},
		{"other incarnation", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc + 1, Chunks: []*storagev1.ColdRef{chunk(0, 10)}}},
		{"external not in the window", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{{Start: 0, End: 10, Key: "x", Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL}}}},
		{"seal over entries it does not match", &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk(0, 10)},
			Seals: []*storagev1.ColdSeal{{Level: 0, Count: 1, Key: "p", Size: 3, Digest: 42}}}},
	} {
		if r := a.apply(1, c.cmd); r.Err == nil {
			t.Errorf("%s: flush accepted", c.name)
		}
		if !proto.Equal(before, state()) {
			t.Fatalf("%s: a refused flush changed the state", c.name)
		}
	}
	if r := a.apply(1, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk(0, 10)}}); r.Err != nil {
		t.Fatalf("valid flush: %v", r.Err)
	}
	// The same flush again (a retried proposal) is refused: the cold range
	// moved on.
	if r := a.apply(1, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk(0, 10)}}); r.Err == nil {
		t.Fatal("repeated flush accepted")
	}
}

func TestColdExternalPayloadInHotWindow(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "application/octet-stream"}).Meta.Incarnation
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", Body: []byte("head")})
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", External: &storagev1.ColdRef{Key: "ext", Size: 1040, End: 1000}})
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", Body: []byte("tail")})
	if got := a.m.HotBytes(); got != 8 {
		t.Fatalf("hot bytes %d, want 8 (the external payload is not in memory)", got)
	}
	data, end, ref, _ := a.m.ReadOwn(Key{"b", "s"}, inc, 0, 2000, 0, nil)
	if string(data) != "head" || end != 4 || ref != nil {
		t.Fatalf("read before the payload: %q end %d ref %v", data, end, ref)
	}
	_, _, ref, _ = a.m.ReadOwn(Key{"b", "s"}, inc, 500, 2000, 0, nil)
	if ref.GetKey() != "ext" || ref.GetStart() != 4 || ref.GetEnd() != 1004 {
		t.Fatalf("read inside the payload resolves to %v", ref)
	}
	// Snapshot and restore keep the payload in the window.
	snap, _ := a.m.Snapshot()
	b := NewMachine(0)
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	data, _, _, _ = b.ReadOwn(Key{"b", "s"}, inc, 1004, 2000, 0, nil)
	if string(data) != "tail" {
		t.Fatalf("after restore, tail %q", data)
	}
	if r := flushAll(t, a, "s", inc); r.Err != nil {
		t.Fatal(r.Err)
	}
	levels, _ := a.m.ColdLevels(Key{"b", "s"}, inc)
	if n := len(levels[0].GetEntries()); n != 3 || levels[0].Entries[1].GetKey() != "ext" {
		t.Fatalf("index after the flush: %v", levels[0].GetEntries())
	}
}

func TestColdRetentionSwapGCAndPurge(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.CreateBucket{Bucket: "b"})
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "application/octet-stream"}).Meta.Incarnation
	for i := range 10 {
		a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", Body: fmt.Appendf(nil, "%04d", i)})
		flushAll(t, a, "s", inc)
	}
	levels, _ := a.m.ColdLevels(Key{"b", "s"}, inc)
	run := levels[0].Entries[2:5]
	swap := &storagev1.ColdSwap{Bucket: "b", Stream: "s", Incarnation: inc, Replaced: run, GraceMs: 100,
		Chunk: &storagev1.ColdRef{Start: run[0].GetStart(), End: run[2].GetEnd(), Key: "merged", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 20}}
	if r := a.apply(1000, swap); r.Err != nil {
		t.Fatalf("swap: %v", r.Err)
	}
	if r := a.apply(1000, swap); r.Err == nil {
		t.Fatal("the same swap twice was accepted")
	}
	q, n := a.m.GCQueue(100)
	if n != 3 || q[0].GetNotBeforeMs() != 1100 || q[0].GetKind() != storagev1.GCKind_GC_KIND_OBJECT {
		t.Fatalf("GC queue after a swap: %v", q)
	}
	if r := a.apply(1, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: inc, Position: 41}); code(r) != fault.ErrOffsetOutOfRange {
		t.Fatalf("retention past the tail: %v", r.Err)
	}
	a.apply(1, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: inc, Position: 13})
	a.apply(2000, &storagev1.ColdRetire{Bucket: "b", Stream: "s", Incarnation: inc, GraceMs: 5})
	levels, _ = a.m.ColdLevels(Key{"b", "s"}, inc)
	if first := levels[0].Entries[0]; first.GetStart() != 8 || first.GetKey() != "merged" {
		t.Fatalf("after retiring below 13 the index starts with %v", first)
	}
	q, n = a.m.GCQueue(100)
	if n != 5 {
		t.Fatalf("GC queue holds %d entries, want 5", n)
	}
	a.apply(1, &storagev1.GCAck{Seqs: []uint64{q[0].GetSeq(), q[1].GetSeq()}})
	if _, n = a.m.GCQueue(100); n != 3 {
		t.Fatalf("after acknowledging two: %d", n)
	}
	r := a.apply(3000, &storagev1.PurgeBucket{Bucket: "b"})
	if r.Removed != 1 || r.GCPending != 4 || r.GCReclaimed != 2 {
		t.Fatalf("purge: removed %d pending %d reclaimed %d", r.Removed, r.GCPending, r.GCReclaimed)
	}
	q, _ = a.m.GCQueue(100)
	last := q[len(q)-1]
	if last.GetKind() != storagev1.GCKind_GC_KIND_PREFIX || last.GetKey() != coldfmt.StreamPrefix("b", "s", inc) {
		t.Fatalf("purge queued %v", last)
	}
	if r := a.apply(1, &storagev1.CreateBucket{Bucket: "b"}); code(r) != fault.ErrBucketNotFound {
		t.Fatalf("create a purged bucket: %v", r.Err)
	}
	if r := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "t"}); code(r) != fault.ErrBucketNotFound {
		t.Fatalf("create a stream in a purged bucket: %v", r.Err)
	}
	// The fence and the queue survive a snapshot.
	snap, _ := a.m.Snapshot()
	b := NewMachine(0)
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if !b.Fenced("b") || b.GCPending("b") != 4 {
		t.Fatalf("after restore: fenced %v pending %d", b.Fenced("b"), b.GCPending("b"))
	}
	if again := a.apply(1, &storagev1.PurgeBucket{Bucket: "b"}); again.Removed != 0 || again.GCPending != 4 {
		t.Fatalf("second purge: removed %d pending %d", again.Removed, again.GCPending)
	}
}

// TestColdBytes checks the running sum behind Stats.ColdBytes against a
// walk over the streams after every step that moves a cold range, a
// retention or a stream's existence, and across a snapshot.
func TestColdBytes(t *testing.T) {
	a := newApplier(t)
	walk := func(m *Machine) int64 {
		m.mu.RLock()
		defer m.mu.RUnlock()
		var n int64
		for _, s := range m.streams {
			n += coldBytes(&s.meta)
		}
		return n
	}
	check := func(step string, want int64) {
		t.Helper()
		if got, walked := a.m.Stats().ColdBytes, walk(a.m); got != want || walked != want {
			t.Fatalf("%s: cold bytes %d (a walk finds %d), want %d", step, got, walked, want)
		}
	}
	a.apply(1, &storagev1.CreateBucket{Bucket: "b"})
	incs := map[string]uint64{}
	for _, name := range []string{"s", "t"} {
		incs[name] = a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: name, ContentType: "application/octet-stream"}).Meta.Incarnation
		for i := range 5 {
			a.apply(1, &storagev1.Append{Bucket: "b", Stream: name, ContentType: "application/octet-stream", Body: fmt.Appendf(nil, "%04d", i)})
		}
	}
	check("nothing flushed", 0)
	flushAll(t, a, "s", incs["s"])
	check("s flushed", 20)
	flushAll(t, a, "t", incs["t"])
	check("both flushed", 40)
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/octet-stream", Body: []byte("hot!")})
	check("a hot append", 40)
	a.apply(1, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: incs["s"], Position: 6})
	check("retention at 6 in s", 34)
	a.apply(1, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: incs["s"], Position: 22})
	check("retention in the hot window of s", 20)
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b := NewMachine(0)
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().ColdBytes; got != 20 {
		t.Fatalf("cold bytes after a restore: %d, want 20", got)
	}
	a.apply(1, &storagev1.DeleteStream{Bucket: "b", Stream: "t"})
	check("t deleted", 0)
}

// TestHotIndex: after every step of a varied history (appends, external
// payloads, flushes, retention, forks, deletes, purges, a history event)
// and after a restore, the hot index holds exactly the streams whose hot
// window holds positions, and HotStreams lists exactly those.
func TestHotIndex(t *testing.T) {
	check := func(what string, m *Machine) {
		t.Helper()
		want := map[Key]bool{}
		for k, s := range m.streams {
			if s.buf.Len() > 0 {
				want[k] = true
			}
		}
		got := map[Key]bool{}
		for s := range m.hot {
			k := Key{s.meta.GetBucket(), s.meta.GetStream()}
			if m.streams[k] != s || s.buf.Len() == 0 {
				t.Fatalf("after %s: stale hot index entry %v", what, k)
			}
			got[k] = true
		}
		if !maps.Equal(got, want) {
			t.Fatalf("after %s: hot index %v, want %v", what, got, want)
		}
		listed := map[Key]bool{}
		for _, h := range m.HotStreams(nil) {
			listed[h.Key] = true
		}
		if !maps.Equal(listed, want) {
			t.Fatalf("after %s: HotStreams lists %v, want %v", what, listed, want)
		}
	}
	a := variedGroup(t, func(what string, a *applier) { check(what, a.m) })
	if len(a.m.hot) == 0 {
		t.Fatal("no hot stream at the end: the test proves nothing")
	}
	// The flusher asks ten times a second per group, passing its last
	// list: asking again allocates nothing.
	buf := a.m.HotStreams(nil)
	if n := testing.AllocsPerRun(20, func() { buf = a.m.HotStreams(buf) }); n != 0 {
		t.Fatalf("HotStreams into a list of room enough allocated %v times", n)
	}
	raw, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewMachine(0)
	if err := restored.Restore(raw); err != nil {
		t.Fatal(err)
	}
	check("restore", restored)
}
