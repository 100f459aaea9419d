package node

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	"github.com/ursula/ursula/services/platform/errcode"
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
	return st, toStatus(err)
}

func (a *adminService) GetReady(context.Context, *adminv1.GetReadyRequest) (*adminv1.GetReadyResponse, error) {
	return a.srv.readiness(), nil
}

func (a *adminService) GetLeadershipShed(context.Context, *adminv1.GetLeadershipShedRequest) (*adminv1.LeadershipShedState, error) {
	return a.srv.shedAnswer(), nil
}

func (a *adminService) StartMaintenanceDrain(context.Context, *adminv1.StartMaintenanceDrainRequest) (*adminv1.LeadershipShedState, error) {
	if err := a.srv.n.Cluster.SetMaintenanceDrain(true); err != nil {
		return nil, toStatus(err)
	}
	return a.srv.shedAnswer(), nil
}

func (a *adminService) StopMaintenanceDrain(context.Context, *adminv1.StopMaintenanceDrainRequest) (*adminv1.LeadershipShedState, error) {
	if err := a.srv.n.Cluster.SetMaintenanceDrain(false); err != nil {
		return nil, toStatus(err)
	}
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
	if err := a.srv.n.Cluster.TransferLeader(ctx, g, to); err != nil {
		return nil, toStatus(err)
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
	if err := a.srv.n.Cluster.AddLearner(ctx, g, id, req.GetBlocking()); err != nil {
		return nil, toStatus(err)
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
	committed, err := a.srv.n.Cluster.SetVoters(ctx, g, want)
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminv1.SetMembershipResponse{RaftGroupId: g, Voters: want, CommittedIndex: committed}, nil
}

// TakeSnapshot runs on the group's shard worker (multiraft.Host.Snapshot).
func (a *adminService) TakeSnapshot(ctx context.Context, req *adminv1.TakeSnapshotRequest) (*adminv1.TakeSnapshotResponse, error) {
	g, err := a.group(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	index, err := a.srv.n.Cluster.Snapshot(ctx, g, snapshotStartBound)
	if err != nil {
		return nil, toStatus(err)
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
	through, err := a.srv.n.Cluster.PurgeLog(ctx, g, req.GetUpto(), snapshotStartBound)
	if err != nil {
		return nil, toStatus(err)
	}
	return &adminv1.PurgeLogResponse{RaftGroupId: g, PurgedThrough: through}, nil
}

// FlushCold flushes one stream's hot bytes now (on its leader).
func (a *adminService) FlushCold(ctx context.Context, req *adminv1.FlushColdRequest) (*adminv1.FlushColdResponse, error) {
	k := stream.Key{Bucket: req.GetBucket(), Stream: req.GetStream()}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	eng := a.srv.n.Engine
	if err := eng.FlushCold(ctx, k); err != nil {
		return nil, toStatus(err)
	}
	m, _ := eng.Lookup(k)
	return &adminv1.FlushColdResponse{Bucket: k.Bucket, Stream: k.Stream,
		ColdOffset: stream.FormatOffset(m.ColdEnd), NextOffset: stream.FormatOffset(m.Tail)}, nil
}

// PurgeBucket erases a bucket; see Server.purge.
func (a *adminService) PurgeBucket(ctx context.Context, req *adminv1.PurgeBucketRequest) (*adminv1.PurgeBucketResponse, error) {
	rep, err := a.srv.purge(ctx, req.GetBucket())
	if err != nil {
		return nil, toStatus(err)
	}
	return rep, nil
}

// group checks a group id against raft.group_count.
func (a *adminService) group(g uint32) (uint32, error) {
	if int(g) >= a.srv.n.Config().GroupCount {
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
	for _, p := range a.srv.n.Config().Peers {
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
	st := s.n.Cluster.ShedState()
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

func invalid(format string, args ...any) error {
	return toStatus(errcode.New(errcode.InvalidArgument, format, args...))
}
