package transport

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
)

func keepaliveEnforcement(peerPing time.Duration) keepalive.EnforcementPolicy {
	return keepalive.EnforcementPolicy{MinTime: peerPing / 2, PermitWithoutStream: true}
}

// Register registers the RaftService server on s. Install ServerOptions
// (or the interceptors) on s too, so that requests of another cluster are
// refused before they are decoded.
func (t *Transport) Register(s grpc.ServiceRegistrar) {
	raftv1.RegisterRaftServiceServer(s, &raftServer{t: t})
}

type raftServer struct {
	raftv1.UnimplementedRaftServiceServer
	t *Transport
}

func senderID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	return firstValue(md, MetadataNodeID)
}

func (s *raftServer) host() (StepReporter, error) {
	if s.t.isClosed() {
		return nil, status.Error(codes.Unavailable, "raft transport is closed")
	}
	h := s.t.getHost()
	if h == nil {
		return nil, status.Error(codes.Unavailable, "raft host is not running yet")
	}
	return h, nil
}

// Stream receives the peer's message batches and steps every message into
// its group. It acknowledges the stream once at its start (the sender's
// handshake) and ends when the peer closes it or the transport closes.
func (s *raftServer) Stream(stream raftv1.RaftService_StreamServer) error {
	h, err := s.host()
	if err != nil {
		return err
	}
	if err := stream.Send(&raftv1.StreamAck{}); err != nil {
		return err
	}
	// Recv cannot be interrupted; it runs on its own goroutine so that the
	// handler returns when the transport closes (which lets the server stop
	// gracefully). Returning cancels the stream, which ends the Recv.
	errc := make(chan error, 1)
	go func() { errc <- s.receive(stream, h) }()
	select {
	case err := <-errc:
		return err
	case <-s.t.closing:
		return status.Error(codes.Unavailable, "raft transport is closing")
	}
}

func (s *raftServer) receive(stream raftv1.RaftService_StreamServer, h StepReporter) error {
	t := s.t
	fromText := senderID(stream.Context())
	from, _ := strconv.ParseUint(fromText, 10, 64)
	warned := false
	warn := func(msg string, args ...any) {
		if !warned {
			warned = true
			t.logger.Warn(msg, append(args, "sender_node_id", fromText)...)
		}
	}
	for {
		batch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		t.stats.batchesReceived.Add(1)
		for _, gm := range batch.GetMessages() {
			t.stats.bytesReceived.Add(uint64(len(gm.GetMessage())))
			m := &pb.Message{}
			if err := proto.Unmarshal(gm.GetMessage(), m); err != nil {
				t.stats.badMessages.Add(1)
				warn("dropping an undecodable raft message", "group_id", gm.GetGroupId(), "err", err)
				continue
			}
			if m.GetTo() != t.cfg.NodeID {
				t.stats.badMessages.Add(1)
				warn("dropping a raft message addressed to another node", "group_id", gm.GetGroupId(), "to", m.GetTo())
				continue
			}
			if m.GetFrom() != from {
				t.stats.badMessages.Add(1)
				warn("dropping a raft message that names another sender", "group_id", gm.GetGroupId(), "from", m.GetFrom())
				continue
			}
			if err := h.Step(gm.GetGroupId(), m); err != nil {
				t.stats.stepErrors.Add(1)
				warn("cannot step a raft message", "group_id", gm.GetGroupId(), "err", err)
				continue
			}
			t.stats.messagesReceived.Add(1)
		}
	}
}

// SendSnapshot reassembles one MsgSnap and steps it into its group.
func (s *raftServer) SendSnapshot(stream raftv1.RaftService_SendSnapshotServer) error {
	h, err := s.host()
	if err != nil {
		return err
	}
	t := s.t
	var (
		msg   *pb.Message
		group uint32
		data  []byte
	)
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return status.Error(codes.InvalidArgument, "snapshot stream ended before its last chunk")
		}
		if err != nil {
			return err
		}
		if msg == nil {
			if len(c.GetMessage()) == 0 {
				return status.Error(codes.InvalidArgument, "the first snapshot chunk carries no message")
			}
			msg = &pb.Message{}
			if err := proto.Unmarshal(c.GetMessage(), msg); err != nil {
				return status.Errorf(codes.InvalidArgument, "decode snapshot message: %v", err)
			}
			if msg.GetType() != pb.MessageType_MsgSnap || msg.GetTo() != t.cfg.NodeID {
				return status.Errorf(codes.InvalidArgument, "snapshot stream carries a %s to node %d", msg.GetType(), msg.GetTo())
			}
			if from := SenderID(stream.Context()); msg.GetFrom() != from {
				return status.Errorf(codes.PermissionDenied, "node %d sent a snapshot from node %d", from, msg.GetFrom())
			}
			group = c.GetGroupId()
		} else if len(c.GetMessage()) != 0 || c.GetGroupId() != group {
			return status.Error(codes.InvalidArgument, "a later snapshot chunk repeats the message or changes group")
		}
		data = append(data, c.GetData()...)
		if c.GetLast() {
			break
		}
	}
	if msg.Snapshot == nil {
		msg.Snapshot = &pb.Snapshot{}
	}
	msg.Snapshot.Data = data
	t.stats.snapshotBytesReceived.Add(uint64(len(data)))
	if err := h.Step(group, msg); err != nil {
		t.stats.stepErrors.Add(1)
		return status.Errorf(codes.Unavailable, "step snapshot of group %d: %v", group, err)
	}
	t.stats.snapshotsReceived.Add(1)
	t.logger.Debug("received raft snapshot", "group_id", group, "from", msg.GetFrom(),
		"index", msg.GetSnapshot().GetMetadata().GetIndex(), "bytes", len(data))
	return stream.SendAndClose(&raftv1.SendSnapshotResponse{})
}

// Probe answers from the node's ProbeFunc.
func (s *raftServer) Probe(_ context.Context, req *raftv1.ProbeRequest) (*raftv1.ProbeResponse, error) {
	f := s.t.probe.Load()
	if f == nil || *f == nil {
		return nil, status.Error(codes.Unavailable, "raft probe is not available yet")
	}
	return &raftv1.ProbeResponse{Groups: (*f)(req.GetGroupIds())}, nil
}

// GetShedState answers from the node's ShedStateFunc.
func (s *raftServer) GetShedState(context.Context, *raftv1.GetShedStateRequest) (*raftv1.ShedState, error) {
	f := s.t.shed.Load()
	if f == nil || *f == nil {
		return nil, status.Error(codes.Unimplemented, "leadership-shed state is not served by this node")
	}
	st := (*f)()
	if st == nil {
		st = &raftv1.ShedState{}
	}
	if st.GetClusterId() == "" {
		st.ClusterId = s.t.cfg.ClusterID
	}
	if st.GetNodeId() == 0 {
		st.NodeId = s.t.cfg.NodeID
	}
	return st, nil
}
