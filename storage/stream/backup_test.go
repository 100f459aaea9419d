package stream

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

// cmdOf wraps one operation in a command.
func cmdOf(tb testing.TB, op proto.Message) *storagev1.Command {
	tb.Helper()
	c := &storagev1.Command{}
	switch o := op.(type) {
	case *storagev1.CreateBucket:
		c.Op = &storagev1.Command_CreateBucket{CreateBucket: o}
	case *storagev1.CreateStream:
		c.Op = &storagev1.Command_CreateStream{CreateStream: o}
	case *storagev1.Append:
		c.Op = &storagev1.Command_Append{Append: o}
	case *storagev1.DeleteStream:
		c.Op = &storagev1.Command_DeleteStream{DeleteStream: o}
	case *storagev1.AddForkRef:
		c.Op = &storagev1.Command_AddForkRef{AddForkRef: o}
	case *storagev1.SetRetention:
		c.Op = &storagev1.Command_SetRetention{SetRetention: o}
	case *storagev1.ColdRetire:
		c.Op = &storagev1.Command_ColdRetire{ColdRetire: o}
	case *storagev1.PurgeBucket:
		c.Op = &storagev1.Command_PurgeBucket{PurgeBucket: o}
	case *storagev1.PublishSnapshot:
		c.Op = &storagev1.Command_PublishSnapshot{PublishSnapshot: o}
	case *storagev1.SetAttrs:
		c.Op = &storagev1.Command_SetAttrs{SetAttrs: o}
	case *storagev1.StartHistory:
		c.Op = &storagev1.Command_StartHistory{StartHistory: o}
	case *storagev1.ImportGroup:
		c.Op = &storagev1.Command_ImportGroup{ImportGroup: o}
	case *storagev1.HoldColdGC:
		c.Op = &storagev1.Command_HoldColdGc{HoldColdGc: o}
	case *storagev1.GCAck:
		c.Op = &storagev1.Command_GcAck{GcAck: o}
	case *storagev1.Touch:
		c.Op = &storagev1.Command_Touch{Touch: o}
	default:
		tb.Fatalf("cmdOf: %T", op)
	}
	return c
}

// do applies op at the next index and fails the test on a refusal.
func (a *applier) do(now int64, op proto.Message) *Result {
	a.t.Helper()
	r := a.applyCmd(now, cmdOf(a.t, op))
	if r.Err != nil {
		a.t.Fatalf("apply %T at %d: %v", op, a.index, r.Err)
	}
	return r
}

// importOp imports an encoded snapshot, its digest standing for the group
// object's.
func importOp(snap []byte) *storagev1.ImportGroup {
	return &storagev1.ImportGroup{Snapshot: snap, Blake3: backupfmt.Digest(snap)}
}

func decodeSnap(tb testing.TB, raw []byte) *storagev1.Snapshot {
	tb.Helper()
	var s storagev1.Snapshot
	if err := proto.Unmarshal(raw, &s); err != nil {
		tb.Fatal(err)
	}
	return &s
}

func snapOf(tb testing.TB, m *Machine) *storagev1.Snapshot {
	tb.Helper()
	raw, err := m.Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	return decodeSnap(tb, raw)
}

// stateOf is a machine's snapshot without its applied index: what a
// refused command must leave unchanged.
func stateOf(tb testing.TB, m *Machine) *storagev1.Snapshot {
	tb.Helper()
	s := snapOf(tb, m)
	s.AppliedIndex = 0
	return s
}

func streamIn(s *storagev1.Snapshot, name string) *storagev1.StreamState {
	for _, st := range s.GetStreams() {
		if st.GetStream() == name {
			return st
		}
	}
	return nil
}

// tailOf is a snapshot stream's tail.
func tailOf(st *storagev1.StreamState) uint64 {
	t := st.GetColdEnd() + uint64(len(st.GetData()))
	for _, x := range st.GetHotExternal() {
		t += x.GetRef().GetEnd() - x.GetRef().GetStart()
	}
	return t
}

// variedGroup builds group 0 in most of the states a machine reaches:
// buckets and a purged one, a closed stream with producers, a JSON stream
// flushed through a sealed page with external payloads (indexed and hot),
// retention and retirement, published snapshots (an object, parts),
// attributes, a TTL, a soft-deleted fork source, a JSON fork, a GC queue,
// a GC hold and a history event with writes after it. step, when set, is
// called after every command. The same calls build the same state.
func variedGroup(tb testing.TB, step func(what string, a *applier)) *applier {
	tb.Helper()
	a := newApplier(tb)
	do := func(what string, now int64, op proto.Message) *Result {
		tb.Helper()
		r := a.do(now, op)
		if step != nil {
			step(what, a)
		}
		return r
	}
	flush := func(name string, inc uint64) {
		tb.Helper()
		if r := flushAll(tb, a, name, inc); r.Err != nil {
			tb.Fatalf("flush %s: %v", name, r.Err)
		}
		if step != nil {
			step("flush "+name, a)
		}
	}
	do("bucket", 1, &storagev1.CreateBucket{Bucket: "b"})
	do("bucket old", 1, &storagev1.CreateBucket{Bucket: "old"})

	plain := do("create plain", 2, &storagev1.CreateStream{Bucket: "b", Stream: "plain", ContentType: "text/plain", Body: []byte("hello ")}).Meta.Incarnation
	for i := range uint64(3) {
		do("produce", 3, &storagev1.Append{Bucket: "b", Stream: "plain", ContentType: "text/plain", Body: []byte("abc"), Producer: producer("p1", 1, i)})
	}
	do("another producer", 3, &storagev1.Append{Bucket: "b", Stream: "plain", ContentType: "text/plain", Body: []byte("q"), Producer: producer("p0", 2, 0), StreamSeq: "s1"})
	do("close", 4, &storagev1.Append{Bucket: "b", Stream: "plain", ContentType: "text/plain", Body: []byte("end"), Close: true, Producer: producer("p1", 1, 3)})
	do("publish parts", 4, &storagev1.PublishSnapshot{Bucket: "b", Stream: "plain", Incarnation: plain, Snapshot: &storagev1.SnapshotRef{
		Position: 6, Digest: "d-parts", ContentType: "application/x", Size: 9,
		PartKeys: []string{"b/p/sp/1", "b/p/sp/2"}, PartSizes: []uint64{4, 5}, PartDigests: []string{"aa", "bb"}}})

	const ct = "application/json"
	j := do("create json", 5, &storagev1.CreateStream{Bucket: "b", Stream: "json", ContentType: ct, Json: true, Body: []byte("1\n2\n")}).Meta.Incarnation
	do("json producer", 5, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("3\n"), Producer: producer("pj", 1, 0)})
	for i := range 70 {
		do("append json", 6, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: fmt.Appendf(nil, "{\"n\":%d}\n{\"m\":%d}\n", i, i)})
		if i == 30 {
			do("json external", 6, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct,
				External: &storagev1.ColdRef{Key: "b/j/x/1", Size: 64, Crc32C: 7, End: 24, NextRecord: 3}})
		}
		flush("json", j)
	}
	do("json hot", 6, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("[1]\n")})
	do("json hot external", 6, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct,
		External: &storagev1.ColdRef{Key: "b/j/x/2", Size: 40, Crc32C: 8, End: 10, NextRecord: 2}})
	do("json hot after", 6, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("{}\n\"s\"\n")})
	levels, _ := a.m.ColdLevels(Key{"b", "json"}, j)
	cut := levels[0].GetEntries()[2]
	do("retention", 7, &storagev1.SetRetention{Bucket: "b", Stream: "json", Incarnation: j, Position: cut.GetStart(), RecordFirst: cut.GetFirstRecord()})
	do("retire", 7, &storagev1.ColdRetire{Bucket: "b", Stream: "json", Incarnation: j, GraceMs: 1000})
	jm, _ := a.m.Lookup(Key{"b", "json"})
	do("publish", 8, &storagev1.PublishSnapshot{Bucket: "b", Stream: "json", Incarnation: j, Snapshot: &storagev1.SnapshotRef{
		Position: jm.Tail, Digest: "d-json", ContentType: "application/x", Key: "b/j/s/1", Size: 5}})
	do("attrs", 9, &storagev1.SetAttrs{Bucket: "b", Stream: "json", Incarnation: j, Title: "t", Metadata: []byte(`{"k":1}`)})
	do("json fork ref", 9, &storagev1.AddForkRef{Bucket: "b", Stream: "json", Incarnation: j, Position: jm.Tail})
	do("json fork", 9, &storagev1.CreateStream{Bucket: "b", Stream: "jfork", ContentType: ct, Json: true, Body: []byte("9\n"), BaseRecord: jm.RecordNext,
		Fork: &storagev1.ForkOrigin{SourceBucket: "b", SourceStream: "json", SourceIncarnation: j, Position: jm.Tail}})

	src := do("create src", 10, &storagev1.CreateStream{Bucket: "b", Stream: "src", ContentType: "text/plain", Body: []byte("0123456789"), HasTtl: true, TtlSeconds: 3600}).Meta.Incarnation
	do("fork ref", 10, &storagev1.AddForkRef{Bucket: "b", Stream: "src", Incarnation: src, Position: 4})
	do("fork", 10, &storagev1.CreateStream{Bucket: "b", Stream: "fork", ContentType: "text/plain", Body: []byte("xyz"),
		Fork: &storagev1.ForkOrigin{SourceBucket: "b", SourceStream: "src", SourceIncarnation: src, Position: 4}})
	do("soft delete", 11, &storagev1.DeleteStream{Bucket: "b", Stream: "src", Incarnation: src})

	do("create ext", 12, &storagev1.CreateStream{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream"})
	do("ext payload", 12, &storagev1.Append{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream",
		External: &storagev1.ColdRef{Key: "b/e/x/1", Size: 30, Crc32C: 9, End: 20}, Producer: producer("pe", 1, 0)})
	do("ext tail", 12, &storagev1.Append{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream", Body: []byte("tail")})

	gone := do("create gone", 13, &storagev1.CreateStream{Bucket: "b", Stream: "gone", ContentType: "text/plain", Body: []byte("g")}).Meta.Incarnation
	flush("gone", gone)
	do("delete gone", 13, &storagev1.DeleteStream{Bucket: "b", Stream: "gone", Incarnation: gone})
	do("create old", 13, &storagev1.CreateStream{Bucket: "old", Stream: "s", ContentType: "text/plain", Body: []byte("o")})
	do("purge old", 14, &storagev1.PurgeBucket{Bucket: "old"})
	q, _ := a.m.GCQueue(1)
	do("gc ack", 14, &storagev1.GCAck{Seqs: []uint64{q[0].GetSeq()}})
	do("hold", 15, &storagev1.HoldColdGC{Holder: "backup-1", UntilMs: 1 << 40})

	do("history", 16, &storagev1.StartHistory{PlanTerm: 3, Point: a.index, Reason: HistoryAcceptLoss})
	em, _ := a.m.Lookup(Key{"b", "ext"})
	do("touch", 17, &storagev1.Touch{Bucket: "b", Stream: "ext", Incarnation: em.Incarnation, TouchedMs: 17})
	do("ext after history", 18, &storagev1.Append{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream", Body: []byte("more"), Incarnation: em.Incarnation})
	jm, _ = a.m.Lookup(Key{"b", "json"})
	do("json after history", 18, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("4\n"), Incarnation: jm.Incarnation})
	flush("json", jm.Incarnation)
	do("json hot again", 19, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("5\n"), Incarnation: jm.Incarnation})
	do("json hot external again", 19, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Incarnation: jm.Incarnation,
		External: &storagev1.ColdRef{Key: "b/j/x/3", Size: 40, Crc32C: 8, End: 6, NextRecord: 3}})
	do("json hot last", 19, &storagev1.Append{Bucket: "b", Stream: "json", ContentType: ct, Body: []byte("6\n7\n"), Incarnation: jm.Incarnation})
	return a
}

// TestValidateSnapshotOfRealMachines: every state variedGroup passes
// through, a restore of it and the state after an import validate.
func TestValidateSnapshotOfRealMachines(t *testing.T) {
	if snapshotFormat != backupfmt.SnapshotFormat || MaxProducers != backupfmt.MaxProducers {
		t.Fatalf("the machine writes format %d and keeps %d producers, backupfmt validates %d and %d", snapshotFormat, MaxProducers, backupfmt.SnapshotFormat, backupfmt.MaxProducers)
	}
	steps := 0
	a := variedGroup(t, func(what string, a *applier) {
		steps++
		if err := backupfmt.ValidateSnapshot(snapOf(t, a.m)); err != nil {
			t.Fatalf("after %q (index %d): %v", what, a.index, err)
		}
	})
	raw, _ := a.m.Snapshot()
	restored := NewMachine(0)
	if err := restored.Restore(raw); err != nil {
		t.Fatal(err)
	}
	if err := backupfmt.ValidateSnapshot(snapOf(t, restored)); err != nil {
		t.Fatalf("restored: %v", err)
	}
	dst := newApplier(t)
	dst.do(1, importOp(raw))
	if err := backupfmt.ValidateSnapshot(snapOf(t, dst.m)); err != nil {
		t.Fatalf("imported: %v", err)
	}
	if steps < 100 {
		t.Fatalf("only %d states checked", steps)
	}
}

// TestValidateSnapshotRefusesCorruption: targeted corruptions of a real
// snapshot are each refused by the rule they break, and an import of any
// of them is refused and changes nothing.
func TestValidateSnapshotRefusesCorruption(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	if err := backupfmt.ValidateSnapshot(decodeSnap(t, raw)); err != nil {
		t.Fatal(err)
	}
	st := func(name string) func(*storagev1.Snapshot) *storagev1.StreamState {
		return func(s *storagev1.Snapshot) *storagev1.StreamState { return streamIn(s, name) }
	}
	plain, json, ext, fork, src := st("plain"), st("json"), st("ext"), st("fork"), st("src")
	for _, tc := range []struct {
		name   string
		want   string
		mutate func(s *storagev1.Snapshot)
	}{
		{"another format", "format", func(s *storagev1.Snapshot) { s.Format = 3 }},
		{"buckets out of order", "bucket", func(s *storagev1.Snapshot) { s.Buckets = []string{"z", "b"} }},
		{"a bucket live and fenced", "both live and fenced", func(s *storagev1.Snapshot) {
			s.FencedBuckets = append(s.FencedBuckets, "zz")
			s.Buckets = append(s.Buckets, "zz")
		}},
		{"a creation time of no bucket", "creation time", func(s *storagev1.Snapshot) { s.BucketCreatedMs["nope"] = 1 }},
		{"a repeated stream", "out of order or repeated", func(s *storagev1.Snapshot) { s.Streams = append(s.Streams, proto.CloneOf(s.Streams[len(s.Streams)-1])) }},
		{"streams out of order", "out of order or repeated", func(s *storagev1.Snapshot) { s.Streams[0], s.Streams[1] = s.Streams[1], s.Streams[0] }},
		{"a stream in a fenced bucket", "fenced bucket", func(s *storagev1.Snapshot) {
			x := proto.CloneOf(s.Streams[0])
			x.Bucket = "old"
			s.Streams = append([]*storagev1.StreamState{x}, s.Streams...)
		}},
		{"a GC entry at the next sequence", "GC entry", func(s *storagev1.Snapshot) { s.GcQueue[0].Seq = s.GcNextSeq }},
		{"a GC entry of no kind", "kind", func(s *storagev1.Snapshot) { s.GcQueue[0].Kind = 0 }},
		{"a GC hold that never held", "GC hold", func(s *storagev1.Snapshot) { s.GcHolds["x"] = 0 }},
		{"an import record without a digest", "import record", func(s *storagev1.Snapshot) { s.Imported = &storagev1.ImportRecord{Blake3: "x"} }},
		{"incarnation 0", "incarnation 0", func(s *storagev1.Snapshot) { plain(s).Incarnation = 0 }},
		{"an incarnation the group never issued", "outside", func(s *storagev1.Snapshot) { plain(s).Incarnation = s.AppliedIndex + 1 }},
		{"a fork whose own bytes start elsewhere", "a fork at", func(s *storagev1.Snapshot) { fork(s).Base++ }},
		{"own bytes after 0 without a fork", "without a fork", func(s *storagev1.Snapshot) { plain(s).Base, plain(s).ColdEnd = 1, 1 }},
		{"soft-deleted without forks", "soft-deleted", func(s *storagev1.Snapshot) { src(s).ForkRefs = 0 }},
		{"cold end below the base", "cold end", func(s *storagev1.Snapshot) { fork(s).ColdEnd = fork(s).Base - 1 }},
		{"retention beyond the tail", "retention", func(s *storagev1.Snapshot) { plain(s).Retained = tailOf(plain(s)) + 1 }},
		{"a record end beyond the tail", "record end", func(s *storagev1.Snapshot) { plain(s).Records = append(plain(s).Records, tailOf(plain(s))+1) }},
		{"record ends out of order", "record end", func(s *storagev1.Snapshot) { r := plain(s).Records; r[0], r[1] = r[1], r[0] }},
		{"a record end in the cold range", "record end", func(s *storagev1.Snapshot) { json(s).Records[0] = json(s).ColdEnd }},
		{"an external payload without a reference", "without a reference", func(s *storagev1.Snapshot) { ext(s).HotExternal[0].Ref = nil }},
		{"an external payload of another kind", "of kind", func(s *storagev1.Snapshot) { ext(s).HotExternal[0].Ref.Kind = storagev1.ColdKind_COLD_KIND_CHUNK }},
		{"an external payload before the hot window", "out of order", func(s *storagev1.Snapshot) { json(s).HotExternal[0].Ref.Start = json(s).ColdEnd - 1 }},
		{"an external payload past the hot bytes", "past the hot bytes", func(s *storagev1.Snapshot) {
			r := ext(s).HotExternal[0].Ref
			r.Start, r.End = r.Start+1000, r.End+1000
		}},
		{"JSON hot bytes that end inside a message", "JSON message", func(s *storagev1.Snapshot) {
			d := json(s).Data
			json(s).Data = d[:len(d)-1]
		}},
		{"JSON records that do not add up", "record", func(s *storagev1.Snapshot) { json(s).RecordNext++ }},
		{"a JSON external payload's records out of sequence", "holds records", func(s *storagev1.Snapshot) { json(s).HotExternal[0].Ref.FirstRecord++ }},
		{"a gap in the cold index", "starts at", func(s *storagev1.Snapshot) { json(s).ColdIndex[0].Entries[3].Start++ }},
		{"an index that stops before the cold end", "the index ends", func(s *storagev1.Snapshot) {
			lv := json(s).ColdIndex[0]
			lv.Entries = lv.Entries[:len(lv.Entries)-1]
		}},
		{"an index entry at the wrong level", "at level", func(s *storagev1.Snapshot) { json(s).ColdIndex[0].Entries[1].Level = 1 }},
		{"a page at level 0", "at level", func(s *storagev1.Snapshot) { json(s).ColdIndex[0].Entries[1].Kind = storagev1.ColdKind_COLD_KIND_PAGE }},
		{"an index that starts above the readable bytes", "the index starts", func(s *storagev1.Snapshot) {
			lv := json(s).ColdIndex[0]
			lv.Entries = lv.Entries[1:]
		}},
		{"readable cold bytes without an index", "not indexed", func(s *storagev1.Snapshot) { json(s).ColdIndex = nil }},
		{"index records out of sequence", "out of sequence", func(s *storagev1.Snapshot) { json(s).ColdIndex[0].Entries[2].FirstRecord++ }},
		{"an index that ends at another record than the hot window", "hot window starts", func(s *storagev1.Snapshot) {
			lv := json(s).ColdIndex[0].Entries
			lv[len(lv)-1].NextRecord++
		}},
		{"producers out of order", "producer", func(s *storagev1.Snapshot) { p := plain(s).Producers; p[0], p[1] = p[1], p[0] }},
		{"an unnamed producer", "producer", func(s *storagev1.Snapshot) { plain(s).Producers[0].Id = "" }},
		{"more producers than a stream keeps", "producers, at most", func(s *storagev1.Snapshot) {
			for i := range MaxProducers {
				plain(s).Producers = append(plain(s).Producers, &storagev1.ProducerState{Id: fmt.Sprintf("z%05d", i)})
			}
		}},
		{"a tail at the top of the positions", "beyond", func(s *storagev1.Snapshot) {
			st := ext(s)
			st.Fork = &storagev1.ForkOrigin{SourceBucket: "b", SourceStream: "x", SourceIncarnation: 1, Position: backupfmt.MaxPosition}
			st.Base, st.ColdEnd = backupfmt.MaxPosition, backupfmt.MaxPosition
			for _, x := range st.HotExternal {
				x.Ref.Start += backupfmt.MaxPosition
				x.Ref.End += backupfmt.MaxPosition
			}
		}},
		{"an earlier incarnation not below the current", "earlier incarnation", func(s *storagev1.Snapshot) { json(s).Earlier[0].Incarnation = json(s).Incarnation }},
		{"an earlier incarnation that kept more than the tail", "earlier incarnation", func(s *storagev1.Snapshot) { json(s).Earlier[0].Kept = tailOf(json(s)) + 1 }},
		{"a previous incarnation not below the current", "previous incarnation", func(s *storagev1.Snapshot) { plain(s).PreviousIncarnation = plain(s).Incarnation }},
		{"an inherited offset beyond the tail", "previous incarnation", func(s *storagev1.Snapshot) { plain(s).InheritedOffset = tailOf(plain(s)) + 1 }},
		{"an inherited offset without a previous incarnation", "inherited offset", func(s *storagev1.Snapshot) { plain(s).PreviousIncarnation = 0 }},
		{"an application snapshot beyond the tail", "application snapshot", func(s *storagev1.Snapshot) { json(s).Snapshot.Position = tailOf(json(s)) + 1 }},
		{"an application snapshot without a digest", "application snapshot", func(s *storagev1.Snapshot) { json(s).Snapshot.Digest = "" }},
		{"application snapshot parts that do not add up", "part keys", func(s *storagev1.Snapshot) { plain(s).Snapshot.PartSizes = plain(s).Snapshot.PartSizes[:1] }},
		{"an unnamed stream", "unnamed", func(s *storagev1.Snapshot) { s.Streams[0].Stream = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := decodeSnap(t, raw)
			tc.mutate(s)
			err := backupfmt.ValidateSnapshot(s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ValidateSnapshot = %v, want an error about %q", err, tc.want)
			}
			bad, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
			dst := newApplier(t)
			before := stateOf(t, dst.m)
			r := dst.applyCmd(1, cmdOf(t, importOp(bad)))
			if code(r) != fault.ErrInvalidArgument {
				t.Fatalf("import: %v, want INVALID_ARGUMENT", r.Err)
			}
			if after := stateOf(t, dst.m); !proto.Equal(before, after) {
				t.Fatal("a refused import changed the state")
			}
		})
	}
}

// TestImportGroupIntoEmptyGroup: the imported state is the source's, but
// for what a new history changes (incarnations, previous tokens, earlier
// incarnations, closed producer epochs) and what belongs to the target
// (applied index, GC queue and holds, history and import records).
func TestImportGroupIntoEmptyGroup(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	src := decodeSnap(t, raw)
	dst := newApplier(t)
	dst.index = 4
	dst.do(50, &storagev1.HoldColdGC{Holder: "restore", UntilMs: 1 << 41})
	dst.do(50, &storagev1.HoldColdGC{Holder: "over", UntilMs: 60})
	r := dst.do(100, importOp(raw))
	index := dst.index
	offset := src.GetAppliedIndex() + src.GetIncarnationOffset()
	var live uint64
	for _, st := range src.GetStreams() {
		if !st.GetSoftDeleted() {
			live++
		}
	}
	if r.EventIndex != index || r.Streams != live || r.Duplicate {
		t.Fatalf("result %+v, want event %d over %d streams", r, index, live)
	}
	got := snapOf(t, dst.m)
	digest := backupfmt.Digest(raw)
	wantImported := &storagev1.ImportRecord{Blake3: digest, Index: index, AtMs: 100, SourceAppliedIndex: src.GetAppliedIndex(), Streams: live}
	wantHistory := &storagev1.HistoryRecord{EventIndex: index, PlanTerm: 0, Point: src.GetAppliedIndex(), Reason: HistoryRestore, AtMs: 100, Streams: live}
	switch {
	case got.GetAppliedIndex() != index:
		t.Fatalf("applied index %d, want the import's %d", got.GetAppliedIndex(), index)
	case got.GetIncarnationOffset() != offset:
		t.Fatalf("incarnation offset %d, want %d", got.GetIncarnationOffset(), offset)
	case !proto.Equal(got.GetImported(), wantImported):
		t.Fatalf("import record %v, want %v", got.GetImported(), wantImported)
	case !proto.Equal(got.GetHistory(), wantHistory):
		t.Fatalf("history %v, want %v", got.GetHistory(), wantHistory)
	case len(got.GetGcQueue()) != 0 || got.GetGcNextSeq() != src.GetGcNextSeq():
		t.Fatalf("GC queue %v next %d, want empty and next %d", got.GetGcQueue(), got.GetGcNextSeq(), src.GetGcNextSeq())
	case len(got.GetGcHolds()) != 1 || got.GetGcHolds()["restore"] != 1<<41:
		t.Fatalf("GC holds %v, want the target's unexpired one only", got.GetGcHolds())
	}
	var hotBytes int64
	for _, st := range src.GetStreams() {
		hotBytes += int64(len(st.GetData()))
	}
	if got := dst.m.HotBytes(); got != hotBytes || got == 0 {
		t.Fatalf("hot bytes %d after the import, want the snapshot's %d", got, hotBytes)
	}
	// What the import carries over as it was.
	for _, f := range []func(*storagev1.Snapshot) any{
		func(s *storagev1.Snapshot) any { return s.GetBuckets() },
		func(s *storagev1.Snapshot) any { return s.GetFencedBuckets() },
		func(s *storagev1.Snapshot) any { return s.GetUsage() },
		func(s *storagev1.Snapshot) any { return s.GetBucketCreatedMs() },
		func(s *storagev1.Snapshot) any { return s.GetGcReclaimed() },
		func(s *storagev1.Snapshot) any { return s.GetWriteUnitBytes() },
	} {
		if a, b := fmt.Sprint(f(src)), fmt.Sprint(f(got)); a != b {
			t.Fatalf("carried over: %s, want %s", b, a)
		}
	}
	if len(got.GetStreams()) != len(src.GetStreams()) {
		t.Fatalf("%d streams, want %d", len(got.GetStreams()), len(src.GetStreams()))
	}
	for i, want := range src.GetStreams() {
		st := got.GetStreams()[i]
		t.Run(want.GetStream(), func(t *testing.T) {
			want := proto.CloneOf(want)
			if !want.GetSoftDeleted() {
				tail := tailOf(want)
				prev := want.GetIncarnation()
				if want.GetPreviousIncarnation() != 0 && want.GetInheritedOffset() == tail {
					prev = want.GetPreviousIncarnation()
				}
				if st.GetIncarnation() != index+offset || st.GetPreviousIncarnation() != prev || st.GetInheritedOffset() != tail {
					t.Fatalf("incarnation %d previous %d inherited %d; want %d, %d, %d", st.GetIncarnation(), st.GetPreviousIncarnation(), st.GetInheritedOffset(), index+offset, prev, tail)
				}
				named := want.GetForkRefs() > 0 || len(want.GetHotExternal()) > 0 || want.GetSnapshot().GetKey() != "" || len(want.GetSnapshot().GetPartKeys()) > 0
				for _, lv := range want.GetColdIndex() {
					named = named || len(lv.GetEntries()) > 0
				}
				if named {
					want.Earlier = append(want.Earlier, &storagev1.EarlierIncarnation{Incarnation: want.GetIncarnation(), Kept: tail})
				}
				want.Incarnation, want.PreviousIncarnation, want.InheritedOffset = st.GetIncarnation(), prev, tail
				for _, p := range want.GetProducers() {
					p.EpochClosed = true
				}
			}
			if !proto.Equal(want, st) {
				t.Fatalf("imported stream\n%v\nwant\n%v", st, want)
			}
		})
	}

	t.Run("a repeat is already applied", func(t *testing.T) {
		dst.do(200, &storagev1.CreateStream{Bucket: "b", Stream: "new", ContentType: "text/plain"})
		before := stateOf(t, dst.m)
		r := dst.do(300, importOp(raw))
		if !r.Duplicate || r.EventIndex != index || r.Streams != live {
			t.Fatalf("repeat: %+v, want already, event %d over %d streams", r, index, live)
		}
		if after := stateOf(t, dst.m); !proto.Equal(before, after) {
			t.Fatal("a repeated import changed the state")
		}
		if info, ok := dst.m.Imported(); !ok || info.Index != index || info.Blake3 != digest {
			t.Fatalf("Imported() = %+v, %v", info, ok)
		}
	})

	t.Run("closed producer epochs answer 403 with the last seq kept", func(t *testing.T) {
		m, _ := dst.m.Lookup(Key{"b", "ext"})
		r := dst.applyCmd(400, cmdOf(t, &storagev1.Append{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream", Body: []byte("x"), Producer: producer("pe", 1, 1)}))
		if code(r) != fault.ErrProducerStaleEpoch || r.Err.Details[fault.DetailProducerOutcome] != fault.ProducerOutcomeClosedByHistory || r.Err.Details[fault.DetailProducerSeq] != "0" {
			t.Fatalf("a new write of a closed epoch: %v", r.Err)
		}
		if dup := dst.do(400, &storagev1.Append{Bucket: "b", Stream: "ext", ContentType: "application/octet-stream", Body: []byte("x"), Producer: producer("pe", 1, 0)}); !dup.Duplicate {
			t.Fatal("a retry of the seq kept is no duplicate")
		}
		if after, _ := dst.m.Lookup(Key{"b", "ext"}); after.Tail != m.Tail {
			t.Fatal("a refused write moved the tail")
		}
	})
}

// TestImportGroupRefusals: a group that is not empty refuses an import
// (409), and so does anything wrong with the command; nothing changes.
func TestImportGroupRefusals(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	other := newApplier(t)
	other.do(1, &storagev1.CreateStream{Bucket: "c", Stream: "s", ContentType: "text/plain"})
	otherRaw, _ := other.m.Snapshot()
	for _, tc := range []struct {
		name  string
		setUp func(a *applier)
		op    *storagev1.ImportGroup
		want  *fault.Kind
	}{
		{"a bucket", func(a *applier) { a.do(1, &storagev1.CreateBucket{Bucket: "b"}) }, importOp(raw), fault.ErrGroupNotEmpty},
		{"a stream", func(a *applier) {
			a.m = NewMachine(3) // streams outside group 0 have no bucket record
			a.do(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"})
		}, importOp(raw), fault.ErrGroupNotEmpty},
		{"a purged bucket", func(a *applier) { a.do(1, &storagev1.PurgeBucket{Bucket: "b"}) }, importOp(raw), fault.ErrGroupNotEmpty},
		{"another import", func(a *applier) {
			a.do(1, importOp(otherRaw))
			a.do(1, &storagev1.DeleteStream{Bucket: "c", Stream: "s"})
		}, importOp(raw), fault.ErrGroupNotEmpty},
		{"no digest", nil, &storagev1.ImportGroup{Snapshot: raw}, fault.ErrInvalidArgument},
		{"an upper-case digest", nil, &storagev1.ImportGroup{Snapshot: raw, Blake3: strings.ToUpper(backupfmt.Digest(raw))}, fault.ErrInvalidArgument},
		{"bytes that do not decode", nil, importOp([]byte{0xff, 0xff, 0xff}), fault.ErrInvalidArgument},
		{"no snapshot", nil, importOp(nil), fault.ErrInvalidArgument},
		{"incarnations near the top", nil, func() *storagev1.ImportGroup {
			s := decodeSnap(t, raw)
			s.IncarnationOffset = 1 << 63
			b, _ := proto.Marshal(s)
			return importOp(b)
		}(), fault.ErrInvalidArgument},
		{"another usage unit", nil, func() *storagev1.ImportGroup {
			s := decodeSnap(t, raw)
			s.WriteUnitBytes = 1
			b, _ := proto.Marshal(s)
			return importOp(b)
		}(), fault.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newApplier(t)
			if tc.setUp != nil {
				tc.setUp(a)
			}
			before := stateOf(t, a.m)
			if _, refused := a.m.CheckImport(tc.op.GetBlake3()); (refused != nil) != (tc.want == fault.ErrGroupNotEmpty) {
				t.Fatalf("CheckImport refusal %v, want one only for a group that is not empty", refused)
			}
			r := a.applyCmd(1, cmdOf(t, tc.op))
			if code(r) != tc.want {
				t.Fatalf("import: %v, want %v", r.Err, tc.want)
			}
			if after := stateOf(t, a.m); !proto.Equal(before, after) {
				t.Fatal("a refused import changed the state")
			}
		})
	}
}

// TestImportGroupNeverPanics: imports of damaged snapshot bytes (random
// flips and cuts, the same on every run) either apply a state that
// validates and restores, or are refused and change nothing.
func TestImportGroupNeverPanics(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	rng := rand.New(rand.NewPCG(13, 13))
	for i := range 400 {
		bad := bytes.Clone(raw)
		switch i % 3 {
		case 0:
			for range 1 + rng.IntN(3) {
				bad[rng.IntN(len(bad))] ^= byte(1 + rng.IntN(255))
			}
		case 1:
			bad = bad[:rng.IntN(len(bad))]
		case 2:
			j := rng.IntN(len(bad))
			bad = append(bad[:j:j], append([]byte{byte(rng.IntN(256))}, bad[j:]...)...)
		}
		checkImportOf(t, bad)
	}
}

func FuzzImportGroup(f *testing.F) {
	raw, _ := variedGroup(f, nil).m.Snapshot()
	f.Add(raw)
	f.Add(raw[:len(raw)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) { checkImportOf(t, b) })
}

// checkImportOf imports b into an empty group: a refusal changes nothing,
// an import leaves a state that validates and restores byte for byte.
func checkImportOf(t *testing.T, b []byte) {
	t.Helper()
	a := newApplier(t)
	before := stateOf(t, a.m)
	r := a.applyCmd(1, cmdOf(t, importOp(b)))
	if r.Err != nil {
		if after := stateOf(t, a.m); !proto.Equal(before, after) {
			t.Fatalf("a refused import (%v) changed the state", r.Err)
		}
		return
	}
	out, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := backupfmt.ValidateSnapshot(decodeSnap(t, out)); err != nil {
		t.Fatalf("an accepted import left a state that does not validate: %v", err)
	}
	again := NewMachine(0)
	if err := again.Restore(out); err != nil {
		t.Fatal(err)
	}
	if round, _ := again.Snapshot(); !bytes.Equal(round, out) {
		t.Fatal("the imported state does not restore byte for byte")
	}
}

// TestImportGroupIncarnationOffset: after an import, a stream created or
// given a new history never takes an incarnation (token, cold prefix) the
// source issued, and the offset survives snapshots.
func TestImportGroupIncarnationOffset(t *testing.T) {
	src := newApplier(t)
	src.index = 1000
	srcIncs := map[uint64]bool{}
	for _, name := range []string{"a", "b", "c"} {
		srcIncs[src.do(1, &storagev1.CreateStream{Bucket: "b", Stream: name, ContentType: "text/plain", Body: []byte(name)}).Meta.Incarnation] = true
	}
	src.do(2, &storagev1.DeleteStream{Bucket: "b", Stream: "a"})
	raw, _ := src.m.Snapshot()
	dst := newApplier(t)
	dst.do(3, importOp(raw))
	importIndex := dst.index
	offset := snapOf(t, dst.m).GetIncarnationOffset()
	if offset != src.index {
		t.Fatalf("offset %d, want the source's applied index %d", offset, src.index)
	}
	r := dst.do(4, &storagev1.CreateStream{Bucket: "b", Stream: "a", ContentType: "text/plain"})
	if inc := r.Meta.Incarnation; inc != dst.index+offset || srcIncs[inc] || inc <= src.index {
		t.Fatalf("a stream created after the import took incarnation %d (source's: %v)", inc, srcIncs)
	}
	for inc := range srcIncs {
		if coldfmt.StreamPrefix("b", "a", inc) == coldfmt.StreamPrefix("b", "a", r.Meta.Incarnation) {
			t.Fatal("a new stream reuses a cold prefix of the source")
		}
	}
	h := dst.do(5, &storagev1.StartHistory{PlanTerm: 9, Reason: HistoryAcceptLoss})
	if m, _ := dst.m.Lookup(Key{"b", "b"}); m.Incarnation != h.Index+offset || m.Incarnation <= importIndex+offset {
		t.Fatalf("after a later history: incarnation %d, want %d", m.Incarnation, h.Index+offset)
	}
	out, _ := dst.m.Snapshot()
	restored := &applier{t: t, m: NewMachine(0), index: dst.index}
	if err := restored.m.Restore(out); err != nil {
		t.Fatal(err)
	}
	x := dst.do(6, &storagev1.CreateStream{Bucket: "b", Stream: "x", ContentType: "text/plain"})
	y := restored.do(6, &storagev1.CreateStream{Bucket: "b", Stream: "x", ContentType: "text/plain"})
	if x.Meta.Incarnation != y.Meta.Incarnation {
		t.Fatalf("after a restore the offset is lost: %d, want %d", y.Meta.Incarnation, x.Meta.Incarnation)
	}

	t.Run("a later accept-unsynced-loss plan still starts a history", func(t *testing.T) {
		// The restore's plan term (the group's latest, here 0 before the
		// import) stays below any plan's.
		a := newApplier(t)
		a.do(1, importOp(raw))
		if h, _ := a.m.History(); h.PlanTerm != 0 || h.Reason != HistoryRestore {
			t.Fatalf("restore event %+v", h)
		}
		if r := a.do(2, &storagev1.StartHistory{PlanTerm: 1, Reason: HistoryAcceptLoss}); r.EventIndex != a.index {
			t.Fatalf("a plan after the restore: event %d, want %d", r.EventIndex, a.index)
		}
		prev := newApplier(t)
		prev.do(1, &storagev1.StartHistory{PlanTerm: 7, Reason: HistoryAcceptLoss})
		prev.do(2, importOp(raw))
		h, _ := prev.m.History()
		if h.PlanTerm != 7 || h.Previous == nil || h.Previous.PlanTerm != 7 || h.Previous.Reason != HistoryAcceptLoss {
			t.Fatalf("a restore after a plan of term 7: %+v", h)
		}
		if r := prev.do(3, &storagev1.StartHistory{PlanTerm: 7, Reason: HistoryAcceptLoss}); r.EventIndex != h.EventIndex {
			t.Fatal("a late repeat of the plan before the restore started another history")
		}
	})
}

// TestImportGroupDeterministic: replicas applying the same commands,
// imports and holds included, reach the same bytes; a restore of the
// result encodes to the same bytes again.
func TestImportGroupDeterministic(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	if again, _ := variedGroup(t, nil).m.Snapshot(); !bytes.Equal(raw, again) {
		t.Fatal("the same commands built different states")
	}
	run := func() []byte {
		a := newApplier(t)
		a.do(1, &storagev1.HoldColdGC{Holder: "h", UntilMs: 10})
		a.do(2, importOp(raw))
		a.do(3, &storagev1.CreateStream{Bucket: "b", Stream: "after", ContentType: "text/plain", Body: []byte("z")})
		a.do(4, &storagev1.HoldColdGC{Holder: "h2", UntilMs: 1 << 40})
		out, err := a.m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	one, two := run(), run()
	if !bytes.Equal(one, two) {
		t.Fatal("two replicas diverged")
	}
	m := NewMachine(0)
	if err := m.Restore(one); err != nil {
		t.Fatal(err)
	}
	if back, _ := m.Snapshot(); !bytes.Equal(back, one) {
		t.Fatal("restore + snapshot changed the bytes")
	}
}

func TestHoldColdGC(t *testing.T) {
	a := newApplier(t)
	hold := func(now int64, holder string, until int64) *Result {
		t.Helper()
		return a.applyCmd(now, cmdOf(t, &storagev1.HoldColdGC{Holder: holder, UntilMs: until}))
	}
	if a.m.GCHeld(0) {
		t.Fatal("held without a hold")
	}
	hold(1000, "b1", 5000)
	for now, want := range map[int64]bool{1000: true, 4999: true, 5000: false, 9000: false} {
		if got := a.m.GCHeld(now); got != want {
			t.Fatalf("GCHeld(%d) = %v, want %v", now, got, want)
		}
	}
	hold(1000, "b2", 3000)
	hold(1000, "b1", 2000) // replaces
	if h := a.m.GCHolds(); len(h) != 2 || h["b1"] != 2000 || h["b2"] != 3000 {
		t.Fatalf("holds %v", h)
	}
	hold(1000, "b2", 0) // releases
	if h := a.m.GCHolds(); len(h) != 1 || h["b1"] != 2000 {
		t.Fatalf("holds after a release %v", h)
	}
	hold(2500, "b3", 9000) // b1 expired: dropped
	if h := a.m.GCHolds(); len(h) != 1 || h["b3"] != 9000 {
		t.Fatalf("holds after b1 expired %v", h)
	}
	raw, _ := a.m.Snapshot()
	m := NewMachine(0)
	if err := m.Restore(raw); err != nil {
		t.Fatal(err)
	}
	if !m.GCHeld(8999) || m.GCHeld(9000) {
		t.Fatal("a restore lost the hold")
	}
	for name, holder := range map[string]string{"unnamed": "", "too long": strings.Repeat("h", MaxHolderBytes+1)} {
		if r := hold(3000, holder, 9000); code(r) != fault.ErrInvalidArgument {
			t.Fatalf("%s holder: %v", name, r.Err)
		}
	}
	for i := range MaxGCHolds - 1 {
		if r := hold(3000, fmt.Sprint("h", i), 9000); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if r := hold(3000, "one more", 9000); code(r) != fault.ErrInvalidArgument {
		t.Fatalf("hold %d: %v", MaxGCHolds+1, r.Err)
	}
	if r := hold(3000, "b3", 9500); r.Err != nil {
		t.Fatalf("replacing a hold at the bound: %v", r.Err)
	}
}

// TestImportReplacesVacantStreams: a stream a node's own role created in
// a reserved bucket and never wrote (the subscription state of a fresh
// all-in-one node) does not make a group non-empty; one written does.
func TestImportReplacesVacantStreams(t *testing.T) {
	raw, _ := variedGroup(t, nil).m.Snapshot()
	a := newApplier(t)
	a.do(1, &storagev1.CreateStream{Bucket: "__system", Stream: "subscriptions", ContentType: "application/json", Json: true})
	if _, refused := a.m.CheckImport(backupfmt.Digest(raw)); refused != nil {
		t.Fatalf("a vacant reserved stream refuses the import: %v", refused)
	}
	a.do(2, importOp(raw))
	if _, ok := a.m.Lookup(Key{"__system", "subscriptions"}); ok {
		t.Fatal("the vacant stream outlived the import")
	}
	for name, op := range map[string]*storagev1.CreateStream{
		"written":            {Bucket: "__system", Stream: "subscriptions", ContentType: "application/json", Json: true, Body: []byte("{}\n")},
		"in a user's bucket": {Bucket: "b", Stream: "s", ContentType: "text/plain"},
	} {
		b := newApplier(t)
		b.do(1, op)
		if r := b.applyCmd(2, cmdOf(t, importOp(raw))); code(r) != fault.ErrGroupNotEmpty {
			t.Fatalf("%s: import %v, want GROUP_NOT_EMPTY", name, r.Err)
		}
	}
}
