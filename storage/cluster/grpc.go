package cluster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/transport"
)

// GRPC is the cluster plane over gRPC: the Raft transport
// (ursula.raft.v1.RaftService, package transport) and ForwardService, both
// as client and server. Every call carries this node's cluster and node
// ids, which the receiving node checks before decoding anything
// (transport.ServerOptions).
type GRPC struct {
	tr     *transport.Transport
	cfg    Config
	logger *slog.Logger
	local  Local
}

// NewGRPC builds the gRPC cluster plane of a multi-node cluster. It starts
// nothing and dials nobody.
func NewGRPC(cfg Config, logger *slog.Logger) (*GRPC, error) {
	cfg.setDefaults()
	peers := make(map[uint64]string, len(cfg.Peers))
	for _, p := range cfg.Peers {
		peers[p.ID] = p.ClusterURL
	}
	tr, err := transport.New(transport.Config{
		NodeID:          cfg.NodeID,
		ClusterID:       cfg.ClusterID,
		Peers:           peers,
		MaxMessageBytes: cfg.MaxMessageBytes,
		TLS:             cfg.TLS,
		// A restarted peer should hear from its leaders within a second.
		BackoffMax: time.Second,
	}, nil, logger.With("component", "transport"))
	if err != nil {
		return nil, err
	}
	return &GRPC{tr: tr, cfg: cfg, logger: logger}, nil
}

// Attach implements Network: the transport steps into local, and answers
// probes and shed-state requests from it.
func (n *GRPC) Attach(local Local) {
	n.local = local
	n.tr.SetHost(local)
	n.tr.SetProbeFunc(local.ProbeAnswer)
	n.tr.SetShedStateFunc(local.ShedState)
}

// Run implements Network: it runs the peer senders until ctx ends, then
// closes every connection.
func (n *GRPC) Run(ctx context.Context) error { return n.tr.Run(ctx) }

// Register serves RaftService and ForwardService on a cluster-plane gRPC
// server built with ServerOptions.
func (n *GRPC) Register(s *grpc.Server) {
	n.tr.Register(s)
	raftv1.RegisterForwardServiceServer(s, &forwardServer{n: n})
}

// ServerOptions are the options the cluster-plane gRPC server needs: the
// identity check of every inbound call, before anything is decoded.
func (n *GRPC) ServerOptions() []grpc.ServerOption { return n.tr.ServerOptions() }

// Transport is the Raft transport (for its metrics and refusals).
func (n *GRPC) Transport() *transport.Transport { return n.tr }

// Send implements Network.
func (n *GRPC) Send(groupID uint32, msgs []*pb.Message) { n.tr.Send(groupID, msgs) }

// Probe implements Network.
func (n *GRPC) Probe(ctx context.Context, peer uint64, groups []uint32) ([]*raftv1.ProbeResponse_GroupState, error) {
	resp, err := n.tr.Probe(ctx, peer, groups)
	if err != nil {
		return nil, err
	}
	return resp.GetGroups(), nil
}

// AcceptsTransfers implements Network.
func (n *GRPC) AcceptsTransfers(ctx context.Context, peer uint64, g uint32) bool {
	st, err := n.tr.GetShedState(ctx, peer)
	return err == nil && st.GetClusterId() == n.cfg.ClusterID && st.GetShouldAcceptTransfer() &&
		!slices.Contains(st.GetGatedGroups(), g)
}

// Forward implements Network.
func (n *GRPC) Forward(ctx context.Context, leader uint64, req *raftv1.ForwardProposeRequest) (*storagev1.ApplyResult, error) {
	cc, err := n.conn(leader)
	if err != nil {
		return nil, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).Propose(ctx, req)
	if err != nil {
		return nil, callError(leader, err)
	}
	if e := resp.GetError(); e != nil {
		return nil, decodeError(e)
	}
	var ar storagev1.ApplyResult
	if err := proto.Unmarshal(resp.GetResult(), &ar); err != nil {
		return nil, fault.Errorf(fault.ErrInternal, "decode the result node %d forwarded: %v", leader, err)
	}
	return &ar, nil
}

// ReadIndex implements Network.
func (n *GRPC) ReadIndex(ctx context.Context, leader uint64, g uint32) (index, last uint64, err error) {
	cc, err := n.conn(leader)
	if err != nil {
		return 0, 0, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).ReadIndex(ctx, &raftv1.ReadIndexRequest{GroupId: g})
	if status.Code(err) == codes.Unimplemented {
		return 0, 0, errReadIndexUnsupported
	}
	if err != nil {
		return 0, 0, callError(leader, err)
	}
	if e := resp.GetError(); e != nil {
		return 0, 0, decodeError(e)
	}
	return resp.GetIndex(), resp.GetLastIndex(), nil
}

// RequestRebuild implements Network.
func (n *GRPC) RequestRebuild(ctx context.Context, leader uint64, g uint32, node, lastIndex uint64) (bool, error) {
	cc, err := n.conn(leader)
	if err != nil {
		return false, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).RequestRebuild(ctx, &raftv1.RequestRebuildRequest{GroupId: g, NodeId: node, LastIndex: lastIndex})
	if err != nil {
		return false, callError(leader, err)
	}
	if e := resp.GetError(); e != nil {
		return false, decodeError(e)
	}
	return resp.GetDone(), nil
}

// FeatureLevel implements Network. A peer that does not know the call
// runs a release before feature levels: it knows the baseline only.
func (n *GRPC) FeatureLevel(ctx context.Context, peer uint64) (*raftv1.GetFeatureLevelResponse, error) {
	cc, err := n.conn(peer)
	if err != nil {
		return nil, err
	}
	resp, err := raftv1.NewForwardServiceClient(cc).GetFeatureLevel(ctx, &raftv1.GetFeatureLevelRequest{})
	if status.Code(err) == codes.Unimplemented {
		return &raftv1.GetFeatureLevelResponse{MaxLevel: stream.BaselineFeatureLevel}, nil
	}
	if err != nil {
		return nil, callError(peer, err)
	}
	return resp, nil
}

func (n *GRPC) conn(id uint64) (*grpc.ClientConn, error) {
	cc, err := n.tr.Conn(id)
	if errors.Is(err, transport.ErrUnknownPeer) {
		return nil, fault.Errorf(fault.ErrUnavailable, "node %d is not a configured peer", id).With(fault.DetailRetryAfterMS, "1000")
	}
	return cc, err
}

// callError is a failed call to a peer: the peer did not answer, so the
// caller may retry later.
func callError(peer uint64, err error) error {
	return fault.Errorf(fault.ErrUnavailable, "node %d: %v", peer, err).With(fault.DetailRetryAfterMS, "500")
}

// encodeError carries a storage error in an answer.
func encodeError(err error) *raftv1.ForwardError {
	if fe, ok := asFault(err); ok {
		return &raftv1.ForwardError{Kind: fe.Kind.Name(), Message: fe.Message, Details: fe.Details}
	}
	return &raftv1.ForwardError{Kind: fault.ErrUnavailable.Name(), Message: err.Error(), Details: map[string]string{fault.DetailRetryAfterMS: "500"}}
}

// decodeError is the inverse of encodeError; a kind this node does not
// know (a newer peer's) is unavailability.
func decodeError(e *raftv1.ForwardError) error {
	k, ok := fault.ByName(e.GetKind())
	if !ok {
		k = fault.ErrUnavailable
	}
	return &fault.Error{Kind: k, Message: e.GetMessage(), Details: e.GetDetails()}
}

func asFault(err error) (*fault.Error, bool) {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe, true
	}
	if k := fault.KindOf(err); k != nil {
		return &fault.Error{Kind: k, Message: err.Error()}, true
	}
	return nil, false
}

// forwardServer serves ForwardService: commands forwarded to this node, a
// group's leader, read indexes and rebuild requests.
type forwardServer struct {
	raftv1.UnimplementedForwardServiceServer
	n *GRPC
}

func (f *forwardServer) Propose(ctx context.Context, req *raftv1.ForwardProposeRequest) (*raftv1.ForwardProposeResponse, error) {
	ar, err := f.n.local.ProposeForwarded(ctx, transport.SenderID(ctx), req)
	if err != nil {
		return &raftv1.ForwardProposeResponse{Error: encodeError(err)}, nil
	}
	out, err := proto.Marshal(ar)
	if err != nil {
		return &raftv1.ForwardProposeResponse{Error: encodeError(fault.Errorf(fault.ErrInternal, "encode the result: %v", err))}, nil
	}
	return &raftv1.ForwardProposeResponse{Result: out}, nil
}

func (f *forwardServer) GetFeatureLevel(context.Context, *raftv1.GetFeatureLevelRequest) (*raftv1.GetFeatureLevelResponse, error) {
	return f.n.local.FeatureLevelAnswer(), nil
}

func (f *forwardServer) ReadIndex(ctx context.Context, req *raftv1.ReadIndexRequest) (*raftv1.ReadIndexResponse, error) {
	index, last, err := f.n.local.ReadIndexForwarded(ctx, req.GetGroupId())
	if err != nil {
		return &raftv1.ReadIndexResponse{Error: encodeError(err)}, nil
	}
	return &raftv1.ReadIndexResponse{Index: index, LastIndex: last}, nil
}

func (f *forwardServer) RequestRebuild(ctx context.Context, req *raftv1.RequestRebuildRequest) (*raftv1.RequestRebuildResponse, error) {
	done, err := f.n.local.RequestRebuild(ctx, transport.SenderID(ctx), req.GetGroupId(), req.GetNodeId(), req.GetLastIndex())
	if err != nil {
		return &raftv1.RequestRebuildResponse{Error: encodeError(err)}, nil
	}
	return &raftv1.RequestRebuildResponse{Done: done}, nil
}
