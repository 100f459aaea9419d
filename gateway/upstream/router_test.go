package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/tests/await"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newRouter returns a router over seeds (not running its refresh loop
// unless run is set), closed at the end of the test.
func newRouter(t testing.TB, seeds []string, run bool) *Router {
	t.Helper()
	r, err := New(Config{Nodes: seeds, RetryAfter: 1500 * time.Millisecond, DialTimeout: time.Second, RefreshInterval: 50 * time.Millisecond, LeaderWait: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(r.Close)
	return r
}

// learn makes r learn the cluster (its nodes and leaders) now.
func learn(t testing.TB, r *Router) {
	t.Helper()
	if _, err := r.GetClusterInfo(t.Context(), &streamv1.GetClusterInfoRequest{}); err != nil {
		t.Fatalf("learn: %v", err)
	}
}

func ref(b, s string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: b, Stream: s} }

// servedBy runs one call and returns the node that served it ("node<N>").
type call struct {
	name   string
	method string
	run    func(ctx context.Context, r *Router, b, s string) (string, error)
}

var calls = []call{
	{"create bucket", "CreateBucket", func(ctx context.Context, r *Router, b, _ string) (string, error) {
		_, err := r.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: b})
		return "", err
	}},
	{"create stream", "CreateStream", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref(b, s)})
		return resp.GetInfo().GetContentType(), err
	}},
	{"append", "Append", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.Append(ctx, &streamv1.AppendRequest{Ref: ref(b, s), Body: []byte("x")})
		return resp.GetNextOffset(), err
	}},
	{"delete", "DeleteStream", func(ctx context.Context, r *Router, b, s string) (string, error) {
		_, err := r.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref(b, s)})
		return "", err
	}},
	{"head", "Head", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.Head(ctx, &streamv1.HeadRequest{Ref: ref(b, s)})
		return resp.GetInfo().GetContentType(), err
	}},
	{"read now", "Read", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.Read(ctx, &streamv1.ReadRequest{Ref: ref(b, s), Offset: "now"})
		return string(resp.GetData()), err
	}},
	{"long poll", "Read", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.Read(ctx, &streamv1.ReadRequest{Ref: ref(b, s), Offset: "-1", WaitMs: 10})
		return string(resp.GetData()), err
	}},
	{"history read", "Read", func(ctx context.Context, r *Router, b, s string) (string, error) {
		resp, err := r.Read(ctx, &streamv1.ReadRequest{Ref: ref(b, s), Offset: "-1"})
		return string(resp.GetData()), err
	}},
	{"subscribe", "Subscribe", func(ctx context.Context, r *Router, b, s string) (string, error) {
		st, err := r.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref(b, s), Offset: "-1"})
		if err != nil {
			return "", err
		}
		var by string
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return by, nil
			}
			if err != nil {
				return by, err
			}
			by = string(m.GetChunk().GetData())
		}
	}},
	{"list streams", "ListStreams", func(ctx context.Context, r *Router, b, _ string) (string, error) {
		resp, err := r.ListStreams(ctx, &streamv1.ListStreamsRequest{Bucket: b})
		return resp.GetNextCursor(), err
	}},
}

func TestRoutesToGroupLeader(t *testing.T) {
	c := newFakeCluster(t, 3, 6)
	for g := range uint32(6) {
		c.setLeader(uint64(g%3)+1, g)
	}
	r := newRouter(t, c.addrs()[:1], false)
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			for g := range uint32(6) {
				s := c.streamInGroup("b", g)
				if tc.method == "CreateBucket" || tc.method == "ListStreams" {
					g = 0 // the bucket group's leader; one call per listing page
				}
				want := c.leader(g)
				before := c.node(want).count(tc.method)
				by, err := tc.run(t.Context(), r, "b", s)
				if err != nil {
					t.Fatalf("group %d: %v", g, err)
				}
				if by != "" && by != "node"+strconv.FormatUint(want, 10) {
					t.Fatalf("group %d: served by %s, want node%d", g, by, want)
				}
				if got := c.node(want).count(tc.method); got != before+1 {
					t.Fatalf("group %d: leader saw %d calls, want %d", g, got, before+1)
				}
			}
		})
	}
	st := r.Stats()
	if st.NotLeader != 0 || st.Retries != 0 || st.LeaderCacheMisses != 0 {
		t.Fatalf("stats = %+v, want no misses, retries or NOT_LEADER", st)
	}
	if len(st.Nodes) != 3 || st.GroupCount != 6 || st.SingleNode {
		t.Fatalf("stats = %+v, want 3 nodes, 6 groups", st)
	}
}

func TestRetryOnceAfterNotLeader(t *testing.T) {
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 1)
			r := newRouter(t, c.addrs(), false)
			if _, err := r.GetClusterInfo(t.Context(), &streamv1.GetClusterInfoRequest{}); err != nil {
				t.Fatalf("learn: %v", err)
			}
			// Leadership moved to node 2; the router still believes node 1.
			c.setLeader(2)
			if tc.name == "history read" {
				c.node(1).mu.Lock()
				c.node(1).refuseHistory = true
				c.node(1).mu.Unlock()
			}
			by, err := tc.run(t.Context(), r, "b", "s")
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if by != "" && by != "node2" {
				t.Fatalf("served by %s, want node2", by)
			}
			if got := c.node(1).count(tc.method); got != 1 {
				t.Fatalf("old leader saw %d calls, want 1", got)
			}
			st := r.Stats()
			if st.NotLeader != 1 || st.Retries != 1 {
				t.Fatalf("stats = %+v, want 1 NOT_LEADER, 1 retry", st)
			}
			// The cache learned: the next call goes straight to node 2.
			if _, err := tc.run(t.Context(), r, "b", "s"); err != nil {
				t.Fatalf("second call: %v", err)
			}
			if got := c.node(1).count(tc.method); got != 1 {
				t.Fatalf("old leader saw %d calls after learning, want 1", got)
			}
			if got := c.node(2).count(tc.method); got != 2 {
				t.Fatalf("new leader saw %d calls, want 2", got)
			}
		})
	}
}

// wantUnavailable checks err is UNAVAILABLE with retry_after_ms=1500.
func wantUnavailable(t testing.TB, err error) {
	t.Helper()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want UNAVAILABLE", err)
	}
	de := grpcerr.FromStatus(err)
	if de.Code != errcode.Unavailable || de.Metadata[errcode.KeyRetryAfterMS] != "1500" {
		t.Fatalf("err = %v, want UNAVAILABLE with retry_after_ms=1500", de)
	}
}

func TestNoRetry(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode errcode.Code
	}{
		{"outcome unknown", grpcerr.ToStatus(errcode.New(errcode.OutcomeUnknown, "leadership lost after proposal")), errcode.OutcomeUnknown},
		{"node unavailable", grpcerr.ToStatus(errcode.New(errcode.Unavailable, "shutting down")), errcode.Unavailable},
		{"overloaded", grpcerr.ToStatus(errcode.New(errcode.Overloaded, "hot bytes over cap").With(errcode.KeyRetryAfterMS, "200")), errcode.Overloaded},
		{"stream closed", grpcerr.ToStatus(errcode.New(errcode.StreamClosed, "closed")), errcode.StreamClosed},
		{"link failed after sending", status.Error(codes.Unavailable, "error reading from server: EOF"), errcode.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 1)
			r := newRouter(t, c.addrs(), false)
			c.node(1).fail("Append", tc.err)
			_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
			if got := grpcerr.FromStatus(err).Code; got != tc.wantCode {
				t.Fatalf("err = %v, want %s", err, tc.wantCode)
			}
			if status.Code(err) != status.Code(tc.err) {
				t.Fatalf("status code = %v, want %v", status.Code(err), status.Code(tc.err))
			}
			total := 0
			for _, n := range c.nodes {
				total += n.count("Append")
			}
			if total != 1 {
				t.Fatalf("%d attempts, want 1", total)
			}
			if st := r.Stats(); st.Retries != 0 {
				t.Fatalf("retries = %d, want 0", st.Retries)
			}
		})
	}
}

// TestNotLeaderChain: a write that meets NOT_LEADER follows the hinted
// leader while the attempts last (a refusal proposed nothing), and ends
// UNAVAILABLE when the last attempt is refused too.
func TestNotLeaderChain(t *testing.T) {
	notLeader := func(id uint64) error {
		return grpcerr.ToStatus(errcode.New(errcode.NotLeader, "moved").With(errcode.KeyLeaderID, strconv.FormatUint(id, 10)))
	}
	tests := []struct {
		name string
		// refusals scripts node i+1's first answer (nil: it serves).
		refusals      []error
		wantOK        bool
		wantAttempts  [3]int
		wantNotLeader uint64
		wantRetries   uint64
	}{
		{
			name:     "moved twice: served at the third node",
			refusals: []error{notLeader(2), notLeader(3), nil},
			wantOK:   true, wantAttempts: [3]int{1, 1, 1}, wantNotLeader: 2, wantRetries: 2,
		},
		{
			name:     "refused at every attempt: unavailable",
			refusals: []error{notLeader(2), notLeader(3), notLeader(1)},
			wantOK:   false, wantAttempts: [3]int{1, 1, 1}, wantNotLeader: 3, wantRetries: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 1)
			r := newRouter(t, c.addrs(), false)
			if _, err := r.GetClusterInfo(t.Context(), &streamv1.GetClusterInfoRequest{}); err != nil {
				t.Fatalf("learn: %v", err)
			}
			c.setLeader(3) // the router still believes node 1
			for i, err := range tc.refusals {
				if err != nil {
					c.node(uint64(i+1)).fail("Append", err)
				}
			}
			_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
			if tc.wantOK && err != nil {
				t.Fatalf("Append: %v", err)
			}
			if !tc.wantOK {
				wantUnavailable(t, err)
			}
			if got := [3]int{c.node(1).count("Append"), c.node(2).count("Append"), c.node(3).count("Append")}; got != tc.wantAttempts {
				t.Fatalf("attempts = %v, want %v", got, tc.wantAttempts)
			}
			if st := r.Stats(); st.NotLeader != tc.wantNotLeader || st.Retries != tc.wantRetries {
				t.Fatalf("stats = %+v, want %d NOT_LEADER, %d retries", st, tc.wantNotLeader, tc.wantRetries)
			}
		})
	}
}

// TestWaitsForLeader: a write refused by a node that knows no leader (an
// election or a handoff in flight) waits, polling the nodes, until a
// leader is known, and goes there instead of failing with a 503.
func TestWaitsForLeader(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r, err := New(Config{Nodes: c.addrs(), DialTimeout: time.Second, RefreshInterval: time.Hour, LeaderWait: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	learn(t, r)
	polls := func() int {
		n := 0
		for _, fn := range c.nodes {
			n += fn.count("GetClusterInfo")
		}
		return n
	}
	before := polls()
	c.setLeader(0) // an election is running: nobody knows a leader
	done := make(chan error, 1)
	var by string
	go func() {
		resp, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s"), Body: []byte("x")})
		by = resp.GetNextOffset()
		done <- err
	}()
	// Two rounds of polls after the refusal: the call is waiting.
	await.True(t, "the router to poll for a leader", func() bool { return polls() >= before+2*len(c.nodes) })
	c.setLeader(2)
	if err := <-done; err != nil {
		t.Fatalf("Append: %v", err)
	}
	if by != "node2" {
		t.Fatalf("served by %q, want node2", by)
	}
	if st := r.Stats(); st.NoLeader != 0 {
		t.Fatalf("stats = %+v, want no no-leader answer", st)
	}
}

// TestRefusingLeaderThatLeadsAgain: a leader that refused a write without
// naming a leader (it stepped down, and won the election that followed)
// is tried again once a poll made after the refusal finds it claiming the
// group: waiting for another leader would end in a 503 although the group
// has one.
func TestRefusingLeaderThatLeadsAgain(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r, err := New(Config{Nodes: c.addrs(), DialTimeout: time.Second, RefreshInterval: time.Hour, LeaderWait: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	learn(t, r)
	c.node(1).fail("Append", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "stepped down, no leader known")))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := r.Append(ctx, &streamv1.AppendRequest{Ref: ref("b", "s"), Body: []byte("x")})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	if by := resp.GetNextOffset(); by != "node1" || c.node(1).count("Append") != 2 {
		t.Fatalf("served by %q after %d attempts on node 1, want node1 after 2", by, c.node(1).count("Append"))
	}
	if st := r.Stats(); st.NoLeader != 0 {
		t.Fatalf("stats = %+v, want no no-leader answer", st)
	}
}

// TestRefusingNodeNotTriedOnAStaleClaim: the node that refused is not tried
// again while only other nodes name it (their view may predate the
// refusal): the call waits for a leader, as for any refusal without one.
func TestRefusingNodeNotTriedOnAStaleClaim(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs(), false)
	learn(t, r)
	c.setLeader(0)
	c.mu.Lock()
	c.reported = []uint64{1} // the others still name node 1, which answers no poll
	c.mu.Unlock()
	for range 1000 {
		c.node(1).fail("GetClusterInfo", errors.New("node 1 does not answer polls"))
	}
	_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s"), Body: []byte("x")})
	wantUnavailable(t, err)
	if got := c.node(1).count("Append"); got != 1 {
		t.Fatalf("node 1 saw %d appends, want 1", got)
	}
}

// TestLeaderWaitEndsBeforeTheCaller: a caller whose deadline comes before
// Config.LeaderWait gets "no known leader" (UNAVAILABLE with its retry
// hint), not its own deadline.
func TestLeaderWaitEndsBeforeTheCaller(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r, err := New(Config{Nodes: c.addrs(), DialTimeout: time.Second, RefreshInterval: time.Hour, RetryAfter: 1500 * time.Millisecond, LeaderWait: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	c.setLeader(0)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = r.Append(ctx, &streamv1.AppendRequest{Ref: ref("b", "s")})
	wantUnavailable(t, err)
}

func TestNoKnownLeader(t *testing.T) {
	tests := []struct {
		name string
		call call
	}{
		{"append", calls[2]},
		{"head", calls[4]},
		{"subscribe", calls[8]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 2)
			c.setLeader(0)
			r := newRouter(t, c.addrs(), false)
			_, err := tc.call.run(t.Context(), r, "b", "s")
			wantUnavailable(t, err)
			if st := r.Stats(); st.NoLeader == 0 || st.LeaderCacheMisses != 1 {
				t.Fatalf("stats = %+v, want a no-leader answer and a cache miss", st)
			}
			for _, n := range c.nodes {
				if got := n.count(tc.call.method); got != 0 {
					t.Fatalf("node %d saw %d calls, want 0", n.id, got)
				}
			}
		})
	}
}

func TestNotLeaderWithoutLeaderIsUnavailable(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs(), false)
	learn(t, r)
	c.setLeader(0) // an election is running
	_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	wantUnavailable(t, err)
	if got := c.node(1).count("Append"); got != 1 {
		t.Fatalf("old leader saw %d calls, want 1", got)
	}
}

func TestNoNodeReachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	r := newRouter(t, []string{addr}, false)
	_, err = r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	wantUnavailable(t, err)
	if st := r.Stats(); st.RefreshFailures == 0 {
		t.Fatalf("stats = %+v, want a failed refresh", st)
	}
}

func TestFollowerServesHistory(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs(), false)
	learn(t, r)
	c.node(1).stop() // the leader dies; nobody has noticed yet
	history := &streamv1.ReadRequest{Ref: ref("b", "s"), Offset: "-1"}
	resp, err := r.Read(t.Context(), history)
	if err != nil {
		t.Fatalf("history read: %v", err)
	}
	if by := string(resp.GetData()); by != "node2" && by != "node3" {
		t.Fatalf("served by %s, want a follower", by)
	}
	// The leader is now known down: history goes to followers directly.
	before := r.Stats().Retries
	for range 4 {
		if _, err := r.Read(t.Context(), history); err != nil {
			t.Fatalf("history read: %v", err)
		}
	}
	if st := r.Stats(); st.Retries != before {
		t.Fatalf("retries went %d → %d, want none once the leader is known down", before, st.Retries)
	}
	// Tail reads need the leader, which the cluster still names.
	_, err = r.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("b", "s"), Offset: "now"})
	wantUnavailable(t, err)
	var down []uint64
	for _, n := range r.Stats().Nodes {
		if !n.Up {
			down = append(down, n.ID)
		}
	}
	if len(down) != 1 || down[0] != 1 {
		t.Fatalf("down nodes = %v, want [1]", down)
	}
}

func TestFailoverUpdatesCache(t *testing.T) {
	tests := []struct {
		name string
		kill bool // the old leader dies (else it answers NOT_LEADER)
	}{
		{"old leader answers not leader", false},
		{"old leader dies", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 4)
			r := newRouter(t, c.addrs(), true)
			app := func() (string, error) {
				resp, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
				return resp.GetNextOffset(), err
			}
			if by, err := app(); err != nil || by != "node1" {
				t.Fatalf("append = %q, %v; want node1", by, err)
			}
			if tc.kill {
				c.node(1).stop()
				waitConnDown(t, r, 1)
			}
			c.setLeader(3)
			by, err := app()
			if err != nil || by != "node3" {
				t.Fatalf("append after failover = %q, %v; want node3", by, err)
			}
			if st := r.Stats(); st.Retries != 1 {
				t.Fatalf("retries = %d, want 1", st.Retries)
			}
			if by, err := app(); err != nil || by != "node3" {
				t.Fatalf("append = %q, %v; want node3", by, err)
			}
			if st := r.Stats(); st.Retries != 1 {
				t.Fatalf("retries = %d, want still 1 (the cache learned)", st.Retries)
			}
			// The refresh loop sees the new leader for every group.
			leads := func() int {
				for _, n := range r.Stats().Nodes {
					if n.ID == 3 {
						return n.Leads
					}
				}
				return 0
			}
			if !await.Until(await.DefaultTimeout, func() bool { return leads() == 4 }) {
				t.Fatalf("node 3 leads %d groups in the cache, want 4: %+v", leads(), r.Stats())
			}
		})
	}
}

func TestLearnsLeaderAddress(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	c.hidden[3] = true // node 3 is not listed yet
	r := newRouter(t, c.addrs()[:1], false)
	learn(t, r)
	c.setLeader(3)
	resp, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	if err != nil || resp.GetNextOffset() != "node3" {
		t.Fatalf("append = %v, %v; want node3", resp, err)
	}
	if n := len(r.Stats().Nodes); n != 3 {
		t.Fatalf("router knows %d nodes, want 3", n)
	}
}

func TestSingleNode(t *testing.T) {
	c := newFakeCluster(t, 1, 4)
	r := newRouter(t, c.addrs(), true)
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			by, err := tc.run(t.Context(), r, "b", "s")
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if by != "" && by != "node1" {
				t.Fatalf("served by %s", by)
			}
		})
	}
	// Errors pass through untouched, NOT_LEADER included.
	c.setLeader(0)
	_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	if got := grpcerr.FromStatus(err).Code; got != errcode.NotLeader {
		t.Fatalf("err = %v, want NOT_LEADER passed through", err)
	}
	st := r.Stats()
	if !st.SingleNode || st.LeaderCacheHits+st.LeaderCacheMisses+st.Retries != 0 {
		t.Fatalf("stats = %+v, want single-node mode without routing", st)
	}
}

func TestSubscribeReopensAtLeader(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs(), false)
	learn(t, r)
	c.setLeader(2)
	st, err := r.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("b", "s")})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	var got []string
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		got = append(got, string(m.GetChunk().GetData()))
	}
	if len(got) != 2 || got[0] != "node2" || got[1] != "node2" {
		t.Fatalf("chunks = %v, want 2 from node2", got)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		want    failure
		notSent bool
	}{
		{"not leader", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "x")), failNotLeader, false},
		{"domain unavailable", grpcerr.ToStatus(errcode.New(errcode.Unavailable, "x")), failOther, false},
		{"outcome unknown", grpcerr.ToStatus(errcode.New(errcode.OutcomeUnknown, "x")), failOther, false},
		{"dial error", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), failTransport, true},
		{"read error", status.Error(codes.Unavailable, "error reading from server: EOF"), failTransport, false},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), failOther, false},
		{"plain error", errors.New("x"), failOther, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := classify(tc.err); got != tc.want {
				t.Fatalf("classify = %d, want %d", got, tc.want)
			}
			if got := notSent(tc.err); got != tc.notSent {
				t.Fatalf("notSent = %v, want %v", got, tc.notSent)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults with a seed", Config{Nodes: []string{"a:1"}}, true},
		{"no seeds", Config{}, false},
		{"empty seed", Config{Nodes: []string{" "}}, false},
		{"negative interval", Config{Nodes: []string{"a:1"}, RefreshInterval: -1}, false},
		{"negative message size", Config{Nodes: []string{"a:1"}, MaxMessageBytes: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// waitConnDown waits until the router's connection to node id, and the
// append call open on it, have noticed the node is gone: an append sent on
// a call that broke under it may have been applied, and is not retried.
func waitConnDown(t testing.TB, r *Router, id uint64) {
	t.Helper()
	await.True(t, fmt.Sprintf("the connection to node %d to leave READY", id), func() bool {
		for _, n := range r.Stats().Nodes {
			if n.ID == id && n.Conn != "READY" {
				return true
			}
		}
		return false
	})
	await.True(t, fmt.Sprintf("the append call to node %d to end", id), func() bool {
		v := r.view.Load()
		nc := v.nodes[id]
		if nc == nil || nc.appends == nil {
			return true
		}
		nc.appends.mu.Lock()
		defer nc.appends.mu.Unlock()
		return nc.appends.cur == nil
	})
}

func TestWriteAfterLinkLossIsNotRetried(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs(), false)
	if _, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")}); err != nil {
		t.Fatalf("append: %v", err)
	}
	// The leader fails the link mid-call: the write may have been proposed.
	c.node(1).fail("Append", status.Error(codes.Unavailable, "error reading from server: EOF"))
	c.setLeader(2)
	_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	if status.Code(err) != codes.Unavailable || grpcerr.FromStatus(err).Metadata[errcode.KeyRetryAfterMS] != "" {
		t.Fatalf("err = %v, want the link error as is", err)
	}
	if got := c.node(2).count("Append"); got != 0 {
		t.Fatalf("new leader saw %d appends, want 0 (no retry)", got)
	}
	// The cache forgot node 1: the next write re-learns and goes to node 2.
	resp, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	if err != nil || resp.GetNextOffset() != "node2" {
		t.Fatalf("append = %v, %v; want node2", resp, err)
	}
}

func TestConcurrentFailover(t *testing.T) {
	c := newFakeCluster(t, 3, 8)
	r := newRouter(t, c.addrs(), true)
	ctx := t.Context()
	done := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(3 * time.Millisecond): // pacing, not synchronization
			}
			c.setLeader(uint64(i%3) + 1)
		}
	}()
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			var err error
			for i := range 50 {
				s := "s" + strconv.Itoa(w*100+i)
				_, e := r.Append(ctx, &streamv1.AppendRequest{Ref: ref("b", s)})
				if e != nil && status.Code(e) != codes.Unavailable {
					err = e
				}
				if _, e := r.Read(ctx, &streamv1.ReadRequest{Ref: ref("b", s), Offset: "-1"}); e != nil && status.Code(e) != codes.Unavailable {
					err = e
				}
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Errorf("call failed with a non-UNAVAILABLE error: %v", err)
		}
	}
	close(done)
	<-flipped
	if st := r.Stats(); st.NotLeader == 0 {
		t.Logf("no NOT_LEADER seen: %+v", st)
	}
}

func BenchmarkSingleNodeAppend(b *testing.B) {
	c := newFakeCluster(b, 1, 4)
	r := newRouter(b, c.addrs(), false)
	req := &streamv1.AppendRequest{Ref: ref("b", "s"), Body: []byte("x")}
	if _, err := r.Append(b.Context(), req); err != nil {
		b.Fatal(err)
	}
	b.Run("direct", func(b *testing.B) {
		client := r.view.Load().single.client
		for b.Loop() {
			if _, err := client.Append(b.Context(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("router", func(b *testing.B) {
		for b.Loop() {
			if _, err := r.Append(b.Context(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkRouteLeaderAppend(b *testing.B) {
	c := newFakeCluster(b, 3, 4)
	r := newRouter(b, c.addrs(), false)
	req := &streamv1.AppendRequest{Ref: ref("b", "s"), Body: []byte("x")}
	if _, err := r.Append(b.Context(), req); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := r.Append(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

func TestNodeSetChanges(t *testing.T) {
	c := newFakeCluster(t, 3, 2)
	r := newRouter(t, c.addrs()[:1], true)
	waitNodes := func(want int) {
		t.Helper()
		await.True(t, fmt.Sprintf("the router to know %d nodes", want), func() bool {
			return len(r.Stats().Nodes) == want
		})
	}
	waitNodes(3)
	c.mu.Lock()
	c.hidden[3] = true
	c.mu.Unlock()
	waitNodes(2)
	c.mu.Lock()
	delete(c.hidden, 3)
	c.mu.Unlock()
	waitNodes(3)
	if _, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")}); err != nil {
		t.Fatalf("append: %v", err)
	}
}

// TestNodeAddrs checks the addresses the status page reads: the seeds
// before the router learned anything, then every node of the cluster (by
// node id), those only learned included.
func TestNodeAddrs(t *testing.T) {
	c := newFakeCluster(t, 3, 1)
	r := newRouter(t, c.addrs()[1:2], false)
	if got := r.NodeAddrs(); !slices.Equal(got, c.addrs()[1:2]) {
		t.Fatalf("before learning: %v, want the seed", got)
	}
	learn(t, r)
	if got := r.NodeAddrs(); !slices.Equal(got, c.addrs()) {
		t.Fatalf("after learning: %v, want %v", got, c.addrs())
	}
}
