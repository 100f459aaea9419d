package cluster

import (
	"context"

	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// Bounds of forwarded operations, as for the requests that cause them.
const (
	// maxForwardedGCAcks bounds the sequence numbers of one GC
	// acknowledgement (the worker reads at most 4096 entries at a time).
	maxForwardedGCAcks = 4096
)

// forwardRequest is cmd as a forwarded operation of group g, or nil when
// its operation is not one a node forwards: the allow-list. A node issues
// these on its own behalf in a group it may not lead (fork references,
// bucket purges, bucket-delete fences, cold-GC acknowledgements,
// compaction swaps and an operator's feature-level raise); client
// commands are routed to the leader by the gateway instead, and expiry,
// touches, flushes and the rest run only on the leader.
func forwardRequest(g uint32, cmd *storagev1.Command) *raftv1.ForwardProposeRequest {
	req := &raftv1.ForwardProposeRequest{GroupId: g}
	switch op := cmd.GetOp().(type) {
	case *storagev1.Command_AddForkRef:
		req.Op = &raftv1.ForwardProposeRequest_AddForkRef{AddForkRef: op.AddForkRef}
	case *storagev1.Command_ReleaseForkRef:
		req.Op = &raftv1.ForwardProposeRequest_ReleaseForkRef{ReleaseForkRef: op.ReleaseForkRef}
	case *storagev1.Command_PurgeBucket:
		req.Op = &raftv1.ForwardProposeRequest_PurgeBucket{PurgeBucket: op.PurgeBucket}
	case *storagev1.Command_FenceBucket:
		req.Op = &raftv1.ForwardProposeRequest_FenceBucket{FenceBucket: op.FenceBucket}
	case *storagev1.Command_GcAck:
		req.Op = &raftv1.ForwardProposeRequest_GcAck{GcAck: op.GcAck}
	case *storagev1.Command_ColdSwap:
		req.Op = &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: op.ColdSwap}
	case *storagev1.Command_SetFeatureLevel:
		req.Op = &raftv1.ForwardProposeRequest_SetFeatureLevel{SetFeatureLevel: op.SetFeatureLevel}
	default:
		return nil
	}
	return req
}

// forwardedCommand builds the command of a forwarded operation on the
// leader: the operation must be on the allow-list and pass the checks a
// request causing it passes, the key must belong to the group, and the
// time is this node's. The request's bytes are never proposed as they came.
func (c *Cluster) forwardedCommand(req *raftv1.ForwardProposeRequest) (*storagev1.Command, error) {
	g := req.GetGroupId()
	cmd := &storagev1.Command{NowMs: c.now().UnixMilli()}
	var key *stream.Key
	switch op := req.GetOp().(type) {
	case *raftv1.ForwardProposeRequest_Barrier:
		cmd.Op = &storagev1.Command_Barrier{Barrier: &storagev1.Barrier{}}
	case *raftv1.ForwardProposeRequest_AddForkRef:
		o := op.AddForkRef
		key = &stream.Key{Bucket: o.GetBucket(), Stream: o.GetStream()}
		cmd.Op = &storagev1.Command_AddForkRef{AddForkRef: &storagev1.AddForkRef{
			Bucket: o.GetBucket(), Stream: o.GetStream(), Incarnation: o.GetIncarnation(), Position: o.GetPosition()}}
	case *raftv1.ForwardProposeRequest_ReleaseForkRef:
		o := op.ReleaseForkRef
		key = &stream.Key{Bucket: o.GetBucket(), Stream: o.GetStream()}
		cmd.Op = &storagev1.Command_ReleaseForkRef{ReleaseForkRef: &storagev1.ReleaseForkRef{
			Bucket: o.GetBucket(), Stream: o.GetStream(), Incarnation: o.GetIncarnation()}}
	case *raftv1.ForwardProposeRequest_PurgeBucket:
		b := op.PurgeBucket.GetBucket()
		if err := (stream.Key{Bucket: b, Stream: "-"}).Validate(); err != nil {
			return nil, err
		}
		cmd.Op = &storagev1.Command_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{Bucket: b}}
	case *raftv1.ForwardProposeRequest_FenceBucket:
		f := op.FenceBucket
		if err := (stream.Key{Bucket: f.GetBucket(), Stream: "-"}).Validate(); err != nil {
			return nil, err
		}
		cmd.Op = &storagev1.Command_FenceBucket{FenceBucket: &storagev1.FenceBucket{Bucket: f.GetBucket(), Generation: f.GetGeneration(), Lift: f.GetLift()}}
	case *raftv1.ForwardProposeRequest_GcAck:
		seqs := op.GcAck.GetSeqs()
		if len(seqs) == 0 || len(seqs) > maxForwardedGCAcks {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "a forwarded GC acknowledgement names 1 to %d entries, not %d", maxForwardedGCAcks, len(seqs))
		}
		cmd.Op = &storagev1.Command_GcAck{GcAck: &storagev1.GCAck{Seqs: seqs}}
	case *raftv1.ForwardProposeRequest_ColdSwap:
		sw := op.ColdSwap
		key = &stream.Key{Bucket: sw.GetBucket(), Stream: sw.GetStream()}
		if err := stream.ValidateColdSwap(sw); err != nil {
			return nil, err
		}
		cmd.Op = &storagev1.Command_ColdSwap{ColdSwap: proto.CloneOf(sw)}
	case *raftv1.ForwardProposeRequest_SetFeatureLevel:
		// The leader never proposes a level its own build does not know:
		// it would stop applying the group itself.
		l := op.SetFeatureLevel.GetLevel()
		if l < stream.BaselineFeatureLevel || l > stream.MaxFeatureLevel {
			return nil, fault.Errorf(fault.ErrFeatureLevelUnsupported, "node %d, the leader of group %d, knows feature levels %d to %d, not %d", c.cfg.NodeID, g, stream.BaselineFeatureLevel, stream.MaxFeatureLevel, l)
		}
		cmd.Op = &storagev1.Command_SetFeatureLevel{SetFeatureLevel: &storagev1.SetFeatureLevel{Level: l}}
	default:
		return nil, fault.Errorf(fault.ErrInvalidArgument, "a forwarded proposal must name one of the operations nodes forward")
	}
	if key != nil {
		if err := key.Validate(); err != nil {
			return nil, err
		}
		if want := stream.GroupOf(key.Bucket, key.Stream, len(c.machines)); want != g {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "stream %s/%s belongs to group %d, not %d", key.Bucket, key.Stream, want, g)
		}
	}
	return cmd, nil
}

// forward runs an operation on the group's remote leader.
func (c *Cluster) forward(ctx context.Context, leader uint64, req *raftv1.ForwardProposeRequest) (*stream.Result, error) {
	if c.net == nil || leader == c.cfg.NodeID {
		return nil, fault.Errorf(fault.ErrUnavailable, "group %d has no reachable leader", req.GetGroupId()).With(fault.DetailRetryAfterMS, "500")
	}
	ar, err := c.net.Forward(ctx, leader, req)
	if err != nil {
		return nil, err
	}
	return stream.DecodeResult(ar), nil
}

// ProposeForwarded runs an operation peer from forwarded to this node, the
// group's leader (Local): rebuilt and validated by forwardedCommand.
func (c *Cluster) ProposeForwarded(ctx context.Context, from uint64, req *raftv1.ForwardProposeRequest) (*storagev1.ApplyResult, error) {
	g := req.GetGroupId()
	if int(g) >= len(c.machines) {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "group %d out of range", g)
	}
	cmd, err := c.forwardedCommand(req)
	if err != nil {
		c.logger.Warn("refused a forwarded proposal", "from_node_id", from, "group_id", g, "err", err)
		return nil, err
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fault.Errorf(fault.ErrInternal, "encode the command: %v", err)
	}
	out, err := c.host.Propose(ctx, g, data)
	if err != nil {
		return nil, raftError(err)
	}
	res, ok := out.(*stream.Result)
	if !ok {
		return nil, fault.Errorf(fault.ErrInternal, "unexpected apply result %T", out)
	}
	return stream.EncodeResult(res), nil
}
