package node

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/fault"
)

// streamService adapts the engine to the StreamService gRPC contract.
type streamService struct {
	streamv1.UnimplementedStreamServiceServer
	eng       *engine.Engine
	cluster   *cluster.Cluster
	metrics   *metrics
	clusterID string
	selfAddr  string
	// leaderAddrs maps node ids to client-plane addresses, so a NOT_LEADER
	// answer names where to retry.
	leaderAddrs map[uint64]string
	// draining is closed when a graceful shutdown begins: subscriptions
	// and waiting reads end at once (the gateway resumes them on another
	// node) instead of holding the gRPC server's graceful stop open.
	draining     chan struct{}
	drainingOnce sync.Once
}

// drain ends every subscription and waiting read.
func (s *streamService) drain() { s.drainingOnce.Do(func() { close(s.draining) }) }

// drainable returns a context that ends with ctx or when the node drains.
func (s *streamService) drainable(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// errDraining answers a subscription or waiting read cut by a shutdown.
var errDraining = errcode.New(errcode.Unavailable, "node is shutting down").With(errcode.KeyRetryAfterMS, "100")

// status converts an engine error for the wire, adding the leader's
// client address to NOT_LEADER answers.
func (s *streamService) status(err error) error {
	if err == nil {
		return nil
	}
	err = domainError(err)
	var de *errcode.Error
	if errors.As(err, &de) && de.Code == errcode.NotLeader {
		if id, perr := strconv.ParseUint(de.Metadata[errcode.KeyLeaderID], 10, 64); perr == nil {
			if addr := s.leaderAddrs[id]; addr != "" {
				de.With(errcode.KeyLeaderAddr, addr)
			}
		}
	}
	return grpcerr.ToStatus(err)
}

func (s *streamService) CreateBucket(ctx context.Context, req *streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error) {
	resp, err := s.eng.CreateBucket(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) CreateStream(ctx context.Context, req *streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
	resp, err := s.eng.CreateStream(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) Append(ctx context.Context, req *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
	start := time.Now()
	resp, err := s.eng.Append(ctx, req)
	d := time.Since(start)
	s.metrics.appendNs.Add(uint64(d))
	s.metrics.appendDuration.Record(ctx, d.Seconds())
	s.metrics.appends.Add(1)
	if err != nil {
		s.metrics.appendErrors.Add(1)
	} else {
		s.metrics.appendBytes.Add(uint64(len(req.GetBody())))
	}
	for _, ack := range resp.GetFrames() {
		// A refused frame names its storage error kind: answer its code.
		if name := ack.GetErrorCode(); name != "" {
			k, ok := fault.ByName(name)
			if !ok {
				k = fault.ErrInternal
			}
			ack.ErrorCode = errcode.Reason(codeOfKind(k))
		}
	}
	return resp, s.status(err)
}

func (s *streamService) Read(ctx context.Context, req *streamv1.ReadRequest) (resp *streamv1.ReadResponse, err error) {
	if req.GetWaitMs() > 0 {
		s.metrics.liveReadsWaiting.Add(1)
		defer s.metrics.liveReadsWaiting.Add(-1)
		var cancel context.CancelFunc
		outer := ctx
		ctx, cancel = s.drainable(ctx)
		defer cancel()
		defer func() {
			if ctx.Err() != nil && outer.Err() == nil {
				resp, err = nil, s.status(errDraining)
			}
		}()
	}
	start := time.Now()
	resp, err = s.eng.Read(ctx, req)
	if req.GetWaitMs() == 0 {
		d := time.Since(start)
		s.metrics.readNs.Add(uint64(d))
		s.metrics.readDuration.Record(ctx, d.Seconds())
		s.metrics.readsImmediate.Add(1)
	}
	s.metrics.reads.Add(1)
	return resp, s.status(err)
}

func (s *streamService) Head(ctx context.Context, req *streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
	resp, err := s.eng.Head(ctx, req)
	if resp.GetInfo() != nil {
		resp.Info.ClusterId = s.clusterID
	}
	return resp, s.status(err)
}

func (s *streamService) DeleteStream(ctx context.Context, req *streamv1.DeleteStreamRequest) (*streamv1.DeleteStreamResponse, error) {
	resp, err := s.eng.DeleteStream(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) SetRetention(ctx context.Context, req *streamv1.SetRetentionRequest) (*streamv1.SetRetentionResponse, error) {
	resp, err := s.eng.SetRetention(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) Subscribe(req *streamv1.SubscribeRequest, srv streamv1.StreamService_SubscribeServer) error {
	s.metrics.subscribers.Add(1)
	defer s.metrics.subscribers.Add(-1)
	s.metrics.subscriptions.Add(1)
	ctx, cancel := s.drainable(srv.Context())
	defer cancel()
	err := s.eng.Subscribe(ctx, req, func(r *streamv1.ReadResponse) error {
		s.metrics.subscribeChunks.Add(1)
		s.metrics.subscribeBytes.Add(uint64(len(r.GetData())))
		return srv.Send(&streamv1.SubscribeResponse{Chunk: r})
	})
	if srv.Context().Err() != nil {
		return nil // the subscriber went away
	}
	if ctx.Err() != nil {
		return s.status(errDraining)
	}
	return s.status(err)
}

func (s *streamService) GetClusterInfo(context.Context, *streamv1.GetClusterInfoRequest) (*streamv1.GetClusterInfoResponse, error) {
	cfg := s.eng.Config()
	resp := &streamv1.GetClusterInfoResponse{
		ClusterId:  s.clusterID,
		NodeId:     cfg.NodeID,
		GroupCount: uint32(cfg.GroupCount),
	}
	if len(cfg.Peers) == 0 {
		resp.Nodes = []*streamv1.NodeInfo{{Id: cfg.NodeID, ClientAddr: s.selfAddr}}
	}
	for _, p := range cfg.Peers {
		resp.Nodes = append(resp.Nodes, &streamv1.NodeInfo{Id: p.ID, ClientAddr: p.ClientURL})
	}
	resp.GroupLeaders = make([]uint64, cfg.GroupCount)
	for g := range resp.GroupLeaders {
		resp.GroupLeaders[g] = s.cluster.Status(uint32(g)).LeaderID
	}
	return resp, nil
}

func (s *streamService) PutSnapshot(ctx context.Context, req *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
	resp, err := s.eng.PutSnapshot(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) GetSnapshot(ctx context.Context, req *streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
	resp, err := s.eng.GetSnapshot(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) PutSnapshotPart(ctx context.Context, req *streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
	resp, err := s.eng.PutSnapshotPart(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) CommitSnapshot(ctx context.Context, req *streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
	resp, err := s.eng.CommitSnapshot(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) GetAttrs(ctx context.Context, req *streamv1.GetAttrsRequest) (*streamv1.GetAttrsResponse, error) {
	resp, err := s.eng.GetAttrs(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) SetAttrs(ctx context.Context, req *streamv1.SetAttrsRequest) (*streamv1.SetAttrsResponse, error) {
	resp, err := s.eng.SetAttrs(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) GetBucket(ctx context.Context, req *streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error) {
	resp, err := s.eng.GetBucket(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) DeleteBucket(ctx context.Context, req *streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) {
	resp, err := s.eng.DeleteBucket(ctx, req)
	return resp, s.status(err)
}

func (s *streamService) ListStreams(ctx context.Context, req *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
	resp, err := s.eng.ListStreams(ctx, req)
	return resp, s.status(err)
}
