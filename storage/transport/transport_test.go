package transport

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	"github.com/ursula/ursula/tests/await"
)

// node is one transport on a fake host.
type node struct {
	id   uint64
	tr   *Transport
	host *fakeHost
	logs *logRecorder
	s    *served
	addr string
}

type nodeSpec struct {
	id      uint64
	cluster string
	peers   map[uint64]int // peer id → index of the spec whose listener it names
}

// startNodes starts one transport per spec on its own loopback listener.
func startNodes(tb testing.TB, tune func(*Config), specs ...nodeSpec) []*node {
	tb.Helper()
	ls := make([]net.Listener, len(specs))
	for i := range specs {
		ls[i] = listen(tb, "")
	}
	var out []*node
	for i, sp := range specs {
		cfg := Config{
			NodeID: sp.id, ClusterID: sp.cluster, Peers: map[uint64]string{},
			BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			RefusedRetry: 30 * time.Millisecond,
		}
		for pid, idx := range sp.peers {
			cfg.Peers[pid] = ls[idx].Addr().String()
		}
		if tune != nil {
			tune(&cfg)
		}
		n := &node{id: sp.id, host: newFakeHost(), logs: newLogRecorder(), addr: ls[i].Addr().String()}
		tr, err := New(cfg, n.host, slog.New(n.logs))
		if err != nil {
			tb.Fatalf("New: %v", err)
		}
		n.tr = tr
		n.s = serve(tb, tr, ls[i])
		out = append(out, n)
	}
	return out
}

func pair(tb testing.TB, clusterA, clusterB string, tune func(*Config)) (a, b *node) {
	tb.Helper()
	ns := startNodes(tb, tune,
		nodeSpec{id: 1, cluster: clusterA, peers: map[uint64]int{2: 1}},
		nodeSpec{id: 2, cluster: clusterB, peers: map[uint64]int{1: 0}},
	)
	return ns[0], ns[1]
}

func TestSendDeliversInOrder(t *testing.T) {
	a, b := pair(t, "c1", "c1", nil)
	const n = 500
	for i := range n {
		m := msg(pb.MessageType_MsgApp, 1, 2)
		m.Index = proto64(uint64(i + 1))
		m.Entries = []*pb.Entry{{Data: bytes.Repeat([]byte{byte(i)}, 100)}}
		a.tr.Send(uint32(i%3), []*pb.Message{m})
	}
	await.True(t, "all messages stepped", func() bool { return len(b.host.stepped()) == n })
	last := map[uint32]uint64{}
	for _, s := range b.host.stepped() {
		if s.m.GetIndex() <= last[s.group] {
			t.Fatalf("group %d: index %d after %d", s.group, s.m.GetIndex(), last[s.group])
		}
		last[s.group] = s.m.GetIndex()
		if s.group != uint32((s.m.GetIndex()-1)%3) {
			t.Fatalf("message %d stepped into group %d", s.m.GetIndex(), s.group)
		}
	}
	st := a.tr.Stats()
	if st.MessagesSent != n || st.BatchesSent == 0 || st.BatchesSent > n || st.BytesSent == 0 {
		t.Fatalf("sender stats %+v", st)
	}
	if len(st.Peers) != 1 || !st.Peers[0].Connected || st.Peers[0].NodeID != 2 {
		t.Fatalf("peer stats %+v", st.Peers)
	}
	if rs := b.tr.Stats(); rs.MessagesReceived != n || rs.BatchesReceived != st.BatchesSent {
		t.Fatalf("receiver stats %+v, sender batches %d", rs, st.BatchesSent)
	}
	if got := a.host.unreachableCount(2); got != 0 {
		t.Fatalf("%d unreachable reports on a healthy link", got)
	}
}

func proto64(v uint64) *uint64 { return &v }

func TestSendUnreachable(t *testing.T) {
	t.Run("unknown peer", func(t *testing.T) {
		a, _ := pair(t, "c1", "c1", nil)
		a.tr.Send(7, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 9)})
		if a.host.unreachableCount(9) != 1 || a.tr.Stats().MessagesDropped != 1 {
			t.Fatalf("unreachable %d, stats %+v", a.host.unreachableCount(9), a.tr.Stats())
		}
	})
	t.Run("peer down", func(t *testing.T) {
		a, b := pair(t, "c1", "c1", nil)
		b.s.stop(t)
		await.True(t, "unreachable reports", func() bool {
			a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
			return a.host.unreachableCount(2) > 0
		})
		if a.tr.Stats().Peers[0].Connected {
			t.Fatal("peer reported connected while down")
		}
	})
	t.Run("queue full", func(t *testing.T) {
		h := newFakeHost()
		tr, err := New(Config{NodeID: 1, ClusterID: "c1", Peers: map[uint64]string{2: "127.0.0.1:1"}, QueueMessages: 4}, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		msgs := make([]*pb.Message, 10)
		for i := range msgs {
			msgs[i] = msg(pb.MessageType_MsgHeartbeat, 1, 2)
		}
		tr.Send(0, msgs) // not running: nothing drains the queue
		if got := h.unreachableCount(2); got != 6 {
			t.Fatalf("%d unreachable reports, want 6", got)
		}
		if st := tr.Stats(); st.MessagesDropped != 6 || st.Peers[0].Queued != 4 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestSnapshotTransfer(t *testing.T) {
	a, b := pair(t, "c1", "c1", func(c *Config) { c.SnapshotChunkBytes = 64 << 10 })
	data := make([]byte, 300<<10+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	idx, term := uint64(42), uint64(3)
	m := msg(pb.MessageType_MsgSnap, 1, 2)
	m.Term = &term
	m.Snapshot = &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{Index: &idx, Term: &term}}
	a.tr.Send(5, []*pb.Message{m})
	await.True(t, "snapshot report", func() bool { return len(a.host.snapshotReports()) == 1 })
	if r := a.host.snapshotReports()[0]; r != (snapReport{group: 5, to: 2, failed: false}) {
		t.Fatalf("report %+v", r)
	}
	got := b.host.stepped()
	if len(got) != 1 || got[0].group != 5 || got[0].m.GetType() != pb.MessageType_MsgSnap {
		t.Fatalf("stepped %+v", got)
	}
	s := got[0].m.GetSnapshot()
	if !bytes.Equal(s.GetData(), data) || s.GetMetadata().GetIndex() != 42 || got[0].m.GetTerm() != 3 {
		t.Fatalf("snapshot differs: %d bytes, metadata %v", len(s.GetData()), s.GetMetadata())
	}
	if len(m.GetSnapshot().GetData()) != len(data) {
		t.Fatal("the sender's message was modified")
	}
	if st := a.tr.Stats(); st.SnapshotsSent != 1 || st.SnapshotBytesSent != uint64(len(data)) {
		t.Fatalf("sender stats %+v", st)
	}
	if st := b.tr.Stats(); st.SnapshotsReceived != 1 {
		t.Fatalf("receiver stats %+v", st)
	}

	t.Run("failed", func(t *testing.T) {
		b.s.stop(t)
		a.tr.Send(6, []*pb.Message{m})
		await.True(t, "failed snapshot report", func() bool { return len(a.host.snapshotReports()) == 2 })
		if r := a.host.snapshotReports()[1]; r != (snapReport{group: 6, to: 2, failed: true}) {
			t.Fatalf("report %+v", r)
		}
	})
}

func TestBadMessagesDoNotEndStream(t *testing.T) {
	_, b := pair(t, "c1", "c1", nil)
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadataContext(t.Context(), "c1", 1)
	stream, err := raftv1.NewRaftServiceClient(cc).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	good, _ := marshal(msg(pb.MessageType_MsgHeartbeat, 1, 2))
	other, _ := marshal(msg(pb.MessageType_MsgHeartbeat, 1, 3))
	batch := &raftv1.MessageBatch{Messages: []*raftv1.GroupMessage{
		{GroupId: 1, Message: []byte{0xff, 0xff, 0xff}},
		{GroupId: 1, Message: other},
		{GroupId: 1, Message: good},
	}}
	if err := stream.Send(batch); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&raftv1.MessageBatch{Messages: []*raftv1.GroupMessage{{GroupId: 2, Message: good}}}); err != nil {
		t.Fatal(err)
	}
	await.True(t, "good messages stepped", func() bool { return len(b.host.stepped()) == 2 })
	if st := b.tr.Stats(); st.BadMessages != 2 {
		t.Fatalf("bad messages %d, want 2", st.BadMessages)
	}
	_ = stream.CloseSend()
}

func TestProbeAndShedState(t *testing.T) {
	a, b := pair(t, "c1", "c1", nil)
	if _, err := a.tr.Probe(t.Context(), 2, nil); status.Code(err) != codes.Unavailable {
		t.Fatalf("Probe without a callback = %v, want Unavailable", err)
	}
	b.tr.SetProbeFunc(func(groups []uint32) []*raftv1.ProbeResponse_GroupState {
		var out []*raftv1.ProbeResponse_GroupState
		for _, g := range groups {
			out = append(out, &raftv1.ProbeResponse_GroupState{GroupId: g, HasState: g%2 == 0, LeaderId: 2, Term: 7})
		}
		return out
	})
	resp, err := a.tr.Probe(t.Context(), 2, []uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetGroups()) != 2 || !resp.GetGroups()[0].GetHasState() || resp.GetGroups()[1].GetHasState() || resp.GetGroups()[1].GetTerm() != 7 {
		t.Fatalf("probe %v", resp)
	}
	if _, err := a.tr.Probe(t.Context(), 5, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Probe of an unknown peer = %v", err)
	}

	b.tr.SetShedStateFunc(func() *raftv1.ShedState {
		return &raftv1.ShedState{State: "draining", ShouldAcceptTransfer: false, Bits: 3}
	})
	ss, err := a.tr.GetShedState(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if ss.GetClusterId() != "c1" || ss.GetNodeId() != 2 || ss.GetState() != "draining" || ss.GetBits() != 3 {
		t.Fatalf("shed state %v", ss)
	}
	b.tr.SetShedStateFunc(func() *raftv1.ShedState { return &raftv1.ShedState{ClusterId: "other"} })
	if _, err := a.tr.GetShedState(t.Context(), 2); !errors.Is(err, ErrPeerClusterMismatch) {
		t.Fatalf("GetShedState answering another cluster = %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	t.Run("close without run", func(t *testing.T) {
		tr, err := New(Config{NodeID: 1, ClusterID: "c", Peers: map[uint64]string{2: "127.0.0.1:1"}}, newFakeHost(), nil)
		if err != nil {
			t.Fatal(err)
		}
		tr.Close()
		tr.Close()
		if err := tr.Run(t.Context()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Run after Close = %v", err)
		}
		if _, err := tr.Probe(t.Context(), 2, nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Probe after Close = %v", err)
		}
		tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
	})
	t.Run("run ends with its context", func(t *testing.T) {
		tr, err := New(Config{NodeID: 1, ClusterID: "c", Peers: map[uint64]string{2: "127.0.0.1:1"}}, newFakeHost(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- tr.Run(ctx) }()
		tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
		// The sender may or may not be dialing when the context ends: Run
		// must return either way.
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
		tr.Close()
	})
	t.Run("invalid config", func(t *testing.T) {
		for name, cfg := range map[string]Config{
			"no node id":    {ClusterID: "c"},
			"no cluster id": {NodeID: 1},
			"bad address":   {NodeID: 1, ClusterID: "c", Peers: map[uint64]string{2: "nohostport"}},
			"batch too big": {NodeID: 1, ClusterID: "c", MaxMessageBytes: 1 << 20, MaxBatchBytes: 2 << 20},
		} {
			if _, err := New(cfg, nil, nil); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
			}
		}
		// Defaults follow a small message limit instead of failing.
		if _, err := New(Config{NodeID: 1, ClusterID: "c", MaxMessageBytes: 1 << 20}, nil, nil); err != nil {
			t.Errorf("New with a 1 MiB message limit: %v", err)
		}
	})
}

func TestAddRemovePeer(t *testing.T) {
	ns := startNodes(t, nil,
		nodeSpec{id: 1, cluster: "c1"},
		nodeSpec{id: 2, cluster: "c1"},
	)
	a, b := ns[0], ns[1]
	a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
	if a.host.unreachableCount(2) != 1 {
		t.Fatal("message to a peer not yet added was not reported unreachable")
	}
	// b takes calls only from its peers: it learns a first.
	if err := b.tr.AddPeer(1, a.addr); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.AddPeer(2, b.addr); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.AddPeer(1, b.addr); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("AddPeer(self) = %v", err)
	}
	a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
	await.True(t, "delivery to an added peer", func() bool { return len(b.host.stepped()) == 1 })
	if ps := a.tr.Stats().Peers; len(ps) != 1 || ps[0].NodeID != 2 || !ps[0].Connected {
		t.Fatalf("peers %+v", ps)
	}
	a.tr.RemovePeer(2)
	a.tr.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 1, 2)})
	if a.host.unreachableCount(2) != 2 || len(a.tr.Stats().Peers) != 0 {
		t.Fatalf("after RemovePeer: unreachable %d, peers %+v", a.host.unreachableCount(2), a.tr.Stats().Peers)
	}
	if _, err := a.tr.Probe(t.Context(), 2, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Probe of a removed peer = %v", err)
	}
}
