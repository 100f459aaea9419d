package engine

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

func TestAttrs(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s")})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("closed"), Closed: true})
	attrs := func(title, md string) *streamv1.StreamAttrs {
		return &streamv1.StreamAttrs{Title: title, Metadata: []byte(md)}
	}
	tests := []struct {
		name     string
		stream   string
		set      *streamv1.StreamAttrs
		wantCode *fault.Kind
		want     *streamv1.StreamAttrs // nil: none set
	}{
		{"set both", "s", attrs("t", `{ "b": 1, "a": [1, 2] }`), nil, attrs("t", `{"a":[1,2],"b":1}`)},
		{"replace", "s", attrs("", `{"x":null}`), nil, attrs("", `{"x":null}`)},
		{"empty object clears metadata", "s", attrs("", `{}`), nil, nil},
		{"clear", "s", nil, nil, nil},
		{"closed stream", "closed", attrs("c", ""), nil, attrs("c", "")},
		{"metadata not an object", "s", attrs("", `[1]`), fault.ErrInvalidArgument, nil},
		{"too large", "s", attrs(strings.Repeat("x", MaxAttrsBytes+1), ""), fault.ErrInvalidArgument, nil},
		{"missing stream", "nope", attrs("t", ""), fault.ErrStreamNotFound, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.SetAttrs(t.Context(), &streamv1.SetAttrsRequest{Ref: ref(tc.stream), Attrs: tc.set})
			wantCode(t, "SetAttrs", err, tc.wantCode)
			if tc.wantCode != nil {
				return
			}
			got, err := e.GetAttrs(t.Context(), &streamv1.GetAttrsRequest{Ref: ref(tc.stream)})
			if err != nil {
				t.Fatal(err)
			}
			a := got.GetAttrs()
			if (a == nil) != (tc.want == nil) || a.GetTitle() != tc.want.GetTitle() || string(a.GetMetadata()) != string(tc.want.GetMetadata()) {
				t.Fatalf("attrs = %v, want %v", a, tc.want)
			}
		})
	}
	if h, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("closed")}); err != nil || h.GetInfo().GetNextOffset() != off(0) {
		t.Fatalf("Head after attrs: %v %v", h, err)
	}
	_, err := e.GetAttrs(t.Context(), &streamv1.GetAttrsRequest{Ref: ref("nope")})
	wantCode(t, "GetAttrs of a missing stream", err, fault.ErrStreamNotFound)
}

func TestBuckets(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	e := startEngine(t, clock)
	ctx := t.Context()
	for _, name := range []string{"snapshots", "__x", "Bad"} {
		_, err := e.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: name})
		wantCode(t, "create "+name, err, fault.ErrInvalidArgument)
	}
	_, err := e.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref("streams")})
	wantCode(t, "create the reserved stream id", err, fault.ErrInvalidArgument)

	if _, err := e.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: "tenant"}); err != nil {
		t.Fatal(err)
	}
	tref := func(s string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: "tenant", Stream: s} }
	// Spread over several groups.
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("s%02d", i))
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: tref(names[i])})
	}
	b, err := e.GetBucket(ctx, &streamv1.GetBucketRequest{Bucket: "tenant"})
	if err != nil || b.GetBucket() != "tenant" || b.GetStreamCount() != 12 || b.GetCreatedMs() != ttlEpoch.UnixMilli() {
		t.Fatalf("GetBucket = %v, %v", b, err)
	}
	_, err = e.GetBucket(ctx, &streamv1.GetBucketRequest{Bucket: "nope"})
	wantCode(t, "GetBucket of a missing bucket", err, fault.ErrBucketNotFound)

	// Listing pages through every stream in order.
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		resp, err := e.ListStreams(ctx, &streamv1.ListStreamsRequest{Bucket: "tenant", After: after, Limit: 5})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetStreams() {
			got = append(got, s.GetStreamId())
			if s.GetStatus() != "open" || s.GetTailOffset() != off(0) || s.GetCreatedAtMs() != ttlEpoch.UnixMilli() {
				t.Fatalf("listing %v", s)
			}
		}
		if !resp.GetHasMore() {
			if resp.GetNextCursor() != "" {
				t.Fatal("a last page with a cursor")
			}
			break
		}
		after = resp.GetNextCursor()
		if pages > 5 {
			t.Fatal("too many pages")
		}
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("listed %v", got)
	}
	for _, tc := range []struct {
		name string
		req  *streamv1.ListStreamsRequest
		want *fault.Kind
	}{
		{"limit too large", &streamv1.ListStreamsRequest{Bucket: "tenant", Limit: 1001}, fault.ErrInvalidArgument},
		{"missing bucket", &streamv1.ListStreamsRequest{Bucket: "nope"}, fault.ErrBucketNotFound},
	} {
		_, err := e.ListStreams(ctx, tc.req)
		wantCode(t, tc.name, err, tc.want)
	}

	_, err = e.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: "tenant"})
	wantCode(t, "delete a bucket with streams", err, fault.ErrBucketExists)
	for _, n := range names {
		if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: tref(n)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: "tenant"}); err != nil {
		t.Fatalf("delete the empty bucket: %v", err)
	}
	_, err = e.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: "tenant"})
	wantCode(t, "delete again", err, fault.ErrBucketNotFound)
	_, err = e.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref("x")})
	wantCode(t, "create in a deleted bucket", err, fault.ErrBucketNotFound)
}

func TestIncarnationChecks(t *testing.T) {
	e := startEngine(t, nil)
	inc := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), HasBody: true, Body: []byte("x")}).GetInfo().GetIncarnation()
	ctx := t.Context()
	tests := []struct {
		name string
		call func(inc uint64) error
	}{
		{"head", func(inc uint64) error {
			_, err := e.Head(ctx, &streamv1.HeadRequest{Ref: ref("s"), Incarnation: inc})
			return err
		}},
		{"read", func(inc uint64) error {
			_, err := e.Read(ctx, &streamv1.ReadRequest{Ref: ref("s"), Incarnation: inc, NoTouch: true})
			return err
		}},
		{"append", func(inc uint64) error {
			_, err := e.Append(ctx, &streamv1.AppendRequest{Ref: ref("s"), ContentType: DefaultContentType, Body: []byte("y"), Incarnation: inc})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(inc); err != nil {
				t.Fatalf("current incarnation: %v", err)
			}
			if err := tc.call(0); err != nil {
				t.Fatalf("no incarnation: %v", err)
			}
			err := tc.call(inc + 1000)
			wantCode(t, "stale incarnation", err, fault.ErrIncarnationMismatch)
			if got := err.(*fault.Error).Details[fault.DetailIncarnation]; got != fmt.Sprint(inc) {
				t.Fatalf("mismatch carries %q, want %d", got, inc)
			}
		})
	}
	if a := mustAppend(t, e, "s", DefaultContentType, "z"); a.GetIncarnation() != inc {
		t.Fatalf("append incarnation %d, want %d", a.GetIncarnation(), inc)
	}
}

func TestUsageAcrossGroups(t *testing.T) {
	e := startEngine(t, nil)
	ctx := t.Context()
	for i := range 6 {
		n := fmt.Sprintf("u%d", i)
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(n), HasBody: true, Body: []byte("abcd")})
		mustAppend(t, e, n, DefaultContentType, "ef")
	}
	want := stream.BucketUsage{CommittedAppendBytes: 36, CommittedRecords: 12, CommittedWriteUnits: 12, RetainedBytes: 36, StreamCount: 6}
	if got := e.Usage()[testBucket]; got != want {
		t.Fatalf("usage = %+v, want %+v", got, want)
	}
	for i := range 6 {
		if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref(fmt.Sprintf("u%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	want.RetainedBytes, want.StreamCount = 0, 0
	if got := e.Usage()[testBucket]; got != want {
		t.Fatalf("usage after deletes = %+v, want %+v", got, want)
	}
	// The counters survive a restart (snapshots and log replay).
	e = restart(t, e, nil)
	if got := e.Usage()[testBucket]; got != want {
		t.Fatalf("usage after a restart = %+v, want %+v", got, want)
	}
}

// TestTTLSweepBatching drives sweep passes by hand on a one-group engine:
// a pass writes at most 16 entries of 257 streams, leaves the rest (and
// reports the group due), and waits a second past expiry.
func TestTTLSweepBatching(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := testConfig(t.TempDir())
	cfg.GroupCount = 1
	cfg.ShardCount = 1
	cfg.ExpirySweepInterval = time.Hour
	cfg.SnapshotEntries = 1 << 20
	cfg.SnapshotBytes = 1 << 30
	e := startEngineAt(t, cfg, clock)
	const total = sweepEntries*sweepBatch + 5
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 16 {
				if _, err := e.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref(fmt.Sprintf("t%05d", i)), TtlSeconds: ttlSeconds(1)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("keep")})
	live := func() int { return e.node.machines[0].Stats().Streams }

	clock.Advance(1500 * time.Millisecond) // expired, but not a second past
	if st := e.sweepPass(t.Context()); st.entries != 0 || st.dueGroups != 0 || live() != total+1 {
		t.Fatalf("pass within the grace: %+v, %d streams", st, live())
	}
	clock.Advance(500 * time.Millisecond)
	if st := e.sweepPass(t.Context()); st.entries != sweepEntries || st.dueGroups != 1 || live() != 6 {
		t.Fatalf("first pass: %+v, %d streams left", st, live())
	}
	if st := e.sweepPass(t.Context()); st.entries != 1 || st.dueGroups != 0 || live() != 1 {
		t.Fatalf("second pass: %+v, %d streams left", st, live())
	}
	if !exists(e, "keep") {
		t.Fatal("the sweep removed a stream without a TTL")
	}
}

// TestTTLSweepBudget: a pass starts no entry once it has run for its
// budget on the engine's clock (here every reading of the clock during the
// pass costs 100 ms, so a 250 ms budget admits the entries started at 0,
// 100 and 200 ms: three).
func TestTTLSweepBudget(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := testConfig(t.TempDir())
	cfg.GroupCount = 1
	cfg.ShardCount = 1
	cfg.ExpirySweepInterval = time.Hour
	e := startEngineAt(t, cfg, clock)
	const total = 5 * sweepBatch
	for i := range total {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(fmt.Sprintf("t%05d", i)), TtlSeconds: ttlSeconds(1)})
	}
	clock.Advance(3 * time.Second)
	var ticking atomic.Bool
	e.now = func() time.Time {
		if ticking.Load() {
			clock.Advance(100 * time.Millisecond)
		}
		return clock.Now()
	}
	ticking.Store(true)
	st := e.sweepPass(t.Context())
	ticking.Store(false)
	if st.entries == 0 || st.entries >= 5 || st.dueGroups != 1 {
		t.Fatalf("pass with a spent budget: %+v, want fewer than 5 entries and the group left due", st)
	}
	if left := e.node.machines[0].Stats().Streams; left != total-int(st.entries)*sweepBatch {
		t.Fatalf("%d streams left after %d entries, want %d", left, st.entries, total-int(st.entries)*sweepBatch)
	}
}
