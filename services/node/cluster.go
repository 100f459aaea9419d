package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/transport"
)

// peerClient reaches other nodes' cluster planes for the engine: command
// forwards, rebuild requests, probes and shed-state checks. Every call
// carries this node's cluster and node ids (the transport's dial options).
type peerClient struct {
	tr        *transport.Transport
	clusterID string
	addrs     map[uint64]string
	maxMsg    int

	mu    sync.Mutex
	conns map[uint64]*grpc.ClientConn
}

func (c *peerClient) conn(id uint64) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[id]; cc != nil {
		return cc, nil
	}
	addr, ok := c.addrs[id]
	if !ok {
		return nil, fmt.Errorf("node: unknown peer %d", id)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.maxMsg), grpc.MaxCallSendMsgSize(c.maxMsg)),
	}, c.tr.DialOptions()...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("node: dial peer %d at %s: %w", id, addr, err)
	}
	c.conns[id] = cc
	return cc, nil
}

func (c *peerClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, cc := range c.conns {
		_ = cc.Close()
		delete(c.conns, id)
	}
}

// Forward implements engine.Forwarder.
func (c *peerClient) Forward(ctx context.Context, leader uint64, g uint32, cmd []byte) (*storagev1.ApplyResult, error) {
	cc, err := c.conn(leader)
	if err != nil {
		return nil, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).Propose(ctx, &raftv1.ForwardProposeRequest{GroupId: g, Command: cmd})
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	var ar storagev1.ApplyResult
	if err := proto.Unmarshal(resp.GetResult(), &ar); err != nil {
		return nil, fmt.Errorf("node: decode forwarded result: %w", err)
	}
	return &ar, nil
}

// RequestRebuild implements engine.Rebuilder.
func (c *peerClient) RequestRebuild(ctx context.Context, leader uint64, g uint32, node uint64) (bool, error) {
	cc, err := c.conn(leader)
	if err != nil {
		return false, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).RequestRebuild(ctx, &raftv1.RequestRebuildRequest{GroupId: g, NodeId: node})
	if err != nil {
		return false, grpcerr.FromStatus(err)
	}
	return resp.GetDone(), nil
}

// Probe implements engine.Prober.
func (c *peerClient) Probe(ctx context.Context, peer uint64, groups []uint32) (*raftv1.ProbeResponse, error) {
	return c.tr.Probe(ctx, peer, groups)
}

// eligible tells handoffs whether a peer takes leaderships: same cluster,
// not draining.
func (c *peerClient) eligible(ctx context.Context, peer uint64) bool {
	st, err := c.tr.GetShedState(ctx, peer)
	return err == nil && st.GetClusterId() == c.clusterID && st.GetShouldAcceptTransfer()
}

// forwardServer runs forwarded commands and rebuild requests on this node.
type forwardServer struct {
	raftv1.UnimplementedForwardServiceServer
	eng *engine.Engine
}

func (f *forwardServer) Propose(ctx context.Context, req *raftv1.ForwardProposeRequest) (*raftv1.ForwardProposeResponse, error) {
	ar, err := f.eng.ProposeForwarded(ctx, req.GetGroupId(), req.GetCommand())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	out, err := proto.Marshal(ar)
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &raftv1.ForwardProposeResponse{Result: out}, nil
}

func (f *forwardServer) RequestRebuild(ctx context.Context, req *raftv1.RequestRebuildRequest) (*raftv1.RequestRebuildResponse, error) {
	done, err := f.eng.RequestRebuild(ctx, req.GetGroupId(), req.GetNodeId())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &raftv1.RequestRebuildResponse{Done: done}, nil
}

// shedState renders the node's leadership-shed state.
func shedState(eng *engine.Engine, clusterID string, nodeID uint64) *raftv1.ShedState {
	if eng.Draining() {
		return &raftv1.ShedState{ClusterId: clusterID, NodeId: nodeID, Bits: 1, State: "maintenance-drain",
			ShouldAcceptTransfer: false, ShouldCampaign: false, ShouldShedCurrentLeaders: true}
	}
	return &raftv1.ShedState{ClusterId: clusterID, NodeId: nodeID, Bits: 0, State: "normal",
		ShouldAcceptTransfer: true, ShouldCampaign: true, ShouldShedCurrentLeaders: false}
}

// newCluster builds the transport and peer clients of a multi-node engine
// and connects them to it.
func newCluster(cfg Config, eng *engine.Engine, logger *slog.Logger) (*transport.Transport, *peerClient, error) {
	ecfg := eng.Config()
	peers := make(map[uint64]string, len(ecfg.Peers))
	clients := make(map[uint64]string, len(ecfg.Peers))
	for _, p := range ecfg.Peers {
		peers[p.ID] = p.ClusterURL
		clients[p.ID] = p.ClientURL
	}
	tr, err := transport.New(transport.Config{
		NodeID:          ecfg.NodeID,
		ClusterID:       cfg.ClusterID,
		Peers:           peers,
		MaxMessageBytes: cfg.MaxMessageBytes,
		// A restarted peer should hear from its leaders within a second.
		BackoffMax: time.Second,
		Probe:      eng.ProbeAnswer,
		ShedState:  func() *raftv1.ShedState { return shedState(eng, cfg.ClusterID, ecfg.NodeID) },
	}, eng.Host(), logger.With("component", "transport"))
	if err != nil {
		return nil, nil, err
	}
	pc := &peerClient{tr: tr, clusterID: cfg.ClusterID, addrs: peers, maxMsg: cfg.MaxMessageBytes, conns: map[uint64]*grpc.ClientConn{}}
	eng.SetCluster(engine.ClusterDeps{Transport: tr, Forwarder: pc, Prober: pc, Rebuilder: pc})
	eng.SetShedPeer(pc.eligible)
	return tr, pc, nil
}
