package engine

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// streamView is what a client sees of a stream: every byte from the
// start, its HEAD, and its last JSON records.
type streamView struct {
	data    string
	info    *streamv1.StreamInfo
	records *streamv1.ReadResponse
}

func viewOf(tb testing.TB, e *testEngine, name string) streamView {
	tb.Helper()
	v, err := tryView(tb, e, name)
	if err != nil {
		tb.Fatalf("view of %s: %v", name, err)
	}
	return v
}

func tryView(tb testing.TB, e *testEngine, name string) (streamView, error) {
	var v streamView
	var err error
	if v.data, err = readFrom(tb, e, name, 0); err != nil {
		return v, err
	}
	if small, err := readFrom(tb, e, name, 7); err != nil || small != v.data {
		return v, fmt.Errorf("%s reads differently in small pieces (%v)", name, err)
	}
	h, err := e.Head(tb.Context(), &streamv1.HeadRequest{Ref: ref(name)})
	if err != nil {
		return v, err
	}
	v.info = h.GetInfo()
	if v.info.GetRecordNext() > 0 {
		if v.records, err = e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref(name), TailRecords: 2, NoTouch: true}); err != nil {
			return v, err
		}
	}
	return v, nil
}

// readFrom reads a stream from the start, limit bytes a read at most.
func readFrom(tb testing.TB, e *testEngine, name string, limit uint64) (string, error) {
	var out bytes.Buffer
	offset := stream.OffsetStart
	for range 100000 {
		resp, err := e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: offset, MaxBytes: limit, NoTouch: true})
		if err != nil {
			return "", err
		}
		out.Write(resp.GetData())
		if resp.GetUpToDate() {
			return out.String(), nil
		}
		offset = resp.GetNextOffset()
	}
	return "", fmt.Errorf("the read of %s does not end", name)
}

// onLeader runs op on group g's leader, again while leadership moves
// (NOT_LEADER, or UNAVAILABLE, both answered before anything was
// proposed): the balancer may move a leadership at any time.
func (c *memCluster) onLeader(tb testing.TB, g uint32, what string, op func(e *testEngine) error) {
	tb.Helper()
	var last error
	await.True(tb, what, func() bool {
		lead := c.leaderOf(g)
		if lead == 0 {
			return false
		}
		last = op(c.engines[lead])
		k := fault.KindOf(last)
		return last == nil || (k != fault.ErrNotLeader && k != fault.ErrUnavailable)
	})
	if last != nil {
		tb.Fatalf("%s: %v", what, last)
	}
}

// sameView compares a restored stream's view with the source's: the same
// bytes, offsets, records and state; a new incarnation that names the
// source's as the previous one, with the tail it kept.
func sameView(tb testing.TB, name string, src, got streamView) {
	tb.Helper()
	if got.data != src.data {
		tb.Fatalf("%s: %d bytes read back, want the source's %d", name, len(got.data), len(src.data))
	}
	si, gi := proto.CloneOf(src.info), proto.CloneOf(got.info)
	if gi.GetIncarnation() <= si.GetIncarnation() || gi.GetPreviousIncarnation() != si.GetIncarnation() || gi.GetInheritedOffset() != si.GetNextOffset() {
		tb.Fatalf("%s: HEAD after the restore has incarnation %d, previous %d, inherited %s; the source had %d at %s",
			name, gi.GetIncarnation(), gi.GetPreviousIncarnation(), gi.GetInheritedOffset(), si.GetIncarnation(), si.GetNextOffset())
	}
	for _, i := range []*streamv1.StreamInfo{si, gi} {
		i.Incarnation, i.PreviousIncarnation, i.InheritedOffset, i.ClusterId = 0, 0, "", ""
	}
	if !proto.Equal(si, gi) {
		tb.Fatalf("%s: HEAD after the restore\n%v\nwant\n%v", name, gi, si)
	}
	if (src.records == nil) != (got.records == nil) || (src.records != nil && (!bytes.Equal(src.records.GetData(), got.records.GetData()) ||
		src.records.GetRecordFirst() != got.records.GetRecordFirst() || src.records.GetStartOffset() != got.records.GetStartOffset() || src.records.GetRecordNext() != got.records.GetRecordNext())) {
		tb.Fatalf("%s: the last records read back as %v, want %v", name, got.records, src.records)
	}
}

// exportAll exports every group of e at or above minApplied.
func exportAll(tb testing.TB, e *testEngine, minApplied map[uint32]uint64) map[uint32]ExportedGroup {
	tb.Helper()
	out := map[uint32]ExportedGroup{}
	for g := range uint32(e.GroupCount()) {
		ex, err := e.ExportGroup(tb.Context(), g, minApplied[g])
		if err != nil {
			tb.Fatalf("export group %d: %v", g, err)
		}
		if ex.AppliedIndex < minApplied[g] || ex.CommitIndex < ex.AppliedIndex {
			tb.Fatalf("export of group %d at applied %d commit %d, asked for %d", g, ex.AppliedIndex, ex.CommitIndex, minApplied[g])
		}
		var snap storagev1.Snapshot
		if err := proto.Unmarshal(ex.Snapshot, &snap); err != nil {
			tb.Fatal(err)
		}
		if err := backupfmt.ValidateSnapshot(&snap); err != nil {
			tb.Fatalf("export of group %d does not validate: %v", g, err)
		}
		if snap.GetAppliedIndex() != ex.AppliedIndex {
			tb.Fatalf("export of group %d reports applied %d, its snapshot holds %d", g, ex.AppliedIndex, snap.GetAppliedIndex())
		}
		out[g] = ex
	}
	return out
}

// TestBackupRestoreSingleNode: a node's groups exported under a GC hold
// and imported into a fresh node over the same cold store read back byte
// for byte, with new incarnations naming the old ones, closed producer
// epochs, and everything else as it was.
func TestBackupRestoreSingleNode(t *testing.T) {
	store := objstore.NewMemory()
	src := startColdEngine(t, coldTestConfig(t.TempDir()), store)
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("plain"), ContentType: "text/plain"})
	for seq := range uint64(3) {
		if _, err := produce(t, src, "plain", 1, seq, fmt.Sprintf("abc-%d;", seq)); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	for i := range 120 {
		mustAppend(t, src, "js", "application/json", fmt.Sprintf(`[{"i":%d},{"s":"%s"}]`, i, strings.Repeat("y", i%17)))
	}
	waitFlushed(t, src, "js")
	for i := range 3 {
		mustAppend(t, src, "js", "application/json", fmt.Sprintf(`{"hot":%d}`, i))
	}
	first, err := src.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), Record: proto.Uint64(0), MaxRecords: 7, NoTouch: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := putSnap(t, src, "js", first.GetNextOffset(), "application/x", "state", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := src.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("js"), Offset: first.GetNextOffset()}); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, src, "js", "application/json", `{"after":"retention"}`)
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("closed"), ContentType: "text/plain", HasBody: true, Body: []byte("done"), Closed: true})
	ttl := uint64(3600)
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("ttl"), ContentType: "text/plain", TtlSeconds: &ttl, HasBody: true, Body: []byte("t")})
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("big"), ContentType: "application/octet-stream"})
	mustAppend(t, src, "big", "application/octet-stream", strings.Repeat("E", 5<<10)) // an external payload
	mustAppend(t, src, "big", "application/octet-stream", "small")
	if _, err := src.SetAttrs(t.Context(), &streamv1.SetAttrsRequest{Ref: ref("plain"), Attrs: &streamv1.StreamAttrs{Title: "plain one", Metadata: []byte(`{"k":1}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.PutSnapshot(t.Context(), &streamv1.PutSnapshotRequest{Ref: ref("plain"), Offset: head(t, src, "plain").GetNextOffset(), ContentType: "application/x", Body: []byte("state")}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, src, forkReq("fork", "plain", off(6), 0))
	mustAppend(t, src, "fork", "text/plain", "+fork")
	names := []string{"plain", "js", "closed", "ttl", "big", "fork"}
	want := map[string]streamView{}
	for _, n := range names {
		want[n] = viewOf(t, src, n)
	}

	holds := map[uint32]uint64{}
	for g := range uint32(src.GroupCount()) {
		index, err := src.HoldColdGC(t.Context(), g, "backup-1", time.Hour)
		if err != nil {
			t.Fatalf("hold group %d: %v", g, err)
		}
		holds[g] = index
	}
	exports := exportAll(t, src, holds)

	dst := openEngine(t, coldTestConfig(t.TempDir()), Deps{ColdStore: store})
	dst.run(t)
	dst.waitReady(t)
	imported := map[uint32]uint64{}
	for g, ex := range exports {
		res, err := dst.ImportGroup(t.Context(), g, ex.Snapshot, backupfmt.Digest(ex.Snapshot))
		if err != nil {
			t.Fatalf("import group %d: %v", g, err)
		}
		if res.Already || res.Index == 0 {
			t.Fatalf("import group %d: %+v", g, res)
		}
		imported[g] = res.Index
	}
	for _, n := range names {
		sameView(t, n, want[n], viewOf(t, dst, n))
	}

	t.Run("a repeat is already applied", func(t *testing.T) {
		for g, ex := range exports {
			res, err := dst.ImportGroup(t.Context(), g, ex.Snapshot, backupfmt.Digest(ex.Snapshot))
			if err != nil || !res.Already || res.Index != imported[g] {
				t.Fatalf("repeat of group %d: %+v, %v; want already at %d", g, res, err, imported[g])
			}
		}
	})

	t.Run("another object into a restored or non-empty group", func(t *testing.T) {
		g := src.GroupOf(key("plain"))
		other := exports[(g+1)%uint32(src.GroupCount())].Snapshot
		_, err := dst.ImportGroup(t.Context(), g, other, backupfmt.Digest(other))
		wantCode(t, "a second import", err, fault.ErrGroupNotEmpty)
		_, err = src.ImportGroup(t.Context(), bucketGroup, exports[bucketGroup].Snapshot, backupfmt.Digest(exports[bucketGroup].Snapshot))
		wantCode(t, "an import into the source's group 0", err, fault.ErrGroupNotEmpty)
	})

	t.Run("producer epochs are closed by the restore", func(t *testing.T) {
		dup, err := produce(t, dst, "plain", 1, 2, "abc-2;")
		if err != nil || !dup.GetDuplicate() {
			t.Fatalf("a retry of the last seq: %v, %v", dup, err)
		}
		_, err = produce(t, dst, "plain", 1, 3, "abc-3;")
		wantCode(t, "a new write of the closed epoch", err, fault.ErrProducerStaleEpoch)
		if fault.Detail(err, fault.DetailProducerOutcome) != fault.ProducerOutcomeClosedByHistory || fault.Detail(err, fault.DetailProducerSeq) != "2" {
			t.Fatalf("refusal %v, want epoch-closed;by=history with seq 2", err)
		}
		if _, err := produce(t, dst, "plain", 2, 0, "new;"); err != nil {
			t.Fatalf("a new epoch: %v", err)
		}
	})

	t.Run("attributes, snapshots and history", func(t *testing.T) {
		a, err := dst.GetAttrs(t.Context(), &streamv1.GetAttrsRequest{Ref: ref("plain")})
		if err != nil || a.GetAttrs().GetTitle() != "plain one" || string(a.GetAttrs().GetMetadata()) != `{"k":1}` {
			t.Fatalf("attrs %v, %v", a, err)
		}
		s, err := dst.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("plain"), Offset: want["plain"].info.GetSnapshotOffset()})
		if err != nil || string(s.GetBody()) != "state" {
			t.Fatalf("snapshot %v, %v", s, err)
		}
		g := dst.GroupOf(key("js"))
		h, ok := dst.History(g)
		if !ok || h.Reason != stream.HistoryRestore || h.EventIndex != imported[g] || h.Point != exports[g].AppliedIndex {
			t.Fatalf("history %+v", h)
		}
		info, ok := dst.Imported(g)
		if !ok || info.Index != imported[g] || info.SourceAppliedIndex != exports[g].AppliedIndex || info.Blake3 != backupfmt.Digest(exports[g].Snapshot) {
			t.Fatalf("import record %+v", info)
		}
	})

	t.Run("writes go on under the new incarnations", func(t *testing.T) {
		mustAppend(t, dst, "js", "application/json", `{"restored":true}`)
		m := mustLookup(t, dst, "js")
		waitFlushed(t, dst, "js")
		if got := readPaged(t, dst, "js", 0); got != want["js"].data+`{"restored":true}`+"\n" {
			t.Fatalf("js after a write: %q", got[max(0, len(got)-60):])
		}
		prefix := coldfmt.StreamPrefix(testBucket, "js", m.Incarnation)
		live, err := dst.node.Cold.LivePrefixes(t.Context())
		wantCode(t, "the orphan sweep while the restore's copy is held", err, nil)
		if !live[prefix] || !live[coldfmt.StreamPrefix(testBucket, "js", want["js"].info.GetIncarnation())] {
			t.Fatal("the new and the source's prefixes of js must be live")
		}
	})
}

// TestHoldColdGC: a hold keeps the group's GC queue from being handed out
// and the orphan sweep from running, until it expires or is released.
func TestHoldColdGC(t *testing.T) {
	clock := newFakeClock(time.Now())
	store := objstore.NewMemory()
	e := openEngine(t, coldTestConfig(t.TempDir()), Deps{ColdStore: store, Now: clock.Now})
	e.run(t)
	e.waitReady(t)
	if _, err := e.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("h"), ContentType: "text/plain", HasBody: true, Body: []byte("held bytes")})
	g := e.GroupOf(key("h"))
	for _, tc := range []struct {
		name   string
		g      uint32
		holder string
		ttl    time.Duration
	}{
		{"no holder", g, "", time.Minute},
		{"a holder with a control character", g, "a\nb", time.Minute},
		{"a negative ttl", g, "b", -time.Second},
		{"too long", g, "b", MaxGCHoldTTL + time.Second},
		{"no such group", uint32(e.GroupCount()), "b", time.Minute},
	} {
		_, err := e.HoldColdGC(t.Context(), tc.g, tc.holder, tc.ttl)
		wantCode(t, tc.name, err, fault.ErrInvalidArgument)
	}
	index, err := e.HoldColdGC(t.Context(), g, "backup-1", 10*time.Minute)
	if err != nil || index == 0 {
		t.Fatalf("hold: %d, %v", index, err)
	}
	if !e.GCHeld(g) || e.GCHeld((g+1)%uint32(e.GroupCount())) {
		t.Fatal("the hold must hold its group only")
	}
	if _, err := e.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: ref("h")}); err != nil {
		t.Fatal(err)
	}
	q, n, held, err := e.node.Cold.GCQueue(t.Context(), g, 100)
	if err != nil || !held || len(q) != 0 || n == 0 {
		t.Fatalf("GC queue while held: %d of %d entries, held %v, %v", len(q), n, held, err)
	}
	_, err = e.node.Cold.LivePrefixes(t.Context())
	wantCode(t, "live prefixes while held", err, fault.ErrColdGCHeld)
	_, _, err = e.node.Cold.ColdReferences(t.Context(), "b/x/1/")
	wantCode(t, "cold references while held", err, fault.ErrColdGCHeld)

	clock.Advance(11 * time.Minute)
	if q, _, held, err := e.node.Cold.GCQueue(t.Context(), g, 100); err != nil || held || len(q) == 0 {
		t.Fatalf("GC queue after the hold expired: %d entries, held %v, %v", len(q), held, err)
	}
	if _, err := e.node.Cold.LivePrefixes(t.Context()); err != nil {
		t.Fatalf("live prefixes after the hold expired: %v", err)
	}

	if _, err := e.HoldColdGC(t.Context(), g, "backup-2", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := e.HoldColdGC(t.Context(), g, "backup-2", 0); err != nil {
		t.Fatalf("release: %v", err)
	}
	if e.GCHeld(g) {
		t.Fatal("a released hold still holds")
	}
	if h := e.node.machines[g].GCHolds(); len(h) != 0 {
		t.Fatalf("holds after a release: %v", h)
	}
}

// TestImportGroupRefusals: what the engine refuses before it proposes.
func TestImportGroupRefusals(t *testing.T) {
	src := startEngine(t, nil)
	mustCreate(t, src, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain", HasBody: true, Body: bytes.Repeat([]byte("x"), 96<<10)})
	g := src.GroupOf(key("s"))
	ex, err := src.ExportGroup(t.Context(), g, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t.TempDir())
	cfg.MaxMessageBytes = 128 << 10 // one entry carries 64 KiB
	dst := newEngine(t, cfg, nil)
	dst.run(t)
	dst.waitReady(t)
	badRaw, _ := proto.Marshal(&storagev1.Snapshot{Format: backupfmt.SnapshotFormat, Buckets: []string{"z", "a"}})
	for _, tc := range []struct {
		name   string
		g      uint32
		snap   []byte
		digest string
		want   *fault.Kind
	}{
		{"no digest", g, badRaw, "", fault.ErrInvalidArgument},
		{"an invalid snapshot", g, badRaw, backupfmt.Digest(badRaw), fault.ErrInvalidArgument},
		{"bytes that are no snapshot", g, []byte("nope"), backupfmt.Digest([]byte("nope")), fault.ErrInvalidArgument},
		{"no such group", uint32(dst.GroupCount()), ex.Snapshot, backupfmt.Digest(ex.Snapshot), fault.ErrInvalidArgument},
		{"above one entry", g, ex.Snapshot, backupfmt.Digest(ex.Snapshot), fault.ErrPayloadTooLarge},
	} {
		_, err := dst.ImportGroup(t.Context(), tc.g, tc.snap, tc.digest)
		wantCode(t, tc.name, err, tc.want)
	}
	if _, ok := dst.Imported(g); ok || dst.status(g).Applied > ex.AppliedIndex+100 {
		t.Fatal("a refused import was applied")
	}
}

// TestBackupRestoreCluster: every replica of a three-node cluster exports
// the same state at the same index; the import runs on the target group's
// leader only and every replica of the target applies the same restored
// state, a large hot window included.
func TestBackupRestoreCluster(t *testing.T) {
	src := startCluster(t, 3)
	src.onLeader(t, bucketGroup, "create the bucket", func(le *testEngine) error {
		_, err := le.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket})
		return err
	})
	names := []string{"c1", "c2", "c3", "large"}
	groupOf := func(n string) uint32 { return src.engines[1].GroupOf(key(n)) }
	for _, n := range names {
		src.onLeader(t, groupOf(n), "create "+n, func(le *testEngine) error {
			if !le.node.machines[bucketGroup].HasBucket(testBucket) {
				return fault.Errorf(fault.ErrUnavailable, "the bucket has not reached the leader yet")
			}
			_, err := le.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref(n), ContentType: "application/json"})
			return err
		})
		for i := range 5 {
			src.onLeader(t, groupOf(n), "append to "+n, func(le *testEngine) error {
				_, err := le.Append(t.Context(), &streamv1.AppendRequest{Ref: ref(n), ContentType: "application/json",
					Body: fmt.Appendf(nil, `{"n":%d,"s":%q}`, i, n), Producer: &streamv1.Producer{Id: "p", Epoch: 1, Seq: uint64(i)}})
				return err
			})
		}
	}
	for i := range 6 {
		src.onLeader(t, groupOf("large"), "append to large", func(le *testEngine) error {
			_, err := le.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("large"), ContentType: "application/json",
				Body: fmt.Appendf(nil, `{"big":%d,"pad":%q}`, i, strings.Repeat("z", 500<<10)), Producer: &streamv1.Producer{Id: "big", Epoch: 1, Seq: uint64(i)}})
			return err
		})
	}
	want := map[string]streamView{}
	for _, n := range names {
		src.onLeader(t, groupOf(n), "view "+n, func(le *testEngine) (err error) {
			want[n], err = tryView(t, le, n)
			return err
		})
	}

	groups := uint32(src.engines[1].GroupCount())
	exports := map[uint32][]byte{}
	for g := range groups {
		lead := src.waitLeader(t, g)
		for id, e := range src.engines {
			if id == lead {
				continue
			}
			_, err := e.HoldColdGC(t.Context(), g, "backup-c", time.Hour)
			if err == nil && e.status(g).IsLeader {
				continue // the balancer moved the leadership here meanwhile
			}
			wantCode(t, fmt.Sprintf("hold on follower %d", id), err, fault.ErrNotLeader)
			if l := fault.Detail(err, fault.DetailLeaderID); l == "" || l == fmt.Sprint(id) {
				t.Fatalf("NOT_LEADER of node %d names %q", id, l)
			}
		}
		var index uint64
		src.onLeader(t, g, "hold", func(le *testEngine) (err error) {
			index, err = le.HoldColdGC(t.Context(), g, "backup-c", time.Hour)
			return err
		})
		// Every replica at the same index exports the same bytes.
		var at uint64
		for _, e := range src.engines {
			at = max(at, e.status(g).Applied, index)
		}
		var first []byte
		for id, e := range src.engines {
			ex, err := e.ExportGroup(t.Context(), g, at)
			if err != nil {
				t.Fatalf("export group %d from node %d: %v", g, id, err)
			}
			if ex.AppliedIndex != at {
				continue // a background command applied meanwhile
			}
			if first == nil {
				first = ex.Snapshot
			} else if !bytes.Equal(first, ex.Snapshot) {
				t.Fatalf("group %d: node %d exports other bytes than another replica at index %d", g, id, at)
			}
			exports[g] = ex.Snapshot
		}
		if exports[g] == nil {
			t.Fatalf("group %d: no replica exported at %d", g, at)
		}
	}
	for _, e := range src.engines {
		e.stop(t)
	}

	dst := startCluster(t, 3)
	for g := range groups {
		lead := dst.waitLeader(t, g)
		digest := backupfmt.Digest(exports[g])
		for id, e := range dst.engines {
			if id != lead && !e.status(g).IsLeader {
				_, err := e.ImportGroup(t.Context(), g, exports[g], digest)
				if err == nil && e.status(g).IsLeader {
					continue // the balancer moved the leadership here meanwhile
				}
				wantCode(t, fmt.Sprintf("import on follower %d", id), err, fault.ErrNotLeader)
			}
		}
		var res ImportResult
		dst.onLeader(t, g, "import", func(le *testEngine) (err error) {
			res, err = le.ImportGroup(t.Context(), g, exports[g], digest)
			return err
		})
		if res.Index == 0 {
			t.Fatalf("import group %d: %+v", g, res)
		}
		for id, e := range dst.engines {
			if err := e.node.Cluster.WaitApplied(t.Context(), g, res.Index); err != nil {
				t.Fatalf("node %d: %v", id, err)
			}
			if info, ok := e.Imported(g); !ok || info.Index != res.Index {
				t.Fatalf("node %d: import record %+v (%v), want index %d", id, info, ok, res.Index)
			}
		}
	}
	for _, n := range names {
		g := dst.engines[1].GroupOf(key(n))
		var got streamView
		var le *testEngine
		dst.onLeader(t, g, "view "+n, func(e *testEngine) (err error) {
			le = e
			got, err = tryView(t, e, n)
			return err
		})
		sameView(t, n, want[n], got)
		wantMeta := mustLookup(t, le, n)
		for id, e := range dst.engines {
			m := mustLookup(t, e, n)
			if m.Incarnation != wantMeta.Incarnation || m.Tail != wantMeta.Tail || m.RecordNext != wantMeta.RecordNext {
				t.Fatalf("node %d: %s at incarnation %d tail %d, the leader has %d, %d", id, n, m.Incarnation, m.Tail, wantMeta.Incarnation, wantMeta.Tail)
			}
		}
		var err error
		dst.onLeader(t, g, "write "+n, func(e *testEngine) error {
			_, err = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref(n), ContentType: "application/json", Body: []byte(`{"late":1}`),
				Producer: &streamv1.Producer{Id: "p", Epoch: 1, Seq: 5}})
			if fault.KindOf(err) == fault.ErrProducerStaleEpoch {
				return nil
			}
			return err
		})
		wantCode(t, n+": the next write of a closed epoch", err, fault.ErrProducerStaleEpoch)
	}
}

// TestExportWaitsForTheIndex: an export waits for its replica to apply
// the index asked for, within its context, and says so when it does not.
func TestExportWaitsForTheIndex(t *testing.T) {
	e := startEngine(t, nil)
	g := e.GroupOf(key("w"))
	at := e.status(g).Applied
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := e.ExportGroup(ctx, g, at+1000)
	wantCode(t, "an index the replica never applies", err, fault.ErrUnavailable)
	done := make(chan error, 1)
	go func() {
		_, err := e.ExportGroup(t.Context(), g, at+1)
		done <- err
	}()
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("w"), ContentType: "text/plain"})
	if err := <-done; err != nil {
		t.Fatalf("an export waiting for the next index: %v", err)
	}
}
