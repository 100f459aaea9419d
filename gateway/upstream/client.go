package upstream

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// The StreamServiceClient methods. In single-node mode each is one atomic
// load and a direct call.

// CreateBucket goes to the leader of group 0, where buckets are recorded.
func (r *Router) CreateBucket(ctx context.Context, in *streamv1.CreateBucketRequest, opts ...grpc.CallOption) (*streamv1.CreateBucketResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.CreateBucket(ctx, in, opts...)
	}
	return do(ctx, r, nil, modeWrite, func(nc *nodeConn) (*streamv1.CreateBucketResponse, error) {
		return nc.client.CreateBucket(ctx, in, opts...)
	})
}

// CreateStream goes to the leader of the stream's group.
func (r *Router) CreateStream(ctx context.Context, in *streamv1.CreateStreamRequest, opts ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.CreateStream(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.CreateStreamResponse, error) {
		return nc.client.CreateStream(ctx, in, opts...)
	})
}

// Append goes to the leader of the stream's group.
func (r *Router) Append(ctx context.Context, in *streamv1.AppendRequest, opts ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.append(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.AppendResponse, error) {
		return nc.append(ctx, in, opts...)
	})
}

// AppendStream is not routed: Append carries each node's appends on an
// AppendStream call of its own.
func (r *Router) AppendStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse], error) {
	return nil, status.Error(codes.Unimplemented, "upstream: the router carries appends on AppendStream itself; call Append")
}

// DeleteStream goes to the leader of the stream's group.
func (r *Router) DeleteStream(ctx context.Context, in *streamv1.DeleteStreamRequest, opts ...grpc.CallOption) (*streamv1.DeleteStreamResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.DeleteStream(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.DeleteStreamResponse, error) {
		return nc.client.DeleteStream(ctx, in, opts...)
	})
}

// SetRetention goes to the leader of the stream's group.
func (r *Router) SetRetention(ctx context.Context, in *streamv1.SetRetentionRequest, opts ...grpc.CallOption) (*streamv1.SetRetentionResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.SetRetention(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.SetRetentionResponse, error) {
		return nc.client.SetRetention(ctx, in, opts...)
	})
}

// Head goes to the leader: it reports the tail.
func (r *Router) Head(ctx context.Context, in *streamv1.HeadRequest, opts ...grpc.CallOption) (*streamv1.HeadResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.Head(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeLeaderRead, func(nc *nodeConn) (*streamv1.HeadResponse, error) {
		return nc.client.Head(ctx, in, opts...)
	})
}

// OffsetNow is the read offset that means "the tail".
const OffsetNow = "now"

// readMode routes tail reads (offset "now", long-polls) to the leader and
// history reads to any replica.
func readMode(in *streamv1.ReadRequest) mode {
	if in.GetOffset() == OffsetNow || in.GetWaitMs() > 0 {
		return modeLeaderRead
	}
	return modeAnyRead
}

// Read goes to the leader when it must see the tail (offset "now" or a
// wait), otherwise to any replica, the leader preferred.
func (r *Router) Read(ctx context.Context, in *streamv1.ReadRequest, opts ...grpc.CallOption) (*streamv1.ReadResponse, error) {
	if len(opts) == 0 {
		opts = readCodecOptions // no slice to build for each read
	} else {
		opts = append(opts[:len(opts):len(opts)], readCodecOption)
	}
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.Read(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), readMode(in), func(nc *nodeConn) (*streamv1.ReadResponse, error) {
		return nc.client.Read(ctx, in, opts...)
	})
}

// GetClusterInfo asks any node (a node believed up first), retrying once at
// another node after a transport failure.
func (r *Router) GetClusterInfo(ctx context.Context, in *streamv1.GetClusterInfoRequest, opts ...grpc.CallOption) (*streamv1.GetClusterInfoResponse, error) {
	v, err := r.currentView(ctx)
	if err != nil {
		return nil, err
	}
	if v.single != nil {
		return v.single.client.GetClusterInfo(ctx, in, opts...)
	}
	nc := r.anyNode(v, nil)
	if nc == nil {
		return nil, r.unavailable("no storage node known")
	}
	resp, err := nc.client.GetClusterInfo(ctx, in, opts...)
	if err == nil || ctx.Err() != nil {
		return resp, err
	}
	if kind, _ := classify(err); kind != failTransport {
		return nil, err
	}
	r.m.transportFailures.Add(1)
	nc.up.Store(false)
	r.requestRefresh()
	other := r.anyNode(v, nc)
	if other == nil {
		return nil, err
	}
	r.m.retries.Add(1)
	return other.client.GetClusterInfo(ctx, in, opts...)
}

// Subscribe goes to the leader. A NOT_LEADER or transport failure before the
// first chunk (when opening the stream or on the first Recv) reopens the
// subscription once at the re-learned leader; a failure after chunks were
// delivered ends the stream with that error (the caller resubscribes from
// its last offset).
func (r *Router) Subscribe(ctx context.Context, in *streamv1.SubscribeRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.Subscribe(ctx, in, opts...)
	}
	v, err := r.currentView(ctx)
	if err != nil {
		return nil, err
	}
	if v.single != nil {
		return v.single.client.Subscribe(ctx, in, opts...)
	}
	s := &subStream{r: r, ctx: ctx, in: in, opts: opts, g: placementGroup(v, in.GetRef())}
	nc, err := r.first(ctx, v, r.gen.Load(), s.g, modeLeaderRead)
	if err != nil {
		return nil, err
	}
	s.gen = r.gen.Load()
	if err := s.open(nc); err != nil {
		return nil, err
	}
	return s, nil
}

// subStream is a subscription that may be reopened once at another node
// before its first chunk.
type subStream struct {
	r    *Router
	ctx  context.Context //nolint:containedctx // a stream lives as long as its context
	in   *streamv1.SubscribeRequest
	opts []grpc.CallOption
	gen  uint64
	g    uint32

	nc       *nodeConn
	cur      grpc.ServerStreamingClient[streamv1.SubscribeResponse]
	received bool
	retried  bool
}

// open opens the stream at nc, retrying once elsewhere if that fails.
func (s *subStream) open(nc *nodeConn) error {
	for {
		st, err := nc.client.Subscribe(s.ctx, s.in, s.opts...)
		if err == nil {
			s.nc, s.cur = nc, st
			return nil
		}
		if s.retried {
			return s.r.settle(s.g, nc, err)
		}
		next, err := s.r.next(s.ctx, s.gen, s.g, modeLeaderRead, nc, err)
		if next == nil {
			return err
		}
		s.retried = true
		s.r.m.retries.Add(1)
		nc = next
	}
}

// Recv returns the next chunk, reopening the stream once if it fails
// before the first one.
func (s *subStream) Recv() (*streamv1.SubscribeResponse, error) {
	m, err := s.cur.Recv()
	if err == nil {
		if !s.received {
			s.received = true
			s.nc.markUp()
		}
		return m, nil
	}
	if err == io.EOF || s.received {
		return nil, err
	}
	if s.retried {
		return nil, s.r.settle(s.g, s.nc, err)
	}
	next, nerr := s.r.next(s.ctx, s.gen, s.g, modeLeaderRead, s.nc, err)
	if next == nil {
		return nil, nerr
	}
	s.retried = true
	s.r.m.retries.Add(1)
	if err := s.open(next); err != nil {
		return nil, err
	}
	return s.Recv()
}

func (s *subStream) Header() (metadata.MD, error) { return s.cur.Header() }
func (s *subStream) Trailer() metadata.MD         { return s.cur.Trailer() }
func (s *subStream) CloseSend() error             { return s.cur.CloseSend() }
func (s *subStream) Context() context.Context     { return s.cur.Context() }
func (s *subStream) SendMsg(m any) error          { return s.cur.SendMsg(m) }
func (s *subStream) RecvMsg(m any) error          { return s.cur.RecvMsg(m) }

// Ursula's extension calls, routed like the core ones: writes to the
// stream's (or, for buckets, group 0's) leader, reads that must be fresh
// to the leader too.

// PutSnapshot goes to the leader of the stream's group.
func (r *Router) PutSnapshot(ctx context.Context, in *streamv1.PutSnapshotRequest, opts ...grpc.CallOption) (*streamv1.PutSnapshotResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.PutSnapshot(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.PutSnapshotResponse, error) {
		return nc.client.PutSnapshot(ctx, in, opts...)
	})
}

// GetSnapshot goes to the leader of the stream's group.
func (r *Router) GetSnapshot(ctx context.Context, in *streamv1.GetSnapshotRequest, opts ...grpc.CallOption) (*streamv1.GetSnapshotResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.GetSnapshot(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeLeaderRead, func(nc *nodeConn) (*streamv1.GetSnapshotResponse, error) {
		return nc.client.GetSnapshot(ctx, in, opts...)
	})
}

// PutSnapshotPart goes to the leader of the stream's group, which keeps
// the index of staged parts.
func (r *Router) PutSnapshotPart(ctx context.Context, in *streamv1.PutSnapshotPartRequest, opts ...grpc.CallOption) (*streamv1.PutSnapshotPartResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.PutSnapshotPart(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.PutSnapshotPartResponse, error) {
		return nc.client.PutSnapshotPart(ctx, in, opts...)
	})
}

// CommitSnapshot goes to the leader of the stream's group.
func (r *Router) CommitSnapshot(ctx context.Context, in *streamv1.CommitSnapshotRequest, opts ...grpc.CallOption) (*streamv1.CommitSnapshotResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.CommitSnapshot(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.CommitSnapshotResponse, error) {
		return nc.client.CommitSnapshot(ctx, in, opts...)
	})
}

// GetAttrs goes to the leader of the stream's group.
func (r *Router) GetAttrs(ctx context.Context, in *streamv1.GetAttrsRequest, opts ...grpc.CallOption) (*streamv1.GetAttrsResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.GetAttrs(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeLeaderRead, func(nc *nodeConn) (*streamv1.GetAttrsResponse, error) {
		return nc.client.GetAttrs(ctx, in, opts...)
	})
}

// SetAttrs goes to the leader of the stream's group.
func (r *Router) SetAttrs(ctx context.Context, in *streamv1.SetAttrsRequest, opts ...grpc.CallOption) (*streamv1.SetAttrsResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.SetAttrs(ctx, in, opts...)
	}
	return do(ctx, r, in.GetRef(), modeWrite, func(nc *nodeConn) (*streamv1.SetAttrsResponse, error) {
		return nc.client.SetAttrs(ctx, in, opts...)
	})
}

// GetBucket goes to the leader of the bucket group's group.
func (r *Router) GetBucket(ctx context.Context, in *streamv1.GetBucketRequest, opts ...grpc.CallOption) (*streamv1.GetBucketResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.GetBucket(ctx, in, opts...)
	}
	return do(ctx, r, nil, modeLeaderRead, func(nc *nodeConn) (*streamv1.GetBucketResponse, error) {
		return nc.client.GetBucket(ctx, in, opts...)
	})
}

// DeleteBucket goes to the leader of the bucket group's group.
func (r *Router) DeleteBucket(ctx context.Context, in *streamv1.DeleteBucketRequest, opts ...grpc.CallOption) (*streamv1.DeleteBucketResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.DeleteBucket(ctx, in, opts...)
	}
	return do(ctx, r, nil, modeWrite, func(nc *nodeConn) (*streamv1.DeleteBucketResponse, error) {
		return nc.client.DeleteBucket(ctx, in, opts...)
	})
}

// ListStreams goes to the leader of the bucket group's group.
func (r *Router) ListStreams(ctx context.Context, in *streamv1.ListStreamsRequest, opts ...grpc.CallOption) (*streamv1.ListStreamsResponse, error) {
	if v := r.view.Load(); v != nil && v.single != nil {
		return v.single.client.ListStreams(ctx, in, opts...)
	}
	return do(ctx, r, nil, modeLeaderRead, func(nc *nodeConn) (*streamv1.ListStreamsResponse, error) {
		return nc.client.ListStreams(ctx, in, opts...)
	})
}
