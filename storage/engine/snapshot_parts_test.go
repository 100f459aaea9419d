package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func putPart(tb testing.TB, e *testEngine, name, offset string, n uint32, body []byte) (string, error) {
	tb.Helper()
	resp, err := e.PutSnapshotPart(tb.Context(), &streamv1.PutSnapshotPartRequest{Ref: ref(name), Offset: offset, Part: n, Body: body})
	return resp.GetDigest(), err
}

func commitParts(tb testing.TB, e *testEngine, name, offset, match string, digests ...string) (*streamv1.CommitSnapshotResponse, error) {
	tb.Helper()
	req := &streamv1.CommitSnapshotRequest{Ref: ref(name), Offset: offset, ContentType: "application/x", Match: match}
	for i, d := range digests {
		req.Parts = append(req.Parts, &streamv1.SnapshotPartDigest{Part: uint32(i + 1), Digest: d})
	}
	return e.CommitSnapshot(tb.Context(), req)
}

// readSnapshot reads the latest snapshot part by part.
func readSnapshot(tb testing.TB, e *testEngine, name string) (*streamv1.GetSnapshotResponse, []byte) {
	tb.Helper()
	first, err := e.GetSnapshot(tb.Context(), &streamv1.GetSnapshotRequest{Ref: ref(name)})
	if err != nil {
		tb.Fatal(err)
	}
	body := slices.Clone(first.GetBody())
	for n := uint32(2); n <= first.GetParts(); n++ {
		resp, err := e.GetSnapshot(tb.Context(), &streamv1.GetSnapshotRequest{Ref: ref(name), Offset: first.GetOffset(), Part: n})
		if err != nil {
			tb.Fatal(err)
		}
		body = append(body, resp.GetBody()...)
	}
	if uint64(len(body)) != first.GetSize() {
		tb.Fatalf("read %d bytes, the snapshot says %d", len(body), first.GetSize())
	}
	return first, body
}

// stagedKeys lists the staged-part objects of a stream.
func stagedKeys(tb testing.TB, e *testEngine, store objstore.Store, name string) []string {
	tb.Helper()
	m := mustLookup(tb, e, name)
	var keys []string
	if err := store.List(tb.Context(), coldfmt.StreamPrefix(testBucket, name, m.Incarnation)+"sp/", func(in objstore.Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return keys
}

// stagedBytes is testBucket's staged bytes over every group, once every
// group has finished counting (the seed listing runs in the background).
func stagedBytes(tb testing.TB, e *testEngine) uint64 {
	tb.Helper()
	var n uint64
	await.True(tb, "staged usage counted in every group", func() bool {
		n = 0
		for _, u := range e.StagedUsage(tb.Context()) {
			if !u.CountingFinished {
				return false
			}
			n += u.Bytes[testBucket]
		}
		return true
	})
	return n
}

// listGate is a cold store whose listings of staged parts wait until the
// gate opens: a seed listing that has not ended yet, without timing.
type listGate struct {
	objstore.Store
	open chan struct{}
}

func (s *listGate) List(ctx context.Context, prefix string, fn func(objstore.Info) error) error {
	if strings.HasSuffix(prefix, "sp/") {
		select {
		case <-s.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.List(ctx, prefix, fn)
}

// TestStagedUsageCountsInBackground: the usage report lists nothing in
// the request. After a restart (a new term) every group the node leads is
// reported at once, the stream's group not finished counting while its
// seed listing waits (a group without streams has nothing to list), then
// with the parts' bytes once it ended.
func TestStagedUsageCountsInBackground(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), HasBody: true, Body: []byte("0123456789")})
	if _, err := putPart(t, e, "s", off(4), 1, []byte("part")); err != nil {
		t.Fatal(err)
	}
	if n := stagedBytes(t, e); n != 4 {
		t.Fatalf("staged bytes %d, want 4", n)
	}
	e.stop(t)
	gate := &listGate{Store: store, open: make(chan struct{})}
	e = openEngine(t, cfg, Deps{ColdStore: gate})
	e.run(t)
	e.waitReady(t)
	got := e.StagedUsage(t.Context()) // answers with the listing blocked
	if len(got) != e.GroupCount() {
		t.Fatalf("staged usage names %d groups, want every one of the %d this node leads", len(got), e.GroupCount())
	}
	g := e.GroupOf(key("s"))
	for _, u := range got {
		if u.GroupID == g && u.CountingFinished {
			t.Fatalf("group %d finished counting while its seed listing waits", u.GroupID)
		}
		if u.Term != e.status(u.GroupID).Term {
			t.Fatalf("group %d reported term %d, want %d", u.GroupID, u.Term, e.status(u.GroupID).Term)
		}
	}
	close(gate.open)
	if n := stagedBytes(t, e); n != 4 {
		t.Fatalf("staged bytes after the seed listing %d, want 4", n)
	}
}

func TestSnapshotStagedParts(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "application/octet-stream"})
	for _, b := range []string{"aaaa", "bbbb", "cccc"} { // appends end at 4, 8, 12
		mustAppend(t, e, "s", "application/octet-stream", b)
	}
	waitFlushed(t, e, "s")
	p1, p2, p3 := bytes.Repeat([]byte("1"), 3000), bytes.Repeat([]byte("2"), 200), []byte("3")
	for _, st := range []struct {
		n    uint32
		body []byte
	}{{3, p3}, {1, p1}, {2, []byte("old")}, {2, p2}} { // any order; part 2 replaced
		d, err := putPart(t, e, "s", off(8), st.n, st.body)
		if err != nil {
			t.Fatal(err)
		}
		if d != sha(st.body) {
			t.Fatalf("part %d digest %s, want %s", st.n, d, sha(st.body))
		}
	}
	if keys := stagedKeys(t, e, store, "s"); len(keys) != 3 {
		t.Fatalf("staged objects %v, want 3 (the replaced part deleted)", keys)
	}
	if n := stagedBytes(t, e); n != 3201 {
		t.Fatalf("staged usage %d bytes, want 3201", n)
	}
	d1, d2, d3 := sha(p1), sha(p2), sha(p3)
	bad := strings.Repeat("0", 64)

	partSteps := []struct {
		name string
		n    uint32
		body []byte
		off  string
		code *fault.Kind
	}{
		{"part zero", 0, p3, off(8), fault.ErrInvalidArgument},
		{"empty part", 1, nil, off(8), fault.ErrInvalidArgument},
		{"part too large", 1, make([]byte, MaxSnapshotPartBytes+1), off(8), fault.ErrPayloadTooLarge},
		{"part beyond the tail", 1, p3, off(13), fault.ErrSnapshotConflict},
		{"part of a missing stream", 1, p3, off(0), fault.ErrStreamNotFound},
	}
	for _, st := range partSteps {
		t.Run(st.name, func(t *testing.T) {
			name := "s"
			if st.code == fault.ErrStreamNotFound {
				name = "nope"
			}
			_, err := putPart(t, e, name, st.off, st.n, st.body)
			wantCode(t, st.name, err, st.code)
		})
	}
	commitSteps := []struct {
		name    string
		off     string
		match   string
		digests []string
		code    *fault.Kind
	}{
		{"missing part", off(8), "", []string{d1, d2, d3, d3}, fault.ErrInvalidArgument},
		{"digest mismatch", off(8), "", []string{d1, bad, d3}, fault.ErrSnapshotConflict},
		{"malformed digest", off(8), "", []string{d1, "xyz", d3}, fault.ErrInvalidArgument},
		{"no parts", off(8), "", nil, fault.ErrInvalidArgument},
		{"beyond the tail", off(13), "", []string{d1}, fault.ErrSnapshotConflict},
		{"nothing staged there", off(4), "", []string{d1}, fault.ErrInvalidArgument},
		{"match without a snapshot", off(8), "x", []string{d1, d2, d3}, fault.ErrSnapshotConflict},
	}
	for _, st := range commitSteps {
		t.Run(st.name, func(t *testing.T) {
			_, err := commitParts(t, e, "s", st.off, st.match, st.digests...)
			wantCode(t, st.name, err, st.code)
		})
	}

	whole := slices.Concat(p1, p2, p3)
	want := stream.SnapshotDigest("application/x", whole)
	resp, err := commitParts(t, e, "s", off(8), "", d1, d2, d3)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetCreated() || resp.GetDigest() != want || resp.GetOffset() != off(8) {
		t.Fatalf("commit = %v, want digest %s", resp, want)
	}
	if resp, err := commitParts(t, e, "s", off(8), "", d1, d2, d3); err != nil || resp.GetCreated() || resp.GetDigest() != want {
		t.Fatalf("commit again = %v, %v", resp, err)
	}
	if n := stagedBytes(t, e); n != 0 {
		t.Fatalf("staged usage after the commit %d bytes, want 0", n)
	}
	check := func(e *testEngine) {
		t.Helper()
		got, body := readSnapshot(t, e, "s")
		if !bytes.Equal(body, whole) || got.GetParts() != 3 || got.GetDigest() != want || got.GetOffset() != off(8) || got.GetContentType() != "application/x" {
			t.Fatalf("GetSnapshot = %v (%d bytes)", got.GetDigest(), len(body))
		}
		_, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("s"), Part: 4})
		wantCode(t, "part 4 of 3", err, fault.ErrInvalidArgument)
	}
	check(e)
	m := mustLookup(t, e, "s")
	refs, _, err := e.node.Cold.ColdReferences(t.Context(), coldfmt.StreamPrefix(testBucket, "s", m.Incarnation))
	if err != nil {
		t.Fatal(err)
	}
	committed := stagedKeys(t, e, store, "s")
	for _, k := range committed {
		if !slices.Contains(refs, k) {
			t.Fatalf("cold references %v lack committed part %s", refs, k)
		}
	}

	// Staged parts survive a restart: the new term's index is rebuilt
	// from a listing (digests unknown until the commit reads the parts).
	q1, q2 := []byte("later-1"), []byte("later-2")
	for i, b := range [][]byte{q1, q2} {
		if _, err := putPart(t, e, "s", off(12), uint32(i+1), b); err != nil {
			t.Fatal(err)
		}
	}
	// Staged parts no commit named are not references: the orphan sweep
	// reclaims them after OrphanAge.
	refs, _, err = e.node.Cold.ColdReferences(t.Context(), coldfmt.StreamPrefix(testBucket, "s", m.Incarnation))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range stagedKeys(t, e, store, "s") {
		if slices.Contains(refs, k) != slices.Contains(committed, k) {
			t.Fatalf("cold references %v: staged %s referenced", refs, k)
		}
	}
	e.stop(t)
	e = openEngine(t, cfg, Deps{ColdStore: store})
	e.run(t)
	e.waitReady(t)
	check(e)
	if n := stagedBytes(t, e); n != uint64(len(q1)+len(q2)) {
		t.Fatalf("staged usage after restart %d bytes, want %d", n, len(q1)+len(q2))
	}
	_, err = commitParts(t, e, "s", off(12), "", sha(q1), bad)
	wantCode(t, "listed part with another digest", err, fault.ErrSnapshotConflict)
	if _, err := commitParts(t, e, "s", off(12), want, sha(q1), sha(q2)); err != nil {
		t.Fatal(err)
	}
	_, body := readSnapshot(t, e, "s")
	if string(body) != "later-1later-2" {
		t.Fatalf("replaced snapshot body %q", body)
	}
	// While a commit reads the parts at an offset, they cannot be replaced
	// (a replaced part's object is deleted) and no second commit starts.
	if _, err := putPart(t, e, "s", off(4), 1, q1); err != nil {
		t.Fatal(err)
	}
	g := e.GroupOf(key("s"))
	reading, err := e.node.Cold.BeginCommit(t.Context(), g, e.status(g).Term, key("s"), m.Incarnation, 4, []string{sha(q1)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = putPart(t, e, "s", off(4), 1, q2)
	wantCode(t, "replace during a commit", err, fault.ErrSnapshotConflict)
	_, err = commitParts(t, e, "s", off(4), "", sha(q1))
	wantCode(t, "second commit", err, fault.ErrSnapshotConflict)
	reading.End()
	// The replaced snapshot's parts are queued for GC.
	q, _, _, err := e.node.Cold.GCQueue(t.Context(), g, 100)
	if err != nil {
		t.Fatal(err)
	}
	var queued []string
	for _, en := range q {
		queued = append(queued, en.GetKey())
	}
	for _, k := range committed {
		if !slices.Contains(queued, k) {
			t.Fatalf("GC queue %v lacks replaced part %s", queued, k)
		}
	}
}

func TestSnapshotPartsNeedColdStore(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain"})
	_, err := putPart(t, e, "s", off(0), 1, []byte("x"))
	wantCode(t, "stage", err, fault.ErrNoColdStore)
	_, err = commitParts(t, e, "s", off(0), "", sha([]byte("x")))
	wantCode(t, "commit", err, fault.ErrNoColdStore)
}
