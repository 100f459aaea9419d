package stream

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

const jsonCT = "application/json"

func newJSONStream(t testing.TB) *applier {
	t.Helper()
	a := newApplier(t)
	if r := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: jsonCT, Json: true}); r.Err != nil {
		t.Fatal(r.Err)
	}
	return a
}

func jsonAppend(body string) *storagev1.Append {
	return &storagev1.Append{Bucket: "b", Stream: "s", ContentType: jsonCT, Body: []byte(body)}
}

func u64(v uint64) *uint64 { return &v }

func TestRecordCounting(t *testing.T) {
	type step struct {
		a                   *storagev1.Append
		wantCode            *fault.Kind
		wantStart, wantNext uint64
		wantDup             bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"one message per append", []step{
			{a: jsonAppend("1\n"), wantStart: 0, wantNext: 1},
			{a: jsonAppend("2\n"), wantStart: 1, wantNext: 2},
		}},
		{"a flattened array counts each message", []step{
			{a: jsonAppend("1\n2\n3\n"), wantStart: 0, wantNext: 3},
			{a: jsonAppend("{}\n"), wantStart: 3, wantNext: 4},
		}},
		{"record match applies at the tail", []step{
			{a: jsonAppend("1\n2\n"), wantNext: 2},
			{a: func() *storagev1.Append { x := jsonAppend("3\n"); x.RecordMatch = u64(2); return x }(), wantStart: 2, wantNext: 3},
		}},
		{"record match elsewhere is refused", []step{
			{a: jsonAppend("1\n2\n"), wantNext: 2},
			{a: func() *storagev1.Append { x := jsonAppend("3\n"); x.RecordMatch = u64(1); return x }(), wantCode: fault.ErrRecordMismatch},
		}},
		{"dedup returns the original range", []step{
			{a: jsonAppend("0\n"), wantNext: 1},
			{a: func() *storagev1.Append { x := jsonAppend("1\n2\n"); x.Producer = producer("p", 0, 0); return x }(), wantStart: 1, wantNext: 3},
			{a: jsonAppend("3\n"), wantStart: 3, wantNext: 4},
			{a: func() *storagev1.Append { x := jsonAppend("1\n2\n"); x.Producer = producer("p", 0, 0); return x }(), wantStart: 1, wantNext: 3, wantDup: true},
		}},
		{"a duplicate wins over a stale record match", []step{
			{a: func() *storagev1.Append {
				x := jsonAppend("1\n")
				x.Producer, x.RecordMatch = producer("p", 0, 0), u64(0)
				return x
			}(), wantStart: 0, wantNext: 1},
			{a: func() *storagev1.Append {
				x := jsonAppend("1\n")
				x.Producer, x.RecordMatch = producer("p", 0, 0), u64(0)
				return x
			}(), wantStart: 0, wantNext: 1, wantDup: true},
		}},
		{"a batch is one write of many records", []step{
			{a: &storagev1.Append{Bucket: "b", Stream: "s", ContentType: jsonCT, Frames: [][]byte{[]byte("1\n"), []byte("2\n3\n")}}, wantStart: 0, wantNext: 3},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newJSONStream(t)
			for i, s := range tc.steps {
				r := a.apply(2, s.a)
				if code(r) != s.wantCode {
					t.Fatalf("step %d: code %q, want %q", i, code(r), s.wantCode)
				}
				if r.Err != nil {
					continue
				}
				if r.RecordStart != s.wantStart || r.RecordNext != s.wantNext || r.Duplicate != s.wantDup {
					t.Fatalf("step %d: range [%d, %d) dup %v, want [%d, %d) dup %v", i, r.RecordStart, r.RecordNext, r.Duplicate, s.wantStart, s.wantNext, s.wantDup)
				}
			}
		})
	}
}

func TestRecordMismatchMetadata(t *testing.T) {
	a := newJSONStream(t)
	a.apply(2, jsonAppend("1\n2\n"))
	x := jsonAppend("3\n")
	x.RecordMatch = u64(5)
	r := a.apply(3, x)
	if code(r) != fault.ErrRecordMismatch || r.Err.Details[fault.DetailRecordNext] != "2" || r.Err.Details[fault.DetailNextOffset] != FormatOffset(4) {
		t.Fatalf("got %v", r.Err)
	}
}

func TestBatchFrames(t *testing.T) {
	a := newJSONStream(t)
	a.apply(2, jsonAppend("0\n"))
	r := a.apply(3, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: jsonCT,
		Frames: [][]byte{[]byte("1\n"), []byte("22\n33\n"), []byte("4\n")}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	want := []FrameResult{{End: 4, RecordStart: 1, RecordNext: 2}, {End: 10, RecordStart: 2, RecordNext: 4}, {End: 12, RecordStart: 4, RecordNext: 5}}
	if len(r.Frames) != len(want) {
		t.Fatalf("frames %+v", r.Frames)
	}
	for i := range want {
		if r.Frames[i] != want[i] {
			t.Fatalf("frame %d: %+v, want %+v", i, r.Frames[i], want[i])
		}
	}
	// Each frame is its own append: a read limited inside the second frame
	// cuts at the first frame's end.
	if _, end, _, _ := a.m.ReadOwn(Key{"b", "s"}, r.Meta.Incarnation, 2, 100, 3, nil); end != 4 {
		t.Fatalf("cut at %d, want 4", end)
	}
}

func TestRecordLookupHot(t *testing.T) {
	a := newJSONStream(t)
	a.apply(2, jsonAppend("a\nbb\n"))
	r := a.apply(3, jsonAppend("ccc\n"))
	k, inc := Key{"b", "s"}, r.Meta.Incarnation
	tests := []struct {
		name string
		n    uint64
		pos  uint64
		ok   bool
	}{
		{"first", 0, 0, true},
		{"second", 1, 2, true},
		{"in the next append", 2, 5, true},
		{"the tail", 3, 9, true},
		{"beyond", 4, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pos, ref, ok := a.m.RecordPos(k, inc, tc.n)
			if ok != tc.ok || ref != nil || (ok && pos != tc.pos) {
				t.Fatalf("RecordPos(%d) = %d, %v, %v", tc.n, pos, ref, ok)
			}
			if !ok {
				return
			}
			rec, ref, ok := a.m.RecordAt(k, inc, tc.pos)
			if !ok || ref != nil || rec != tc.n {
				t.Fatalf("RecordAt(%d) = %d, %v, %v", tc.pos, rec, ref, ok)
			}
		})
	}
}

func TestRecordsAcrossFlush(t *testing.T) {
	a := newJSONStream(t)
	a.apply(2, jsonAppend("a\nb\n"))
	r := a.apply(3, jsonAppend("c\n"))
	k, inc := Key{"b", "s"}, r.Meta.Incarnation
	chunk := &storagev1.ColdRef{Start: 0, End: 4, Key: "k1", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 10, Records: 1}
	// Wrong record range: refused.
	bad := a.apply(4, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk}})
	if code(bad) != fault.ErrInvalidArgument {
		t.Fatalf("flush without records: %v", bad.Err)
	}
	pieces, _, _ := a.m.FlushPlan(k, inc, 4)
	if len(pieces) != 1 || pieces[0].FirstRecord != 0 || pieces[0].NextRecord != 2 {
		t.Fatalf("plan %+v", pieces)
	}
	chunk.FirstRecord, chunk.NextRecord = 0, 2
	if r := a.apply(5, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if pos, ref, ok := a.m.RecordPos(k, inc, 1); !ok || ref.GetKey() != "k1" || pos != 0 {
		t.Fatalf("cold record: %d %v %v", pos, ref, ok)
	}
	if pos, ref, ok := a.m.RecordPos(k, inc, 2); !ok || ref != nil || pos != 4 {
		t.Fatalf("hot record: %d %v %v", pos, ref, ok)
	}
	if rec, ref, ok := a.m.RecordAt(k, inc, 4); !ok || ref != nil || rec != 2 {
		t.Fatalf("RecordAt(4) = %d %v %v", rec, ref, ok)
	}
	if r := a.apply(6, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: inc, Position: 2, RecordFirst: 1}); r.Err != nil || r.Meta.RecordFirst != 1 {
		t.Fatalf("retention: %v %+v", r.Err, r.Meta)
	}
}

func TestRecordsSurviveSwap(t *testing.T) {
	a := newJSONStream(t)
	a.apply(2, jsonAppend("a\n"))
	r := a.apply(3, jsonAppend("b\nc\n"))
	inc := r.Meta.Incarnation
	c1 := &storagev1.ColdRef{Start: 0, End: 2, Key: "k1", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 6, Records: 1, FirstRecord: 0, NextRecord: 1}
	c2 := &storagev1.ColdRef{Start: 2, End: 6, Key: "k2", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 10, Records: 1, FirstRecord: 1, NextRecord: 3}
	if r := a.apply(4, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{c1, c2}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	// The compacted chunk takes the record range of what it replaces,
	// whatever the command says.
	merged := &storagev1.ColdRef{Start: 0, End: 6, Key: "k3", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 14, Records: 2}
	if r := a.apply(5, &storagev1.ColdSwap{Bucket: "b", Stream: "s", Incarnation: inc, Replaced: []*storagev1.ColdRef{c1, c2}, Chunk: merged}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if pos, ref, ok := a.m.RecordPos(Key{"b", "s"}, inc, 2); !ok || ref.GetKey() != "k3" || ref.GetFirstRecord() != 0 || ref.GetNextRecord() != 3 || pos != 0 {
		t.Fatalf("after swap: %d %v %v", pos, ref, ok)
	}
	if merged.GetNextRecord() != 0 {
		t.Fatal("apply modified the command")
	}
}

// TestRecordMarks: the hot window's record checkpoints answer every
// lookup as a count from the window's start would, keep each lookup's
// scan within recordStep plus one message, follow flushes, and are
// rebuilt alike from a snapshot.
func TestRecordMarks(t *testing.T) {
	a := newJSONStream(t)
	k := Key{"b", "s"}
	var bounds []uint64 // bounds[n] is where record n starts
	bounds = append(bounds, 0)
	var pos uint64
	var inc uint64
	msg := func(i, size int) string {
		return fmt.Sprintf(`"%0*d"`, size-3, i) + "\n" // size bytes with its newline
	}
	maxMsg := uint64(0)
	add := func(body string) {
		t.Helper()
		r := a.apply(2, jsonAppend(body))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		inc = r.Meta.Incarnation
		for _, line := range strings.SplitAfter(body, "\n") {
			if line != "" {
				pos += uint64(len(line))
				bounds = append(bounds, pos)
				maxMsg = max(maxMsg, uint64(len(line)))
			}
		}
	}
	for i := range 3000 {
		add(msg(i, 20+i%200)) // small appends
	}
	var big strings.Builder // one append of many messages, beyond recordStep
	for i := range 4000 {
		big.WriteString(msg(i, 50))
	}
	add(big.String())
	// An external payload: its reference carries its 3 records.
	r := a.apply(2, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: jsonCT,
		External: &storagev1.ColdRef{Key: "b/s/x/1", Size: 64, Crc32C: 7, End: 30, NextRecord: 3}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	extStart := pos
	pos += 30
	bounds = append(bounds, pos) // records inside it are located through its reference
	for i := range 2000 {
		add(msg(i, 30+i%100))
	}
	recAfterExt := uint64(3000 + 4000 + 3)

	check := func(what string) {
		t.Helper()
		s := a.m.streams[k]
		prev := s.buf.Base()
		for i, mk := range s.marks {
			if mk.pos <= prev && i > 0 || mk.pos > s.buf.End() {
				t.Fatalf("%s: mark %d %+v out of order (window [%d, %d))", what, i, mk, s.buf.Base(), s.buf.End())
			}
			prev = mk.pos
		}
		for n, b := range bounds {
			rec := uint64(n)
			if n > 3000+4000 { // past the external payload
				rec = recAfterExt + uint64(n-3000-4000-1)
			}
			if b < s.buf.Base() {
				continue
			}
			got, ref, ok := a.m.RecordAt(k, inc, b)
			if !ok || ref != nil || got != rec {
				t.Fatalf("%s: RecordAt(%d) = %d %v %v, want %d", what, b, got, ref, ok, rec)
			}
			if gap := b - s.markAt(b).pos; gap > recordStep+maxMsg+30 {
				t.Fatalf("%s: a lookup at %d counts %d bytes", what, b, gap)
			}
			if b == extStart {
				continue // record 7000 is the external payload's first: located through its reference
			}
			if p, ref, ok := a.m.RecordPos(k, inc, rec); !ok || ref != nil || p != b {
				t.Fatalf("%s: RecordPos(%d) = %d %v %v, want %d", what, rec, p, ref, ok, b)
			}
		}
		if p, ref, ok := a.m.RecordPos(k, inc, 3000+4000+1); !ok || ref == nil || p != extStart {
			t.Fatalf("%s: a record inside the external payload: %d %v %v", what, p, ref, ok)
		}
		if len(s.marks) < int((s.buf.End()-s.buf.Base())/(recordStep+maxMsg+30)) {
			t.Fatalf("%s: %d marks for %d hot bytes", what, len(s.marks), s.buf.End()-s.buf.Base())
		}
	}
	check("after appends")

	// A snapshot installs the same marks.
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewMachine(0)
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got, want := restored.streams[k].marks, a.m.streams[k].marks; !slices.Equal(got, want) {
		t.Fatalf("restored marks differ: %d vs %d", len(got), len(want))
	}

	// A flush drops the marks below the window.
	pieces, _, _ := a.m.FlushPlan(k, inc, 200<<10)
	var chunks []*storagev1.ColdRef
	for i, p := range pieces {
		chunks = append(chunks, &storagev1.ColdRef{Start: p.Start, End: p.End, Key: fmt.Sprintf("c%d", i), Kind: storagev1.ColdKind_COLD_KIND_CHUNK,
			Size: p.End - p.Start + 64, Records: uint32(len(p.Records)), FirstRecord: p.FirstRecord, NextRecord: p.NextRecord})
	}
	if r := a.apply(3, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: chunks}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if s := a.m.streams[k]; len(s.marks) == 0 || s.marks[0].pos < s.buf.Base() {
		t.Fatalf("marks after the flush start at %v, window at %d", s.marks[:1], s.buf.Base())
	}
	check("after a flush")
}

// legacySnapshot is a's snapshot as a release before record numbering
// wrote it: no record fields anywhere.
func legacySnapshot(t *testing.T, a *applier) []byte {
	t.Helper()
	data, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		t.Fatal(err)
	}
	for _, st := range snap.GetStreams() {
		st.RecordFirst, st.RecordNext, st.HotRecord, st.BaseRecord = 0, 0, 0, 0
		for _, p := range st.GetProducers() {
			p.RecordStart, p.RecordNext = 0, 0
		}
		for _, lv := range st.GetColdIndex() {
			for _, e := range lv.GetEntries() {
				e.FirstRecord, e.NextRecord = 0, 0
			}
		}
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(&snap)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLegacyStreamsNumbered: a JSON stream restored from a snapshot
// written before record numbering gets ordinals for the messages it holds
// hot (from its first message when every byte is hot), its next append
// continues them, and restoring the numbered state again changes nothing.
func TestLegacyStreamsNumbered(t *testing.T) {
	k := Key{"b", "s"}
	tests := []struct {
		name string
		// retain is the retention set before the snapshot (0: none);
		// flush moves the first append to a cold chunk first.
		retain uint64
		flush  bool
		// wantNext, wantFirst: the record tail and first retained record
		// after the restore; wantAt: position → ordinal.
		wantNext, wantFirst uint64
		wantAt              map[uint64]uint64
	}{
		{name: "all hot", wantNext: 5, wantFirst: 0, wantAt: map[uint64]uint64{0: 0, 2: 1, 4: 2, 6: 3, 8: 4, 10: 5}},
		{name: "retention in the hot window", retain: 4, wantNext: 5, wantFirst: 2, wantAt: map[uint64]uint64{4: 2, 8: 4}},
		{name: "flushed before numbering", flush: true, wantNext: 3, wantFirst: 0, wantAt: map[uint64]uint64{4: 0, 6: 1, 10: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newJSONStream(t)
			a.apply(2, jsonAppend("a\nb\n"))      // [0, 4)
			a.apply(3, jsonAppend("c\n"))         // [4, 6)
			r := a.apply(4, jsonAppend("d\ne\n")) // [6, 10)
			inc := r.Meta.Incarnation
			if tc.flush {
				chunk := &storagev1.ColdRef{Start: 0, End: 4, Key: "k1", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 10, Records: 1, FirstRecord: 0, NextRecord: 2}
				if r := a.apply(5, &storagev1.ColdFlush{Bucket: "b", Stream: "s", Incarnation: inc, Chunks: []*storagev1.ColdRef{chunk}}); r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			if tc.retain > 0 {
				if r := a.apply(6, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: inc, Position: tc.retain}); r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			b := newApplier(t)
			if err := b.m.Restore(legacySnapshot(t, a)); err != nil {
				t.Fatal(err)
			}
			m, _ := b.m.Lookup(k)
			if m.RecordNext != tc.wantNext || m.RecordFirst != tc.wantFirst {
				t.Fatalf("restored records [%d, %d), want [%d, %d)", m.RecordFirst, m.RecordNext, tc.wantFirst, tc.wantNext)
			}
			for pos, want := range tc.wantAt {
				if got, ref, ok := b.m.RecordAt(k, inc, pos); !ok || ref != nil || got != want {
					t.Fatalf("RecordAt(%d) = %d %v %v, want %d", pos, got, ref, ok, want)
				}
				if want < tc.wantNext {
					if got, ref, ok := b.m.RecordPos(k, inc, want); !ok || ref != nil || got != pos {
						t.Fatalf("RecordPos(%d) = %d %v %v, want %d", want, got, ref, ok, pos)
					}
				}
			}
			if r := b.apply(7, jsonAppend("f\n")); r.Err != nil || r.RecordStart != tc.wantNext || r.RecordNext != tc.wantNext+1 {
				t.Fatalf("append after the restore: %v [%d, %d)", r.Err, r.RecordStart, r.RecordNext)
			}
			// Numbered state restores as it is.
			again, err := b.m.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			c := newApplier(t)
			if err := c.m.Restore(again); err != nil {
				t.Fatal(err)
			}
			if twice, _ := c.m.Snapshot(); !bytes.Equal(twice, again) {
				t.Fatal("restoring a numbered snapshot changed it")
			}
		})
	}
}
