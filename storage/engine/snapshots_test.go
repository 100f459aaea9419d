package engine

import (
	"slices"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

func putSnap(tb testing.TB, e *testEngine, name, offset, ct, body, match string) (*streamv1.PutSnapshotResponse, error) {
	tb.Helper()
	return e.PutSnapshot(tb.Context(), &streamv1.PutSnapshotRequest{Ref: ref(name), Offset: offset, ContentType: ct, Body: []byte(body), Match: match})
}

func TestSnapshotPublishColdStore(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "application/octet-stream"})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("j"), ContentType: "application/json"})
	for _, b := range []string{"aaaa", "bbbb", "cccc"} { // appends end at 4, 8, 12
		mustAppend(t, e, "s", "application/octet-stream", b)
	}
	mustAppend(t, e, "j", "application/json", "[1,2]") // stored "1\n2\n": one append, two messages
	mustAppend(t, e, "j", "application/json", "3")
	waitFlushed(t, e, "s")
	waitFlushed(t, e, "j")
	digest1 := stream.SnapshotDigest("application/x", []byte("one"))
	digest2 := stream.SnapshotDigest("application/x", []byte("two"))
	steps := []struct {
		name       string
		stream     string
		offset     string
		body       string
		match      string
		code       *fault.Kind
		created    bool
		wantDigest string
	}{
		{"inside a cold append", "s", off(2), "one", "", fault.ErrInvalidArgument, false, ""},
		{"beyond the tail", "s", off(13), "one", "", fault.ErrSnapshotConflict, false, ""},
		{"start sentinel", "s", "-1", "one", "", fault.ErrInvalidArgument, false, ""},
		{"malformed", "s", "abc", "one", "", fault.ErrInvalidArgument, false, ""},
		{"match without a snapshot", "s", off(4), "one", "x", fault.ErrSnapshotConflict, false, ""},
		{"first", "s", off(4), "one", "", nil, true, digest1},
		{"same again", "s", off(4), "one", "", nil, false, digest1},
		{"other bytes at the same offset", "s", off(4), "two", "", fault.ErrSnapshotConflict, false, ""},
		{"match mismatch", "s", off(8), "two", "nope", fault.ErrSnapshotConflict, false, ""},
		{"replace with match", "s", off(8), "two", digest1, nil, true, digest2},
		{"json message end inside a cold append", "j", off(2), "one", "", nil, true, digest1},
		{"json inside a message", "j", off(1), "one", "", fault.ErrInvalidArgument, false, ""},
		{"missing stream", "nope", off(0), "one", "", fault.ErrStreamNotFound, false, ""},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			resp, err := putSnap(t, e, st.stream, st.offset, "application/x", st.body, st.match)
			wantCode(t, st.name, err, st.code)
			if err == nil && (resp.GetCreated() != st.created || resp.GetDigest() != st.wantDigest || resp.GetOffset() != st.offset) {
				t.Fatalf("response %v, want created %v digest %s", resp, st.created, st.wantDigest)
			}
		})
	}
	// The replaced snapshot's object is queued for GC; the latest is in
	// the store and referenced by the stream (so the orphan sweep keeps it).
	g := e.GroupOf(key("s"))
	q, _, _, err := e.node.Cold.GCQueue(t.Context(), g, 100)
	if err != nil {
		t.Fatal(err)
	}
	var queued []string
	for _, en := range q {
		queued = append(queued, en.GetKey())
	}
	if len(queued) != 1 || !strings.Contains(queued[0], "/s/00000000000000000004-"+digest1) {
		t.Fatalf("GC queue %v, want the first snapshot's object", queued)
	}
	m := mustLookup(t, e, "s")
	refs, _, err := e.node.Cold.ColdReferences(t.Context(), coldfmt.StreamPrefix(testBucket, "s", m.Incarnation))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(refs, func(k string) bool { return strings.Contains(k, "/s/00000000000000000008-"+digest2) }) {
		t.Fatalf("cold references %v lack the snapshot", refs)
	}

	check := func(e *testEngine) {
		t.Helper()
		got, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("s")})
		if err != nil {
			t.Fatal(err)
		}
		if string(got.GetBody()) != "two" || got.GetOffset() != off(8) || got.GetDigest() != digest2 || got.GetContentType() != "application/x" ||
			got.GetNextOffset() != off(12) || got.GetUpToDate() || got.GetClosed() {
			t.Fatalf("GetSnapshot = %v", got)
		}
		if _, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("s"), Offset: off(4)}); codeOf(err) != fault.ErrSnapshotNotFound {
			t.Fatalf("GetSnapshot at a replaced offset: %v", err)
		}
		head, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("s")})
		if err != nil {
			t.Fatal(err)
		}
		if head.GetInfo().GetSnapshotOffset() != off(8) || head.GetInfo().GetSnapshotDigest() != digest2 {
			t.Fatalf("Head = %v", head.GetInfo())
		}
	}
	check(e)
	e.stop(t) // restart, with the same store
	e2 := openEngine(t, cfg, Deps{ColdStore: store})
	e2.run(t)
	e2.waitReady(t)
	check(e2)

	// Below the retention: 410.
	if _, err := e2.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("s"), Offset: off(8)}); err != nil {
		t.Fatal(err)
	}
	_, err = putSnap(t, e2, "s", off(4), "application/x", "three", "")
	wantCode(t, "below the retention", err, fault.ErrOffsetTrimmed)
}

func TestSnapshotInlineWithoutColdStore(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain"})
	mustAppend(t, e, "s", "text/plain", "hello")
	mustAppend(t, e, "s", "text/plain", "world")
	_, err := putSnap(t, e, "s", off(3), "text/plain", "x", "")
	wantCode(t, "inside an append", err, fault.ErrInvalidArgument)
	if _, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("s")}); codeOf(err) != fault.ErrSnapshotNotFound {
		t.Fatalf("GetSnapshot without one: %v", err)
	}
	if _, err := putSnap(t, e, "s", off(10), "", "state", ""); err != nil {
		t.Fatal(err)
	}
	e = restart(t, e, nil)
	got, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("s"), Offset: off(10)})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.GetBody()) != "state" || got.GetContentType() != DefaultContentType || !got.GetUpToDate() {
		t.Fatalf("after restart: %v", got)
	}
	_, err = putSnap(t, e, "s", off(5), "", "older", "")
	if err != nil {
		t.Fatalf("replace with an earlier offset: %v", err)
	}
	big := strings.Repeat("x", MaxSnapshotBytes+1)
	_, err = putSnap(t, e, "s", off(10), "", big, "")
	wantCode(t, "too large", err, fault.ErrPayloadTooLarge)
}
