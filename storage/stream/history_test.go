package stream

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

func startHistoryCmd(planTerm, point uint64) *storagev1.Command {
	return &storagev1.Command{Op: &storagev1.Command_StartHistory{StartHistory: &storagev1.StartHistory{
		PlanTerm: planTerm, Point: point, Reason: HistoryAcceptLoss,
	}}}
}

// startHistory applies a StartHistory and returns its result, failing the
// test on a refusal.
func (a *applier) startHistory(now int64, planTerm, point uint64) *Result {
	a.t.Helper()
	r := a.applyCmd(now, startHistoryCmd(planTerm, point))
	if r.Err != nil {
		a.t.Fatalf("StartHistory(plan term %d): %v", planTerm, r.Err)
	}
	return r
}

func lookup(t *testing.T, m *Machine, name string) Meta {
	t.Helper()
	meta, ok := m.Lookup(Key{"b", name})
	if !ok {
		t.Fatalf("stream %s not found", name)
	}
	return meta
}

// historyGroup builds the same group state on every call: three streams
// with producers, one of them soft-deleted behind a fork.
func historyGroup(t *testing.T) *applier {
	t.Helper()
	a := newApplier(t)
	for _, s := range []string{"x", "y"} {
		a.apply(10, &storagev1.CreateStream{Bucket: "b", Stream: s, ContentType: "text/plain"})
		for i := range 3 {
			if r := a.apply(11, &storagev1.Append{Bucket: "b", Stream: s, ContentType: "text/plain", Body: []byte("abc"),
				Producer: producer("p", 1, uint64(i))}); r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	gone := a.apply(12, &storagev1.CreateStream{Bucket: "b", Stream: "gone", ContentType: "text/plain", Body: []byte("0123")}).Meta.Incarnation
	a.apply(12, &storagev1.AddForkRef{Bucket: "b", Stream: "gone", Incarnation: gone, Position: 2})
	a.apply(12, &storagev1.CreateStream{Bucket: "b", Stream: "gone-fork", ContentType: "text/plain",
		Fork: &storagev1.ForkOrigin{SourceBucket: "b", SourceStream: "gone", SourceIncarnation: gone, Position: 2}})
	a.apply(13, &storagev1.DeleteStream{Bucket: "b", Stream: "gone", Incarnation: gone})
	return a
}

func TestStartHistoryGivesEveryStreamANewIncarnation(t *testing.T) {
	a := historyGroup(t)
	before := map[string]Meta{}
	for _, s := range []string{"x", "y", "gone", "gone-fork"} {
		before[s] = lookup(t, a.m, s)
	}
	if _, ok := a.m.History(); ok {
		t.Fatal("a group that never started a new history reports one")
	}
	point := a.index
	r := a.startHistory(20, 7, point)
	index := a.index
	if r.EventIndex != index {
		t.Fatalf("event index %d, want the entry's index %d", r.EventIndex, index)
	}
	for _, s := range []string{"x", "y", "gone-fork"} {
		m := lookup(t, a.m, s)
		switch {
		case m.Incarnation != index:
			t.Errorf("%s: incarnation %d, want the event's index %d", s, m.Incarnation, index)
		case m.PreviousIncarnation != before[s].Incarnation:
			t.Errorf("%s: previous incarnation %d, want %d", s, m.PreviousIncarnation, before[s].Incarnation)
		case m.InheritedOffset != before[s].Tail || m.Tail != before[s].Tail:
			t.Errorf("%s: inherited offset %d and tail %d, want the tail %d", s, m.InheritedOffset, m.Tail, before[s].Tail)
		case !m.SameStream(before[s]):
			t.Errorf("%s: the new history replaced the stream instead of keeping it", s)
		}
	}
	if m := lookup(t, a.m, "gone"); m.Incarnation != before["gone"].Incarnation || m.PreviousIncarnation != 0 {
		t.Errorf("a soft-deleted stream took a new history: incarnation %d (was %d), previous %d", m.Incarnation, before["gone"].Incarnation, m.PreviousIncarnation)
	}
	// The bytes are the same under the new incarnation.
	m := lookup(t, a.m, "x")
	if got, _, _, ok := a.m.ReadOwn(Key{"b", "x"}, m.Incarnation, 0, m.Tail, 0, nil); !ok || string(got) != "abcabcabc" {
		t.Fatalf("x reads %q (ok %v) under its new incarnation", got, ok)
	}
	if _, _, _, ok := a.m.ReadOwn(Key{"b", "x"}, before["x"].Incarnation, 0, m.Tail, 0, nil); ok {
		t.Fatal("x still reads under its old incarnation")
	}
	h, ok := a.m.History()
	if want := (HistoryInfo{EventIndex: index, PlanTerm: 7, Reason: HistoryAcceptLoss, AtMs: 20, Streams: 3, Point: point}); !ok || h != want {
		t.Fatalf("history %+v (%v), want %+v", h, ok, want)
	}
}

func TestStartHistoryIsDeterministic(t *testing.T) {
	var snaps [][]byte
	for range 2 {
		a := historyGroup(t)
		a.startHistory(20, 7, 3)
		a.apply(21, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("d"), Producer: producer("p", 2, 0)})
		snap, err := a.m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
	}
	if !bytes.Equal(snaps[0], snaps[1]) {
		t.Fatal("two replicas applying the same entries reached different states")
	}
}

func TestOldIncarnationAfterNewHistory(t *testing.T) {
	a := historyGroup(t)
	old := lookup(t, a.m, "x").Incarnation
	a.startHistory(20, 7, 3)
	cur := lookup(t, a.m, "x").Incarnation
	r := a.apply(21, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("d"), Incarnation: old})
	if code(r) != fault.ErrIncarnationMismatch || r.Err.Details[fault.DetailIncarnation] != strconv.FormatUint(cur, 10) {
		t.Fatalf("append naming the old token: %v, want INCARNATION_MISMATCH naming %d", r.Err, cur)
	}
	if r := a.apply(21, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("d"), Incarnation: cur}); r.Err != nil {
		t.Fatalf("append naming the new token: %v", r.Err)
	}
}

func TestNewHistoryClosesProducerEpochs(t *testing.T) {
	appendAs := func(a *applier, p *storagev1.ProducerRef) *Result {
		return a.apply(30, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("z"), Producer: p})
	}
	tests := []struct {
		name        string
		p           *storagev1.ProducerRef
		wantCode    *fault.Kind
		wantDup     bool
		wantOutcome string
		wantEpoch   string
		wantSeq     string
	}{
		{name: "retry of a kept seq is a duplicate", p: producer("p", 1, 2), wantDup: true},
		{name: "retry of an older kept seq is a duplicate", p: producer("p", 1, 0), wantDup: true},
		{name: "next seq of the closed epoch", p: producer("p", 1, 3), wantCode: fault.ErrProducerStaleEpoch,
			wantOutcome: fault.ProducerOutcomeClosedByHistory, wantEpoch: "1", wantSeq: "2"},
		{name: "a later seq of the closed epoch", p: producer("p", 1, 9), wantCode: fault.ErrProducerStaleEpoch,
			wantOutcome: fault.ProducerOutcomeClosedByHistory, wantEpoch: "1", wantSeq: "2"},
		{name: "an older epoch is stale as before", p: producer("p", 0, 0), wantCode: fault.ErrProducerStaleEpoch, wantEpoch: "1"},
		{name: "a new epoch must start at seq 0", p: producer("p", 2, 1), wantCode: fault.ErrProducerEpochSeq},
		{name: "a new epoch at seq 0 is claimed", p: producer("p", 2, 0)},
		{name: "a new producer writes", p: producer("q", 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := historyGroup(t)
			a.startHistory(20, 7, 3)
			r := appendAs(a, tt.p)
			if code(r) != tt.wantCode || r.Duplicate != tt.wantDup {
				t.Fatalf("got %v (duplicate %v), want %v (duplicate %v)", r.Err, r.Duplicate, tt.wantCode, tt.wantDup)
			}
			if r.Err != nil {
				d := r.Err.Details
				if d[fault.DetailProducerOutcome] != tt.wantOutcome || d[fault.DetailProducerEpoch] != tt.wantEpoch || d[fault.DetailProducerSeq] != tt.wantSeq {
					t.Fatalf("details %v, want outcome %q epoch %q seq %q", d, tt.wantOutcome, tt.wantEpoch, tt.wantSeq)
				}
				return
			}
			if tt.wantDup {
				return
			}
			// The producer that claimed a new epoch goes on as usual.
			next := producer(tt.p.GetId(), tt.p.GetEpoch(), tt.p.GetSeq()+1)
			if r := appendAs(a, next); r.Err != nil || r.Duplicate {
				t.Fatalf("next write in the new epoch: %v (duplicate %v)", r.Err, r.Duplicate)
			}
		})
	}
}

func TestNewHistoryWithoutWritesKeepsTheEarlierToken(t *testing.T) {
	a := historyGroup(t)
	first := lookup(t, a.m, "x")
	a.startHistory(20, 7, 3)
	second := lookup(t, a.m, "x")
	a.startHistory(21, 9, 30)
	m := lookup(t, a.m, "x")
	if m.Incarnation == second.Incarnation || m.PreviousIncarnation != first.Incarnation || m.InheritedOffset != first.Tail {
		t.Fatalf("unwritten since the first history: incarnation %d, previous %d at %d; want a new one, previous %d at %d",
			m.Incarnation, m.PreviousIncarnation, m.InheritedOffset, first.Incarnation, first.Tail)
	}
	a.apply(22, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("more")})
	third := lookup(t, a.m, "x")
	a.startHistory(23, 11, 40)
	m = lookup(t, a.m, "x")
	if m.PreviousIncarnation != third.Incarnation || m.InheritedOffset != third.Tail {
		t.Fatalf("written since: previous %d at %d, want %d at %d", m.PreviousIncarnation, m.InheritedOffset, third.Incarnation, third.Tail)
	}
	h, _ := a.m.History()
	if h.PlanTerm != 11 || h.Previous == nil || h.Previous.PlanTerm != 9 || h.Previous.Previous != nil {
		t.Fatalf("history %+v: want plan term 11 after 9, one level of previous", h)
	}
}

func TestStartHistoryRepeat(t *testing.T) {
	a := historyGroup(t)
	first := a.startHistory(20, 7, 3)
	snap, _ := a.m.Snapshot()
	repeat := a.startHistory(25, 7, 3)
	if repeat.EventIndex != first.EventIndex {
		t.Fatalf("repeat answered event index %d, want the recorded %d", repeat.EventIndex, first.EventIndex)
	}
	after, _ := a.m.Snapshot()
	// The applied index moves; nothing else does.
	var s1, s2 storagev1.Snapshot
	if err := proto.Unmarshal(snap, &s1); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(after, &s2); err != nil {
		t.Fatal(err)
	}
	s1.AppliedIndex, s2.AppliedIndex = 0, 0
	if !proto.Equal(&s1, &s2) {
		t.Fatal("a repeat of the recorded plan term changed the state")
	}
	r := a.applyCmd(26, startHistoryCmd(6, 3))
	if code(r) != fault.ErrInvalidArgument {
		t.Fatalf("a plan term below the recorded one: %v, want INVALID_ARGUMENT", r.Err)
	}
}

func TestNewHistorySnapshotRoundTrip(t *testing.T) {
	a := historyGroup(t)
	a.startHistory(20, 7, 3)
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b := &applier{t: t, m: NewMachine(0), index: a.index}
	if err := b.m.Restore(snap); err != nil {
		t.Fatal(err)
	}
	again, _ := b.m.Snapshot()
	if !bytes.Equal(snap, again) {
		t.Fatal("restore + snapshot changed the bytes")
	}
	ha, _ := a.m.History()
	if hb, ok := b.m.History(); !ok || hb != ha {
		t.Fatalf("restored history %+v (%v), want %+v", hb, ok, ha)
	}
	want, got := lookup(t, a.m, "x"), lookup(t, b.m, "x")
	if got.Incarnation != want.Incarnation || got.PreviousIncarnation != want.PreviousIncarnation || got.InheritedOffset != want.InheritedOffset {
		t.Fatalf("restored x: %d/%d/%d, want %d/%d/%d", got.Incarnation, got.PreviousIncarnation, got.InheritedOffset,
			want.Incarnation, want.PreviousIncarnation, want.InheritedOffset)
	}
	r := b.apply(30, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("z"), Producer: producer("p", 1, 3)})
	if r.Err.Details[fault.DetailProducerOutcome] != fault.ProducerOutcomeClosedByHistory {
		t.Fatalf("after a restore the closed epoch writes: %v", r.Err)
	}
}

// TestSnapshotFromBeforeHistories: a snapshot written before the history
// fields existed decodes as a group with no history, streams without a
// previous incarnation and producers whose epochs are open.
func TestSnapshotFromBeforeHistories(t *testing.T) {
	old := &storagev1.Snapshot{
		Format: snapshotFormat, AppliedIndex: 40, GcNextSeq: 1, Buckets: []string{"b"},
		Streams: []*storagev1.StreamState{{
			Bucket: "b", Stream: "x", Incarnation: 5, ContentType: "text/plain", Data: []byte("abcabc"), Records: []uint64{3, 6},
			Producers: []*storagev1.ProducerState{{Id: "p", Epoch: 1, Seq: 1, UpdatedMs: 10, RecordStart: 0, RecordNext: 0}},
		}},
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{t: t, m: NewMachine(0), index: 40}
	if err := a.m.Restore(data); err != nil {
		t.Fatal(err)
	}
	if h, ok := a.m.History(); ok {
		t.Fatalf("history %+v in a snapshot that has none", h)
	}
	if m := lookup(t, a.m, "x"); m.Incarnation != 5 || m.PreviousIncarnation != 0 || m.InheritedOffset != 0 || len(m.Earlier) != 0 {
		t.Fatalf("x: %+v", m)
	}
	if r := a.apply(30, &storagev1.Append{Bucket: "b", Stream: "x", ContentType: "text/plain", Body: []byte("z"), Producer: producer("p", 1, 2)}); r.Err != nil {
		t.Fatalf("the producer's next seq: %v", r.Err)
	}
	// And the state round-trips to the bytes an older build wrote, but for
	// what changed since.
	again, _ := a.m.Snapshot()
	var back storagev1.Snapshot
	if err := proto.Unmarshal(again, &back); err != nil {
		t.Fatal(err)
	}
	if back.GetHistory() != nil || back.GetStreams()[0].GetPreviousIncarnation() != 0 {
		t.Fatal("a group with no history writes history fields")
	}
}

func TestNewHistoryKeepsColdObjectsReachable(t *testing.T) {
	a := newApplier(t)
	k := Key{"b", "c"}
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "c", ContentType: "text/plain"}).Meta.Incarnation
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "c", ContentType: "text/plain", Body: []byte("before|")})
	if r := flushAll(t, a, "c", inc); r.Err != nil {
		t.Fatal(r.Err)
	}
	plain := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "plain", ContentType: "text/plain", Body: []byte("hot")}).Meta.Incarnation
	a.startHistory(2, 7, a.index)
	m := lookup(t, a.m, "c")
	if len(m.Earlier) != 1 || m.Earlier[0].GetIncarnation() != inc || m.Earlier[0].GetKept() != 7 {
		t.Fatalf("earlier incarnations %v, want %d kept to 7", m.Earlier, inc)
	}
	if p := lookup(t, a.m, "plain"); len(p.Earlier) != 0 {
		t.Fatalf("a stream nothing outside names keeps earlier incarnations %v", p.Earlier)
	}
	oldPrefix := coldfmt.StreamPrefix("b", "c", inc)
	newPrefix := coldfmt.StreamPrefix("b", "c", m.Incarnation)
	live := a.m.LivePrefixes()
	if live[oldPrefix] != k || live[newPrefix] != k {
		t.Fatalf("live prefixes %v: want both of c's", live)
	}
	if _, ok := a.m.CurrentPrefixes()[oldPrefix]; ok {
		t.Fatal("the old prefix is where new objects go")
	}
	if _, ok := live[coldfmt.StreamPrefix("b", "plain", plain)]; ok {
		t.Fatal("a prefix no object of the stream uses stays live")
	}
	// Bytes below the new history are read from the old objects, after it
	// from the hot window and then from a flush under the new incarnation.
	a.apply(3, &storagev1.Append{Bucket: "b", Stream: "c", ContentType: "text/plain", Body: []byte("after")})
	if _, _, ref, ok := a.m.ReadOwn(k, m.Incarnation, 0, 12, 0, nil); !ok || ref == nil || ref.GetEnd() != 7 {
		t.Fatalf("position 0 under the new incarnation: ref %v (ok %v), want the chunk flushed before", ref, ok)
	}
	if got, _, _, _ := a.m.ReadOwn(k, m.Incarnation, 7, 12, 0, nil); string(got) != "after" {
		t.Fatalf("hot bytes after the history: %q", got)
	}
	if r := flushAll(t, a, "c", m.Incarnation); r.Err != nil {
		t.Fatalf("flush under the new incarnation: %v", r.Err)
	}
	lv, _ := a.m.ColdLevels(k, m.Incarnation)
	if es := lv[0].GetEntries(); len(es) != 2 || es[0].GetEnd() != 7 || es[1].GetStart() != 7 {
		t.Fatalf("index after the second flush: %v", es)
	}
	// Removing the stream collects every prefix it used.
	gcBefore, _ := a.m.GCQueue(1 << 20)
	a.apply(4, &storagev1.DeleteStream{Bucket: "b", Stream: "c", Incarnation: m.Incarnation})
	q, _ := a.m.GCQueue(1 << 20)
	var prefixes []string
	for _, e := range q[len(gcBefore):] {
		if e.GetKind() == storagev1.GCKind_GC_KIND_PREFIX {
			prefixes = append(prefixes, e.GetKey())
		}
	}
	if !slices.Contains(prefixes, oldPrefix) || !slices.Contains(prefixes, newPrefix) {
		t.Fatalf("prefixes collected %v, want %s and %s", prefixes, oldPrefix, newPrefix)
	}
}

func TestNewHistoryKeepsForksOfEarlierIncarnations(t *testing.T) {
	a := newApplier(t)
	src := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "src", ContentType: "text/plain", Body: []byte("abcdef")}).Meta.Incarnation
	// The fork lives in another group: only its reference is here.
	a.apply(1, &storagev1.AddForkRef{Bucket: "b", Stream: "src", Incarnation: src, Position: 4})
	a.startHistory(2, 7, a.index)
	m := lookup(t, a.m, "src")
	if !m.HoldsHistory(src, 4) || !m.HoldsHistory(src, 6) || m.HoldsHistory(src, 7) || !m.LostHistory(src, 7) {
		t.Fatalf("source after the history (earlier %v): a fork of %d below 6 must read it, above must not", m.Earlier, src)
	}
	if m.HoldsHistory(src+1000, 1) || m.LostHistory(src+1000, 1) {
		t.Fatal("an incarnation the stream never had matches")
	}
	a.apply(3, &storagev1.DeleteStream{Bucket: "b", Stream: "src", Incarnation: m.Incarnation})
	if !lookup(t, a.m, "src").SoftDeleted {
		t.Fatal("a source with a fork must be soft-deleted")
	}
	// The fork's release names the incarnation it was made from.
	a.apply(4, &storagev1.ReleaseForkRef{Bucket: "b", Stream: "src", Incarnation: src})
	if _, ok := a.m.Lookup(Key{"b", "src"}); ok {
		t.Fatal("the release naming the earlier incarnation did not drop the last reference")
	}
}
