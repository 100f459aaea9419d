package transport

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	"github.com/ursula/ursula/tests/await"
)

func TestPeerClusterMismatch(t *testing.T) {
	a, b := pair(t, "alpha", "beta", nil)
	// Both senders open their streams on their own; each is refused, counted
	// on both sides, and retried every RefusedRetry (30ms here).
	await.True(t, "repeated refusals", func() bool {
		a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
		return a.tr.Stats().PeerClusterRefusals >= 8 && b.tr.Stats().PeerClusterRefusals >= 8
	})
	if len(a.host.stepped()) != 0 || len(b.host.stepped()) != 0 {
		t.Fatal("a refused peer's messages were stepped")
	}
	if a.host.unreachableCount(2) == 0 {
		t.Fatal("messages to a refusing peer were not reported unreachable")
	}

	for _, tc := range []struct {
		n            *node
		peer         uint64
		peerCluster  string
		ownCluster   string
		refusingAddr string
	}{
		{a, 2, "beta", "alpha", b.addr},
		{b, 1, "alpha", "beta", a.addr},
	} {
		ms := tc.n.tr.PeerClusterMismatches()
		if len(ms) != 1 || ms[0].NodeID != tc.peer || ms[0].ClusterID != tc.peerCluster || time.Since(ms[0].At) > time.Minute {
			t.Fatalf("node %d mismatches %+v", tc.n.id, ms)
		}
		if got := tc.n.logs.count(slog.LevelError, "belongs to another cluster"); got != 1 {
			t.Errorf("node %d logged the peer refusing it %d times, want once", tc.n.id, got)
		}
		if got := tc.n.logs.count(slog.LevelError, "refused a raft request from a node of another cluster"); got != 1 {
			t.Errorf("node %d logged refusing the peer %d times, want once", tc.n.id, got)
		}
		ps := tc.n.tr.Stats().Peers
		if len(ps) != 1 || ps[0].Connected || !ps[0].Refused || ps[0].Refusal != "peer_cluster_mismatch" {
			t.Errorf("node %d peer stats %+v", tc.n.id, ps)
		}
	}

	t.Run("refusal names the refusing node", func(t *testing.T) {
		_, err := a.tr.Probe(t.Context(), 2, nil)
		var ref *RefusalError
		if !errors.Is(err, ErrPeerClusterMismatch) || !errors.As(err, &ref) {
			t.Fatalf("Probe = %v, want a cluster refusal", err)
		}
		if ref.NodeID != 2 || ref.ClusterID != "beta" || ref.Address != b.addr {
			t.Fatalf("refusal %+v", ref)
		}
		if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition ||
			!strings.Contains(st.Message(), `node 2 of cluster "beta"`) {
			t.Fatalf("status %v", st)
		}
	})

	t.Run("unconfigured sender is counted, not listed", func(t *testing.T) {
		before := b.tr.Stats().PeerClusterRefusals
		cfg := Config{NodeID: 9, ClusterID: "gamma", Peers: map[uint64]string{2: b.addr}}
		c, err := New(cfg, newFakeHost(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Probe(t.Context(), 2, nil); !errors.Is(err, ErrPeerClusterMismatch) {
			t.Fatalf("Probe = %v", err)
		}
		if b.tr.Stats().PeerClusterRefusals <= before {
			t.Fatal("refusal not counted by the refusing node")
		}
		if got := c.Stats().PeerClusterRefusals; got != 1 {
			t.Fatalf("refused sender counted %d refusals, want 1", got)
		}
		if ms := c.PeerClusterMismatches(); len(ms) != 1 || ms[0].NodeID != 2 || ms[0].ClusterID != "beta" || ms[0].Direction != "outbound" {
			t.Fatalf("refused sender lists %+v", ms)
		}
		for _, m := range b.tr.PeerClusterMismatches() {
			if m.NodeID == 9 {
				t.Fatalf("unconfigured sender listed: %+v", m)
			}
		}
		if got := b.logs.count(slog.LevelError, "refused a raft request from a node of another cluster"); got != 2 {
			t.Fatalf("refusal of a new sender logged %d times in all, want 2", got)
		}
	})

	t.Run("fixed peer is accepted again", func(t *testing.T) {
		addr := b.addr
		b.s.stop(t)
		lis := listen(t, addr)
		h := newFakeHost()
		fixed, err := New(Config{NodeID: 2, ClusterID: "alpha", Peers: map[uint64]string{1: a.addr}}, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		serve(t, fixed, lis)
		await.True(t, "peer accepted", func() bool { return a.tr.Stats().Peers[0].Connected })
		a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
		await.True(t, "message delivered", func() bool { return len(h.stepped()) == 1 })
		if a.tr.Stats().Peers[0].Refused {
			t.Fatal("peer still marked refused")
		}
		if a.logs.count(slog.LevelInfo, "accepts this node again") != 1 {
			t.Fatal("acceptance not logged")
		}
	})
}

func TestUnidentifiedRequestsRefused(t *testing.T) {
	_, b := pair(t, "c1", "c1", nil)
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := raftv1.NewRaftServiceClient(cc)
	check := func(t *testing.T, err error) {
		t.Helper()
		st, _ := status.FromError(err)
		if st.Code() != codes.FailedPrecondition || st.Message() != protocolMismatchText {
			t.Fatalf("status %v, want the protocol mismatch", st)
		}
		ref := AsRefusal(err, b.addr)
		if ref == nil || !errors.Is(ref, ErrProtocolMismatch) {
			t.Fatalf("AsRefusal = %v", ref)
		}
	}
	for name, ctx := range map[string]context.Context{
		"no metadata":   t.Context(),
		"no node id":    metadata.AppendToOutgoingContext(t.Context(), MetadataClusterID, "c1"),
		"no cluster id": metadata.AppendToOutgoingContext(t.Context(), MetadataNodeID, "1"),
		"bad node id":   metadata.AppendToOutgoingContext(t.Context(), MetadataClusterID, "c1", MetadataNodeID, "x"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := client.Probe(ctx, &raftv1.ProbeRequest{})
			check(t, err)
			stream, err := client.Stream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			check(t, err)
		})
	}
	if got := b.tr.Stats().UnidentifiedPeerRefusals; got != 8 {
		t.Fatalf("unidentified refusals %d, want 8", got)
	}
	if got := b.logs.count(slog.LevelWarn, "names no cluster or node id"); got != 1 {
		t.Fatalf("sender address logged %d times, want once", got)
	}
	if len(b.tr.PeerClusterMismatches()) != 0 || b.tr.Stats().PeerClusterRefusals != 0 {
		t.Fatal("unidentified requests counted as cluster mismatches")
	}
}

func TestInterceptors(t *testing.T) {
	tr, err := New(Config{NodeID: 1, ClusterID: "c1", Peers: map[uint64]string{2: "10.0.0.2:4439"}}, newFakeHost(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	called := false
	handler := func(context.Context, any) (any, error) { called = true; return nil, nil }
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(MetadataClusterID, "c2", MetadataNodeID, "2"))
	if _, err := tr.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{}, handler); status.Code(err) != codes.FailedPrecondition || called {
		t.Fatalf("unary interceptor = %v (handler called %v)", err, called)
	}
	// The request came from no address, which is not the peer's IP: not listed.
	if len(tr.PeerClusterMismatches()) != 0 {
		t.Fatalf("listed %+v", tr.PeerClusterMismatches())
	}
	ctx = metadata.NewIncomingContext(t.Context(), metadata.Pairs(MetadataClusterID, "c1", MetadataNodeID, "2"))
	if _, err := tr.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{}, handler); err != nil || !called {
		t.Fatalf("unary interceptor = %v (handler called %v)", err, called)
	}
	streamCalled := false
	ss := &fakeServerStream{ctx: metadata.NewIncomingContext(t.Context(), metadata.MD{})}
	err = tr.StreamServerInterceptor()(nil, ss, &grpc.StreamServerInfo{}, func(any, grpc.ServerStream) error { streamCalled = true; return nil })
	if status.Code(err) != codes.FailedPrecondition || streamCalled {
		t.Fatalf("stream interceptor = %v", err)
	}
}

type fakeServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f *fakeServerStream) Context() context.Context { return f.ctx }

func TestSameHostIfIP(t *testing.T) {
	for _, tc := range []struct {
		addr, remote string
		want         bool
	}{
		{"10.0.0.2:4439", "10.0.0.2", true},
		{"10.0.0.2:4439", "10.0.0.3", false},
		{"[::1]:4439", "::1", true},
		{"node-2.example:4439", "10.9.9.9", true},
		{"10.0.0.2:4439", "", false},
		{"bad", "10.0.0.2", false},
	} {
		if got := sameHostIfIP(tc.addr, tc.remote); got != tc.want {
			t.Errorf("sameHostIfIP(%q, %q) = %v, want %v", tc.addr, tc.remote, got, tc.want)
		}
	}
}

func TestMismatchWindow(t *testing.T) {
	var r refusals
	r.init(time.Minute)
	now := time.Now()
	r.record(Mismatch{NodeID: 3, ClusterID: "x", At: now.Add(-2 * time.Minute)})
	r.record(Mismatch{NodeID: 2, ClusterID: "y", At: now.Add(-time.Second)})
	got := r.list(now, nil)
	if !slices.EqualFunc(got, []Mismatch{{NodeID: 2, ClusterID: "y", At: now.Add(-time.Second)}}, func(a, b Mismatch) bool {
		return a.NodeID == b.NodeID && a.ClusterID == b.ClusterID
	}) {
		t.Fatalf("list %+v", got)
	}
	if !r.seenInbound("k", now) || r.seenInbound("k", now.Add(30*time.Second)) || !r.seenInbound("k", now.Add(2*time.Minute)) {
		t.Fatal("seenInbound does not log once per window")
	}
}
