package node

import (
	"context"
	"errors"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// snapshotStartBound bounds how long a snapshot or log purge request waits
// for the group's shard worker to start it before answering 503.
const snapshotStartBound = 10 * time.Second

// adminService serves the admin API. Its REST mapping is generated
// (admin_http.yaml); the incarnation and token checks run in front of it
// (adminGuard), so every method here may change state.
type adminService struct {
	adminv1.UnimplementedAdminServiceServer
	srv *Server
}

func (a *adminService) GetMetrics(context.Context, *adminv1.GetMetricsRequest) (*structpb.Struct, error) {
	st, err := structpb.NewStruct(a.srv.metricsSnapshot())
	return st, grpcerr.ToStatus(err)
}

func (a *adminService) GetReady(context.Context, *adminv1.GetReadyRequest) (*adminv1.GetReadyResponse, error) {
	return a.srv.readiness(), nil
}

func (a *adminService) GetLeadershipShed(context.Context, *adminv1.GetLeadershipShedRequest) (*adminv1.LeadershipShedState, error) {
	return a.srv.shedAnswer(), nil
}

func (a *adminService) StartMaintenanceDrain(context.Context, *adminv1.StartMaintenanceDrainRequest) (*adminv1.LeadershipShedState, error) {
	a.srv.eng.SetDraining(true)
	return a.srv.shedAnswer(), nil
}

func (a *adminService) StopMaintenanceDrain(context.Context, *adminv1.StopMaintenanceDrainRequest) (*adminv1.LeadershipShedState, error) {
	a.srv.eng.SetDraining(false)
	return a.srv.shedAnswer(), nil
}

func (a *adminService) TransferLeader(ctx context.Context, req *adminv1.TransferLeaderRequest) (*adminv1.TransferLeaderResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	to, err := nodeID(req.GetToNodeId())
	if err != nil {
		return nil, err
	}
	if err := a.srv.eng.Host().TransferLeader(ctx, g, to); err != nil {
		return nil, raftStatus(err)
	}
	return &adminv1.TransferLeaderResponse{RaftGroupId: g, TransferTo: to}, nil
}

func (a *adminService) AddLearner(ctx context.Context, req *adminv1.AddLearnerRequest) (*adminv1.AddLearnerResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	id, err := nodeID(req.GetNodeId())
	if err != nil {
		return nil, err
	}
	if err := a.checkPeerAddr(id, req.GetAddr()); err != nil {
		return nil, err
	}
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(id)}}}
	if err := a.srv.eng.Host().ProposeConfChange(ctx, g, cc); err != nil {
		return nil, raftStatus(err)
	}
	if req.GetBlocking() {
		if !a.srv.waitMembership(ctx, g, func(st multiraft.GroupStatus) bool { return slices.Contains(st.Learners, id) }) {
			return nil, unavailable("learner not added in time")
		}
	}
	return &adminv1.AddLearnerResponse{RaftGroupId: g, Learner: id}, nil
}

// SetMembership replaces a group's voter set in one joint change.
func (a *adminService) SetMembership(ctx context.Context, req *adminv1.SetMembershipRequest) (*adminv1.SetMembershipResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	raw := strings.TrimSpace(req.GetVoters())
	if raw == "" {
		return nil, invalid("voters query parameter is required (comma-separated node ids)")
	}
	var want []uint64
	for part := range strings.SplitSeq(raw, ",") {
		id, perr := strconv.ParseUint(strings.TrimSpace(part), 10, 64)
		if perr != nil || id == 0 {
			return nil, invalid("node id must be a positive number")
		}
		want = append(want, id)
	}
	host := a.srv.eng.Host()
	st := host.Status(g)
	if !st.IsLeader {
		return nil, raftStatus(&multiraft.NotLeaderError{LeaderID: st.LeaderID})
	}
	cc := &pb.ConfChangeV2{}
	for _, id := range want {
		if !slices.Contains(st.Voters, id) {
			cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(id)})
		}
	}
	for _, id := range st.Voters {
		if !slices.Contains(want, id) {
			cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
		}
	}
	if len(cc.Changes) > 0 {
		if err := host.ProposeConfChange(ctx, g, cc); err != nil {
			return nil, raftStatus(err)
		}
	}
	same := func(st multiraft.GroupStatus) bool {
		return slices.Equal(slices.Sorted(slices.Values(st.Voters)), slices.Sorted(slices.Values(want)))
	}
	if !a.srv.waitMembership(ctx, g, same) {
		return nil, unavailable("the new voter set did not commit in time")
	}
	return &adminv1.SetMembershipResponse{RaftGroupId: g, Voters: want, CommittedIndex: host.Status(g).Commit}, nil
}

// TakeSnapshot runs on the group's shard worker (multiraft.Host.Snapshot).
func (a *adminService) TakeSnapshot(ctx context.Context, req *adminv1.TakeSnapshotRequest) (*adminv1.TakeSnapshotResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	index, err := a.srv.eng.Host().Snapshot(ctx, g, snapshotStartBound)
	if err != nil {
		return nil, raftStatus(err)
	}
	return &adminv1.TakeSnapshotResponse{RaftGroupId: g, SnapshotIndex: index}, nil
}

// PurgeLog runs on the group's shard worker (multiraft.Host.PurgeLog).
func (a *adminService) PurgeLog(ctx context.Context, req *adminv1.PurgeLogRequest) (*adminv1.PurgeLogResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if req.Upto == nil {
		return nil, invalid("upto query parameter is required (the last log index to purge)")
	}
	through, err := a.srv.eng.Host().PurgeLog(ctx, g, req.GetUpto(), snapshotStartBound)
	if err != nil {
		return nil, raftStatus(err)
	}
	return &adminv1.PurgeLogResponse{RaftGroupId: g, PurgedThrough: through}, nil
}

// FlushCold flushes one stream's hot bytes now (on its leader).
func (a *adminService) FlushCold(ctx context.Context, req *adminv1.FlushColdRequest) (*adminv1.FlushColdResponse, error) {
	k := stream.Key{Bucket: req.GetBucket(), Stream: req.GetStream()}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	eng := a.srv.eng
	if err := eng.FlushCold(ctx, k); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	m, _ := eng.Machines()[eng.GroupOf(k)].Lookup(k)
	return &adminv1.FlushColdResponse{Bucket: k.Bucket, Stream: k.Stream,
		ColdOffset: stream.FormatOffset(m.ColdEnd), NextOffset: stream.FormatOffset(m.Tail)}, nil
}

// PurgeBucket erases a bucket; see Server.purge.
func (a *adminService) PurgeBucket(ctx context.Context, req *adminv1.PurgeBucketRequest) (*adminv1.PurgeBucketResponse, error) {
	rep, err := a.srv.purge(ctx, req.GetBucket())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return rep, nil
}

// group checks a group id against raft.group_count.
func (a *adminService) group(g uint32) (uint32, error) {
	if int(g) >= a.srv.eng.Config().GroupCount {
		return 0, invalid("group must be a number below raft.group_count")
	}
	return g, nil
}

func nodeID(id uint64) (uint64, error) {
	if id == 0 {
		return 0, invalid("node id must be a positive number")
	}
	return id, nil
}

// checkPeerAddr refuses an addr that is not where this node dials the
// peer: peers are dialed at their [[raft.peers]] cluster_url only.
func (a *adminService) checkPeerAddr(id uint64, addr string) error {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return nil
	}
	for _, p := range a.srv.eng.Config().Peers {
		if p.ID == id && hostPort(addr) != hostPort(p.ClusterURL) {
			return invalid("addr %q is not node %d's cluster_url %q in raft.peers, where this node dials it", addr, id, p.ClusterURL)
		}
	}
	return nil
}

// hostPort reduces "http://host:port/" and "host:port" to host:port.
func hostPort(addr string) string {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	if h, p, err := net.SplitHostPort(addr); err == nil {
		return net.JoinHostPort(h, p)
	}
	return addr
}

func (s *Server) shedAnswer() *adminv1.LeadershipShedState {
	st := shedState(s.eng, s.cfg.ClusterID, s.eng.Config().NodeID)
	return &adminv1.LeadershipShedState{
		ClusterId:                st.GetClusterId(),
		NodeId:                   st.GetNodeId(),
		Bits:                     st.GetBits(),
		State:                    st.GetState(),
		ShouldAcceptTransfer:     st.GetShouldAcceptTransfer(),
		ShouldCampaign:           st.GetShouldCampaign(),
		ShouldShedCurrentLeaders: st.GetShouldShedCurrentLeaders(),
	}
}

func (s *Server) waitMembership(ctx context.Context, g uint32, done func(multiraft.GroupStatus) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if done(s.eng.Host().Status(g)) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func invalid(format string, args ...any) error {
	return grpcerr.ToStatus(errcode.New(errcode.InvalidArgument, format, args...))
}

func unavailable(msg string) error {
	return grpcerr.ToStatus(errcode.New(errcode.Unavailable, "%s", msg).With(errcode.KeyRetryAfterMS, "1000"))
}

// raftStatus converts a multiraft error of an admin operation: not leader
// → NOT_LEADER naming the leader (0 when unknown), not a voter →
// NOT_A_VOTER, a request the shard worker did not start → UNAVAILABLE
// (retry after a second), a failed state-machine snapshot → INTERNAL, any
// other failure → UNAVAILABLE.
func raftStatus(err error) error {
	var (
		nl *multiraft.NotLeaderError
		de *errcode.Error
	)
	switch {
	case errors.As(err, &de), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return grpcerr.ToStatus(err)
	case errors.As(err, &nl):
		de = errcode.New(errcode.NotLeader, "this node does not lead the group").
			With(errcode.KeyLeaderID, strconv.FormatUint(nl.LeaderID, 10))
	case errors.Is(err, multiraft.ErrNotVoter):
		de = &errcode.Error{Code: codeNotAVoter, Message: err.Error()}
	case errors.Is(err, multiraft.ErrSnapshotFailed):
		de = errcode.New(errcode.Internal, "%v", err)
	default:
		de = errcode.New(errcode.Unavailable, "%v", err).With(errcode.KeyRetryAfterMS, "1000")
	}
	return grpcerr.ToStatus(de)
}
