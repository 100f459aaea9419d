package engine

import (
	"fmt"
	"math"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

var ttlEpoch = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)

func ttlSeconds(s uint64) *uint64 { return &s }

func headErr(tb testing.TB, e *testEngine, name string) error {
	tb.Helper()
	_, err := e.Head(tb.Context(), &streamv1.HeadRequest{Ref: ref(name)})
	return err
}

// TestTTL drives sliding TTLs and absolute expiry with a fake clock. Each
// case runs on its own engine whose sweep is effectively off, so expiry
// happens only through access (the sweep has its own test).
func TestTTL(t *testing.T) {
	type step struct {
		advance time.Duration
		do      func(tb testing.TB, e *testEngine)
		live    bool // Head's verdict after the step
	}
	read := func(noTouch bool) func(tb testing.TB, e *testEngine) {
		return func(tb testing.TB, e *testEngine) {
			tb.Helper()
			if _, err := e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref("s"), NoTouch: noTouch}); err != nil {
				tb.Fatalf("Read: %v", err)
			}
		}
	}
	write := func(tb testing.TB, e *testEngine) {
		tb.Helper()
		mustAppend(tb, e, "s", DefaultContentType, "x")
	}
	head := func(tb testing.TB, e *testEngine) {
		tb.Helper()
		if err := headErr(tb, e, "s"); err != nil {
			tb.Fatalf("Head: %v", err)
		}
	}
	withTTL := &streamv1.CreateStreamRequest{Ref: ref("s"), TtlSeconds: ttlSeconds(10)}
	withExpiresAt := &streamv1.CreateStreamRequest{Ref: ref("s"), ExpiresAt: ttlEpoch.Add(10 * time.Second).Format(time.RFC3339Nano)}
	tests := []struct {
		name   string
		create *streamv1.CreateStreamRequest
		steps  []step
	}{
		{"expires after its ttl", withTTL, []step{
			{advance: 9999 * time.Millisecond, live: true},
			{advance: time.Millisecond, live: false},
		}},
		{"a read restarts the ttl", withTTL, []step{
			{advance: 8 * time.Second, do: read(false), live: true},
			{advance: 9 * time.Second, live: true},
			{advance: time.Second, live: false},
		}},
		{"a read without touch does not", withTTL, []step{
			{advance: 8 * time.Second, do: read(true), live: true},
			{advance: 2 * time.Second, live: false},
		}},
		{"head does not", withTTL, []step{
			{advance: 8 * time.Second, do: head, live: true},
			{advance: 2 * time.Second, live: false},
		}},
		{"a write restarts the ttl", withTTL, []step{
			{advance: 8 * time.Second, do: write, live: true},
			{advance: 9 * time.Second, live: true},
			{advance: time.Second, live: false},
		}},
		{"expires-at is not extended by reads or writes", withExpiresAt, []step{
			{advance: 5 * time.Second, do: read(false), live: true},
			{advance: 3 * time.Second, do: write, live: true},
			{advance: 2 * time.Second, live: false},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(ttlEpoch)
			cfg := testConfig(t.TempDir())
			cfg.ExpirySweepInterval = time.Hour
			e := startEngineAt(t, cfg, clock)
			mustCreate(t, e, tc.create)
			for i, st := range tc.steps {
				clock.Advance(st.advance)
				if st.do != nil {
					st.do(t, e)
				}
				err := headErr(t, e, "s")
				if st.live && err != nil {
					t.Fatalf("step %d (t+%v): Head = %v, want live", i, time.Duration(clock.ms.Load()-ttlEpoch.UnixMilli())*time.Millisecond, err)
				}
				if !st.live {
					wantCode(t, "Head of an expired stream", err, fault.ErrStreamNotFound)
				}
			}
			// Access expires the stream in the background (an access while
			// another background command for it is in flight leaves it to
			// the next access or the sweep).
			await.True(t, "the expired stream to be removed", func() bool {
				wantCode(t, "Head of an expired stream", headErr(t, e, "s"), fault.ErrStreamNotFound)
				return !exists(e, "s")
			})
		})
	}
}

func TestTTLInfo(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	e := startEngine(t, clock)
	at := ttlEpoch.Add(time.Hour).Format(time.RFC3339Nano)
	tests := []struct {
		name    string
		req     *streamv1.CreateStreamRequest
		wantTTL *uint64
		wantAt  string
	}{
		{"ttl", &streamv1.CreateStreamRequest{Ref: ref("ttl"), TtlSeconds: ttlSeconds(30)}, ttlSeconds(30), ""},
		{"expires-at", &streamv1.CreateStreamRequest{Ref: ref("at"), ExpiresAt: at}, nil, at},
		{"neither", &streamv1.CreateStreamRequest{Ref: ref("none")}, nil, ""},
		{"a fork inherits the source's ttl", forkReq("fork-ttl", "ttl", "", 0), ttlSeconds(30), ""},
		{"a fork inherits expires-at", forkReq("fork-at", "at", "", 0), nil, at},
		{"a fork may set its own", &streamv1.CreateStreamRequest{Ref: ref("fork-own"), TtlSeconds: ttlSeconds(5), Fork: &streamv1.ForkSpec{Source: ref("at")}}, ttlSeconds(5), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustCreate(t, e, tc.req)
			h, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: tc.req.GetRef()})
			if err != nil {
				t.Fatal(err)
			}
			in := h.GetInfo()
			if (in.TtlSeconds == nil) != (tc.wantTTL == nil) || (tc.wantTTL != nil && in.GetTtlSeconds() != *tc.wantTTL) || in.GetExpiresAt() != tc.wantAt {
				t.Fatalf("info ttl %v expires-at %q, want %v %q", in.TtlSeconds, in.GetExpiresAt(), tc.wantTTL, tc.wantAt)
			}
		})
	}
}

func TestTTLSweep(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	e := startEngine(t, clock)
	for _, n := range []string{"a", "b", "c"} {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(n), TtlSeconds: ttlSeconds(1)})
	}
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("keep")})
	clock.Advance(2 * time.Second)
	// Nothing touches the streams: only the sweep can remove them.
	await.True(t, "the sweep to expire every stream", func() bool {
		return !exists(e, "a") && !exists(e, "b") && !exists(e, "c")
	})
	if !exists(e, "keep") {
		t.Fatal("the sweep removed a stream without a TTL")
	}
}

func TestTTLRecreateAfterExpiry(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := testConfig(t.TempDir())
	cfg.ExpirySweepInterval = time.Hour
	e := startEngineAt(t, cfg, clock)

	t.Run("an expired stream is replaced", func(t *testing.T) {
		old := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), TtlSeconds: ttlSeconds(1), HasBody: true, Body: []byte("old")})
		clock.Advance(2 * time.Second)
		// Nothing accessed it, so it is still in the machine: the create
		// replaces that incarnation.
		if !exists(e, "s") {
			t.Fatal("expired stream already removed")
		}
		r := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain", HasBody: true, Body: []byte("new")})
		if !r.GetCreated() || r.GetInfo().GetIncarnation() <= old.GetInfo().GetIncarnation() {
			t.Fatalf("create over an expired stream: created %v incarnation %d (old %d)", r.GetCreated(), r.GetInfo().GetIncarnation(), old.GetInfo().GetIncarnation())
		}
		if got := readAll(t, e, "s"); got != "new" {
			t.Fatalf("recreated stream = %q", got)
		}
	})
	t.Run("an expired source with a live fork stays for the fork", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("src"), TtlSeconds: ttlSeconds(1), HasBody: true, Body: []byte("kept")})
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("child"), TtlSeconds: ttlSeconds(3600), Fork: &streamv1.ForkSpec{Source: ref("src")}})
		clock.Advance(2 * time.Second)
		_, err := e.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref("src"), HasBody: true, Body: []byte("new")})
		wantCode(t, "create over an expired source with forks", err, fault.ErrStreamExists)
		wantCode(t, "Head of the expired source", headErr(t, e, "src"), fault.ErrStreamGone)
		if got := readAll(t, e, "child"); got != "kept" {
			t.Fatalf("fork = %q", got)
		}
	})
}

// TestTouchSurvivesRestart checks that a read's TTL restart is persisted (a
// Touch command), so a restart does not shorten the TTL.
func TestTouchSurvivesRestart(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := testConfig(t.TempDir())
	cfg.ExpirySweepInterval = time.Hour
	e := startEngineAt(t, cfg, clock)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), TtlSeconds: ttlSeconds(10)})
	clock.Advance(8 * time.Second)
	if _, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("s")}); err != nil {
		t.Fatal(err)
	}
	touched := clock.Now().UnixMilli()
	await.True(t, "the touch to be replicated", func() bool {
		m, ok := e.machine(key("s")).Lookup(key("s"))
		return ok && m.ReplTouchedMs == touched
	})
	e = restart(t, e, clock)
	clock.Advance(9 * time.Second)
	if err := headErr(t, e, "s"); err != nil {
		t.Fatalf("Head 9s after the touch, after a restart: %v", err)
	}
	clock.Advance(time.Second)
	wantCode(t, "Head 10s after the touch", headErr(t, e, "s"), fault.ErrStreamNotFound)
}

// TestLifetimeBounds: a TTL or Expires-At the node cannot represent is
// refused with INVALID_ARGUMENT before anything is proposed, so nothing is
// created (the issue: Stream-TTL 9223372036854775807 answered 201, then
// the stream and its initial body were gone at once, its expiry having
// wrapped into the past). The largest TTL allowed keeps the stream and
// its body for as long as it says.
func TestLifetimeBounds(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := testConfig(t.TempDir())
	cfg.ExpirySweepInterval = time.Hour
	e := startEngineAt(t, cfg, clock)
	refused := []struct {
		name string
		req  *streamv1.CreateStreamRequest
	}{
		{"ttl of max int64 seconds", &streamv1.CreateStreamRequest{TtlSeconds: ttlSeconds(math.MaxInt64)}},
		{"ttl of max uint64 seconds", &streamv1.CreateStreamRequest{TtlSeconds: ttlSeconds(math.MaxUint64)}},
		{"ttl a second past 100 years", &streamv1.CreateStreamRequest{TtlSeconds: ttlSeconds(stream.MaxTTLSeconds + 1)}},
		{"expires-at before the epoch", &streamv1.CreateStreamRequest{ExpiresAt: "1969-07-20T20:17:40Z"}},
		{"expires-at at the epoch", &streamv1.CreateStreamRequest{ExpiresAt: "1970-01-01T00:00:00Z"}},
		{"expires-at year zero", &streamv1.CreateStreamRequest{ExpiresAt: "0000-01-01T00:00:00Z"}},
		{"expires-at not rfc 3339", &streamv1.CreateStreamRequest{ExpiresAt: "tomorrow"}},
	}
	for i, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("refused-%d", i)
			tc.req.Ref, tc.req.ContentType, tc.req.Body, tc.req.HasBody = ref(name), "text/plain", []byte("body"), true
			before := e.status(e.GroupOf(key(name))).Commit
			_, err := e.CreateStream(t.Context(), tc.req)
			wantCode(t, "CreateStream", err, fault.ErrInvalidArgument)
			wantCode(t, "Head after the refusal", headErr(t, e, name), fault.ErrStreamNotFound)
			if exists(e, name) {
				t.Fatal("the refused create left a stream")
			}
			if after := e.status(e.GroupOf(key(name))).Commit; after != before {
				t.Fatalf("the refused create was proposed: commit %d -> %d", before, after)
			}
		})
	}
	t.Run("100 years keeps the stream and its body", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("century"), ContentType: "text/plain",
			TtlSeconds: ttlSeconds(stream.MaxTTLSeconds), Body: []byte("kept"), HasBody: true})
		clock.Advance(time.Duration(stream.MaxTTLSeconds-1) * time.Second)
		if got := readAll(t, e, "century"); got != "kept" {
			t.Fatalf("read %q after 100 years less a second", got)
		}
		// The read restarted the TTL: 100 years from now it expires.
		clock.Advance(time.Duration(stream.MaxTTLSeconds) * time.Second)
		wantCode(t, "Head 100 years after the last read", headErr(t, e, "century"), fault.ErrStreamNotFound)
	})
	t.Run("expires-at in year 9999", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("y9999"), ExpiresAt: "9999-12-31T23:59:59.999Z"})
		if err := headErr(t, e, "y9999"); err != nil {
			t.Fatalf("Head: %v", err)
		}
	})
}
