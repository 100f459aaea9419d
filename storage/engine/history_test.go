package engine

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// nameIn returns a stream name with prefix whose group is (in) or is not
// (!in) g.
func nameIn(tb testing.TB, e *testEngine, prefix string, g uint32, in bool) string {
	tb.Helper()
	for i := range 1000 {
		name := prefix + strconv.Itoa(i)
		if (e.GroupOf(key(name)) == g) == in {
			return name
		}
	}
	tb.Fatalf("no stream name with prefix %s fits", prefix)
	return ""
}

func head(tb testing.TB, e *testEngine, name string) *streamv1.StreamInfo {
	tb.Helper()
	resp, err := e.Head(tb.Context(), &streamv1.HeadRequest{Ref: ref(name)})
	if err != nil {
		tb.Fatalf("Head %s: %v", name, err)
	}
	return resp.GetInfo()
}

func produce(tb testing.TB, e *testEngine, name string, epoch, seq uint64, body string) (*streamv1.AppendResponse, error) {
	tb.Helper()
	return e.Append(tb.Context(), &streamv1.AppendRequest{Ref: ref(name), ContentType: "text/plain", Body: []byte(body),
		Producer: &streamv1.Producer{Id: "p", Epoch: epoch, Seq: seq}})
}

func TestStartHistory(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("x"), ContentType: "text/plain"})
	for seq := range uint64(3) {
		if _, err := produce(t, e, "x", 1, seq, "abc"); err != nil {
			t.Fatal(err)
		}
	}
	g := e.GroupOf(key("x"))
	other := nameIn(t, e, "other", g, false)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(other), ContentType: "text/plain", HasBody: true, Body: []byte("o")})
	if in := head(t, e, "x"); in.GetPreviousIncarnation() != 0 || in.GetInheritedOffset() != "" {
		t.Fatalf("HEAD before any new history: %v", in)
	}
	if _, ok := e.History(g); ok {
		t.Fatal("history reported before any event")
	}
	old, oldOther := head(t, e, "x").GetIncarnation(), head(t, e, other).GetIncarnation()
	point := e.status(g).Applied

	index, err := e.StartHistory(t.Context(), g, 5, point, stream.HistoryAcceptLoss)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := e.History(g)
	if !ok || h.EventIndex != index || h.PlanTerm != 5 || h.Point != point || h.Reason != stream.HistoryAcceptLoss || h.Streams != 1 {
		t.Fatalf("history %+v (%v), want event %d of plan term 5 at point %d over 1 stream", h, ok, index, point)
	}
	check := func(t *testing.T, e *testEngine) {
		t.Helper()
		in := head(t, e, "x")
		if in.GetIncarnation() != index || in.GetPreviousIncarnation() != old || in.GetInheritedOffset() != off(9) || in.GetNextOffset() != off(9) {
			t.Fatalf("HEAD after the new history: %v; want incarnation %d, previous %d, inherited %s", in, index, old, off(9))
		}
		if got := head(t, e, other).GetIncarnation(); got != oldOther {
			t.Fatalf("a stream of another group changed incarnation: %d → %d", oldOther, got)
		}
		if got := readAll(t, e, "x"); got != "abcabcabc" {
			t.Fatalf("x reads %q", got)
		}
	}
	check(t, e)

	t.Run("the old token answers 412 with the new one", func(t *testing.T) {
		ops := map[string]func() error{
			"head": func() error {
				_, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("x"), Incarnation: old})
				return err
			},
			"read": func() error {
				_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("x"), Offset: stream.OffsetStart, Incarnation: old})
				return err
			},
			"append": func() error {
				_, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("x"), ContentType: "text/plain", Body: []byte("no"), Incarnation: old})
				return err
			},
		}
		for name, op := range ops {
			err := op()
			wantCode(t, name, err, fault.ErrIncarnationMismatch)
			if got := fault.Detail(err, fault.DetailIncarnation); got != strconv.FormatUint(index, 10) {
				t.Fatalf("%s: 412 names %q, want the new token %d", name, got, index)
			}
		}
	})

	t.Run("producer epochs claimed before are closed", func(t *testing.T) {
		dup, err := produce(t, e, "x", 1, 2, "abc")
		if err != nil || !dup.GetDuplicate() {
			t.Fatalf("retry of the last kept seq: %v (duplicate %v), want a duplicate", err, dup.GetDuplicate())
		}
		_, err = produce(t, e, "x", 1, 3, "def")
		wantCode(t, "next write of the closed epoch", err, fault.ErrProducerStaleEpoch)
		for k, want := range map[string]string{fault.DetailProducerOutcome: fault.ProducerOutcomeClosedByHistory, fault.DetailProducerEpoch: "1", fault.DetailProducerSeq: "2"} {
			if got := fault.Detail(err, k); got != want {
				t.Fatalf("%s = %q, want %q", k, got, want)
			}
		}
		if _, err := produce(t, e, "x", 2, 0, "def"); err != nil {
			t.Fatalf("claiming a new epoch: %v", err)
		}
		if _, err := produce(t, e, "x", 2, 1, "ghi"); err != nil {
			t.Fatalf("the new epoch's next write: %v", err)
		}
	})

	t.Run("a repeat of the plan term starts no second history", func(t *testing.T) {
		before := head(t, e, "x")
		again, err := e.StartHistory(t.Context(), g, 5, point, stream.HistoryAcceptLoss)
		if err != nil || again != index {
			t.Fatalf("repeat: %d, %v; want the recorded event %d", again, err, index)
		}
		if after := head(t, e, "x"); !proto.Equal(before, after) {
			t.Fatalf("a repeat changed the stream: %v → %v", before, after)
		}
		_, err = e.StartHistory(t.Context(), g, 4, point, stream.HistoryAcceptLoss)
		wantCode(t, "a plan term below the history's", err, fault.ErrInvalidArgument)
	})

	t.Run("refused requests", func(t *testing.T) {
		_, err := e.StartHistory(t.Context(), g, 9, point, "because")
		wantCode(t, "unknown reason", err, fault.ErrInvalidArgument)
		_, err = e.StartHistory(t.Context(), uint32(e.GroupCount()), 9, point, stream.HistoryRestore)
		wantCode(t, "group out of range", err, fault.ErrInvalidArgument)
	})

	t.Run("survives a restart from a snapshot", func(t *testing.T) {
		// The restart replays the group from a Raft snapshot (the state
		// machine's encoding), its log purged below it.
		snap, err := e.node.Cluster.Snapshot(t.Context(), g, 5*time.Second)
		if err != nil || snap < index {
			t.Fatalf("snapshot of group %d: %d, %v; want one at or above the event %d", g, snap, err, index)
		}
		if _, err := e.node.Cluster.PurgeLog(t.Context(), g, snap, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		e2 := restart(t, e, nil)
		if got, ok := e2.History(g); !ok || got != h {
			t.Fatalf("history after a restart %+v (%v), want %+v", got, ok, h)
		}
		in := head(t, e2, "x")
		if in.GetIncarnation() != index || in.GetPreviousIncarnation() != old || in.GetInheritedOffset() != off(9) {
			t.Fatalf("HEAD after a restart: %v", in)
		}
		if got := readAll(t, e2, "x"); got != "abcabcabcdefghi" {
			t.Fatalf("x reads %q after a restart", got)
		}
	})
}

// TestStartHistoryWakesWaits: a long poll waiting when the history starts
// goes on under the new incarnation, one pinned to the old token answers
// 412, and a subscription ends with 412.
func TestStartHistoryWakesWaits(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("w"), ContentType: "text/plain", HasBody: true, Body: []byte("abc")})
	old := head(t, e, "w").GetIncarnation()
	type result struct {
		resp *streamv1.ReadResponse
		err  error
	}
	unpinned, pinned, sub := make(chan result, 1), make(chan result, 1), make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("w"), Offset: off(3), WaitMs: 60_000, NoTouch: true})
		unpinned <- result{resp, err}
	}()
	go func() {
		resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("w"), Offset: off(3), WaitMs: 60_000, NoTouch: true, Incarnation: old})
		pinned <- result{resp, err}
	}()
	go func() {
		once := false
		sub <- e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("w"), Offset: off(3)}, func(*streamv1.ReadResponse) error {
			if !once { // the announcement of the tail: the subscription follows the old incarnation
				once = true
				close(subscribed)
			}
			return nil
		})
	}()
	<-subscribed
	index, err := e.StartHistory(t.Context(), e.GroupOf(key("w")), 3, 0, stream.HistoryRestore)
	if err != nil {
		t.Fatal(err)
	}
	r := <-pinned
	wantCode(t, "long poll pinned to the old token", r.err, fault.ErrIncarnationMismatch)
	wantCode(t, "subscription", <-sub, fault.ErrIncarnationMismatch)
	mustAppend(t, e, "w", "text/plain", "d")
	r = <-unpinned
	if r.err != nil || string(r.resp.GetData()) != "d" || r.resp.GetIncarnation() != index {
		t.Fatalf("unpinned long poll: %v, %v; want \"d\" under incarnation %d", r.resp, r.err, index)
	}
}

// TestStartHistoryCold: bytes flushed under the old incarnation stay
// readable, new ones go under the new incarnation's prefix, a fork of the
// old incarnation keeps reading its source, and a compaction across both
// incarnations' chunks writes under the new prefix.
func TestStartHistoryCold(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("c"), ContentType: "application/octet-stream"})
	var want strings.Builder
	for i := range 150 {
		s := fmt.Sprintf("before-%03d;", i)
		mustAppend(t, e, "c", "application/octet-stream", s)
		want.WriteString(s)
	}
	waitFlushed(t, e, "c")
	g := e.GroupOf(key("c"))
	fork := nameIn(t, e, "fork", g, false) // its group keeps its history
	mustCreate(t, e, forkReq(fork, "c", off(44), 0))
	mustAppend(t, e, fork, "application/octet-stream", "+fork")
	old := mustLookup(t, e, "c")
	oldPrefix := coldfmt.StreamPrefix(testBucket, "c", old.Incarnation)

	if _, err := e.StartHistory(t.Context(), g, 2, e.status(g).Applied, stream.HistoryAcceptLoss); err != nil {
		t.Fatal(err)
	}
	cur := mustLookup(t, e, "c")
	newPrefix := coldfmt.StreamPrefix(testBucket, "c", cur.Incarnation)
	if cur.Incarnation == old.Incarnation || len(cur.Earlier) != 1 || cur.Earlier[0].GetIncarnation() != old.Incarnation {
		t.Fatalf("after the new history: incarnation %d (was %d), earlier %v", cur.Incarnation, old.Incarnation, cur.Earlier)
	}
	for i := range 150 {
		s := fmt.Sprintf("after-%03d;", i)
		mustAppend(t, e, "c", "application/octet-stream", s)
		want.WriteString(s)
	}
	waitFlushed(t, e, "c")

	// The index holds objects of both prefixes, and the orphan sweep sees
	// both as live, with the stream's references.
	keys, live, err := e.node.Cold.ColdReferences(t.Context(), oldPrefix)
	if err != nil || !live {
		t.Fatalf("references under the old prefix: live %v, %v", live, err)
	}
	var underOld, underNew int
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, oldPrefix):
			underOld++
		case strings.HasPrefix(k, newPrefix):
			underNew++
		}
	}
	if underOld == 0 || underNew == 0 {
		t.Fatalf("the index references %d objects under the old prefix and %d under the new one, want both", underOld, underNew)
	}
	if lp, err := e.node.Cold.LivePrefixes(t.Context()); err != nil || !lp[oldPrefix] || !lp[newPrefix] {
		t.Fatal("both prefixes of the stream must be live for the orphan sweep")
	}

	check := func(t *testing.T, e *testEngine) {
		t.Helper()
		for _, limit := range []uint64{0, 13, 1000} {
			if got := readPaged(t, e, "c", limit); got != want.String() {
				t.Fatalf("c with limit %d: %d bytes, want %d", limit, len(got), want.Len())
			}
		}
		if got := readAll(t, e, fork); got != want.String()[:44]+"+fork" {
			t.Fatalf("the fork of the old incarnation reads %q", got)
		}
	}
	check(t, e)

	t.Run("compaction across incarnations", func(t *testing.T) {
		cands, err := e.node.Cold.CompactionCandidates(t.Context(), g, 1<<20, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var run []*storagev1.ColdRef
		for _, c := range cands {
			if c.Key == key("c") {
				run = c.Run
			}
		}
		if len(run) < 2 {
			t.Fatalf("no compaction candidate for c: %v", cands)
		}
		var segments [][]byte
		var records []uint64
		for _, r := range run {
			body, err := store.Get(t.Context(), r.GetKey())
			if err != nil {
				t.Fatal(err)
			}
			data, recs, err := coldfmt.DecodeChunk(r.GetStart(), r.GetEnd()-r.GetStart(), body, r.GetCrc32C())
			if err != nil {
				t.Fatal(err)
			}
			segments, records = append(segments, data), append(records, recs...)
		}
		start, end := run[0].GetStart(), run[len(run)-1].GetEnd()
		body, crc := coldfmt.EncodeChunk(start, segments, records)
		swap := func(prefix string) *storagev1.ColdSwap {
			return &storagev1.ColdSwap{Bucket: testBucket, Stream: "c", Incarnation: cur.Incarnation, Replaced: run,
				Chunk: &storagev1.ColdRef{Start: start, End: end, Key: coldfmt.ChunkKey(prefix, start, end), Kind: storagev1.ColdKind_COLD_KIND_CHUNK,
					Size: uint64(len(body)), Records: uint32(len(records)), FirstRecord: run[0].GetFirstRecord(), NextRecord: run[len(run)-1].GetNextRecord(), Crc32C: crc}}
		}
		err = e.node.Cold.CommitCompaction(t.Context(), g, swap(oldPrefix))
		wantCode(t, "a compacted chunk under the earlier incarnation's prefix", err, fault.ErrInvalidArgument)
		sw := swap(newPrefix)
		if err := store.Put(t.Context(), sw.GetChunk().GetKey(), body); err != nil {
			t.Fatal(err)
		}
		if err := e.node.Cold.CommitCompaction(t.Context(), g, sw); err != nil {
			t.Fatalf("compaction under the new prefix: %v", err)
		}
		check(t, e)
	})

	t.Run("after a restart", func(t *testing.T) {
		e.stop(t)
		e2 := openEngine(t, cfg, Deps{ColdStore: store})
		e2.run(t)
		e2.waitReady(t)
		check(t, e2)
		if m := mustLookup(t, e2, "c"); m.Incarnation != cur.Incarnation || len(m.Earlier) != 1 {
			t.Fatalf("after a restart: incarnation %d, earlier %v", m.Incarnation, m.Earlier)
		}
	})
}

// TestStartHistoryCluster: the event is proposed on the group's leader
// only, and every replica applies the same new incarnations.
func TestStartHistoryCluster(t *testing.T) {
	c := startCluster(t, 3)
	lead0 := c.waitLeader(t, bucketGroup)
	if _, err := c.engines[lead0].CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		t.Fatal(err)
	}
	name := c.streamWhere(t, "h", func(uint32, uint64) bool { return true })
	g := c.engines[1].GroupOf(key(name))
	lead := c.leaderOf(g)
	le := c.engines[lead]
	await.True(t, "the bucket on the stream's leader", func() bool { return le.node.machines[bucketGroup].HasBucket(testBucket) })
	mustCreate(t, le, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "text/plain", HasBody: true, Body: []byte("abcd")})
	old := mustLookup(t, le, name).Incarnation
	for id, fe := range c.engines {
		if id == lead {
			continue
		}
		_, err := fe.StartHistory(t.Context(), g, 4, 0, stream.HistoryAcceptLoss)
		wantCode(t, fmt.Sprintf("StartHistory on follower %d", id), err, fault.ErrNotLeader)
	}
	index, err := le.StartHistory(t.Context(), g, 4, le.status(g).Applied, stream.HistoryAcceptLoss)
	if err != nil {
		t.Fatal(err)
	}
	want := mustLookup(t, le, name)
	if want.Incarnation == old || want.PreviousIncarnation != old || want.InheritedOffset != 4 {
		t.Fatalf("leader after the event: %+v", want)
	}
	for id, e := range c.engines {
		if err := e.node.Cluster.WaitApplied(t.Context(), g, index); err != nil {
			t.Fatalf("node %d: %v", id, err)
		}
		m := mustLookup(t, e, name)
		if m.Incarnation != want.Incarnation || m.PreviousIncarnation != want.PreviousIncarnation || m.InheritedOffset != want.InheritedOffset {
			t.Errorf("node %d: incarnation %d, previous %d at %d; the leader has %d, %d at %d", id,
				m.Incarnation, m.PreviousIncarnation, m.InheritedOffset, want.Incarnation, want.PreviousIncarnation, want.InheritedOffset)
		}
		if h, ok := e.History(g); !ok || h.EventIndex != index || h.PlanTerm != 4 {
			t.Errorf("node %d: history %+v (%v), want event %d", id, h, ok, index)
		}
	}
}
