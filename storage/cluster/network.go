package cluster

import (
	"context"

	pb "go.etcd.io/raft/v3/raftpb"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// Network is how a node talks to its peers: Raft messages, and the calls
// of the cluster plane. The gRPC network (GRPC) is the one nodes run;
// tests plug in their own (an in-memory one, a faulty one).
type Network interface {
	// Send hands Raft messages of one group to their peers
	// (multiraft.Transport): it is called by shard workers and must not
	// block.
	Send(groupID uint32, msgs []*pb.Message)
	// Probe asks a peer about the state of groups.
	Probe(ctx context.Context, peer uint64, groups []uint32) ([]*raftv1.ProbeResponse_GroupState, error)
	// Forward runs an allow-listed operation on a group's leader and
	// returns its applied result; a refusal (not the leader any more, ...)
	// is a storage error (package fault).
	Forward(ctx context.Context, leader uint64, req *raftv1.ForwardProposeRequest) (*storagev1.ApplyResult, error)
	// ReadIndex asks a group's leader for a read index and for the last
	// index of its log once the index was confirmed (ForwardService); a
	// leader of an older release answers errReadIndexUnsupported.
	ReadIndex(ctx context.Context, leader uint64, groupID uint32) (index, last uint64, err error)
	// RequestRebuild asks a group's leader to rebuild node's replica, whose
	// log ends at lastIndex (0: wiped); done once the leader no longer
	// counts the lost log.
	RequestRebuild(ctx context.Context, leader uint64, groupID uint32, node, lastIndex uint64) (done bool, err error)
	// AcceptsTransfers reports whether a peer may take group g's
	// leadership: it answers, belongs to this cluster, is not draining and
	// its replica of g is not behind the recovery gate.
	AcceptsTransfers(ctx context.Context, peer uint64, g uint32) bool
	// FeatureLevel asks a peer which feature levels its build knows and
	// where its replicas are (ForwardService); a peer of a release before
	// feature levels answers the baseline.
	FeatureLevel(ctx context.Context, peer uint64) (*raftv1.GetFeatureLevelResponse, error)
	// Attach connects the network's receiving side to this node. New calls
	// it once, before Run.
	Attach(local Local)
	// Run runs the network until ctx ends.
	Run(ctx context.Context) error
}

// Local is what a network delivers to: this node.
type Local interface {
	// Step, ReportUnreachable and ReportSnapshot reach the Raft host (they
	// must not block).
	Step(groupID uint32, m *pb.Message) error
	ReportUnreachable(groupID uint32, to uint64) error
	ReportSnapshot(groupID uint32, to uint64, failed bool) error
	// ProbeAnswer reports this node's state of groups.
	ProbeAnswer(groups []uint32) []*raftv1.ProbeResponse_GroupState
	// ProposeForwarded runs an operation peer from forwarded to this node,
	// the group's leader. from is the sender the network authenticated.
	ProposeForwarded(ctx context.Context, from uint64, req *raftv1.ForwardProposeRequest) (*storagev1.ApplyResult, error)
	// ReadIndexForwarded answers a peer's ReadIndex on this node, the
	// group's leader.
	ReadIndexForwarded(ctx context.Context, groupID uint32) (index, last uint64, err error)
	// RequestRebuild is peer from asking this node, a group's leader, to
	// rebuild node's replica (only a node's own request is taken).
	RequestRebuild(ctx context.Context, from uint64, groupID uint32, node, lastIndex uint64) (bool, error)
	// ShedState is this node's leadership-shed state.
	ShedState() *raftv1.ShedState
	// FeatureLevelAnswer is this node's answer to a peer's FeatureLevel.
	FeatureLevelAnswer() *raftv1.GetFeatureLevelResponse
}
