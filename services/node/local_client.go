package node

import (
	"context"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// LocalClient returns a StreamServiceClient that calls this server's
// StreamService implementation in-process: the all-in-one target uses it so
// that the gateway and the node share one process without paying for a
// loopback HTTP/2 hop per request. Both sides run exactly the code they run
// in a split deployment (the gateway sees the same client interface and
// gRPC status errors; the node runs the same service adapter); only the
// transport is skipped. Requests are not copied: callers must not modify a
// request after passing it. Each call starts the server span the otelgrpc
// handler starts over gRPC (same name, kind and attributes), as a child of
// the caller's span in ctx, so traces have the same shape in both
// deployments (less the client span of the skipped hop).
func (s *Server) LocalClient() streamv1.StreamServiceClient {
	return &localClient{svc: s.streams}
}

type localClient struct {
	svc *streamService
}

func (c *localClient) CreateBucket(ctx context.Context, in *streamv1.CreateBucketRequest, _ ...grpc.CallOption) (*streamv1.CreateBucketResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_CreateBucket_FullMethodName)
	resp, err := c.svc.CreateBucket(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) CreateStream(ctx context.Context, in *streamv1.CreateStreamRequest, _ ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_CreateStream_FullMethodName)
	resp, err := c.svc.CreateStream(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) Append(ctx context.Context, in *streamv1.AppendRequest, _ ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_Append_FullMethodName)
	resp, err := c.svc.Append(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) Read(ctx context.Context, in *streamv1.ReadRequest, _ ...grpc.CallOption) (*streamv1.ReadResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_Read_FullMethodName)
	resp, err := c.svc.Read(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) Head(ctx context.Context, in *streamv1.HeadRequest, _ ...grpc.CallOption) (*streamv1.HeadResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_Head_FullMethodName)
	resp, err := c.svc.Head(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) SetRetention(ctx context.Context, in *streamv1.SetRetentionRequest, _ ...grpc.CallOption) (*streamv1.SetRetentionResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_SetRetention_FullMethodName)
	resp, err := c.svc.SetRetention(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) DeleteStream(ctx context.Context, in *streamv1.DeleteStreamRequest, _ ...grpc.CallOption) (*streamv1.DeleteStreamResponse, error) {
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_DeleteStream_FullMethodName)
	resp, err := c.svc.DeleteStream(ctx, in)
	endLocalSpan(span, err)
	return resp, err
}

func (c *localClient) GetClusterInfo(ctx context.Context, in *streamv1.GetClusterInfoRequest, _ ...grpc.CallOption) (*streamv1.GetClusterInfoResponse, error) {
	return c.svc.GetClusterInfo(ctx, in)
}

// Subscribe runs the server side in a goroutine that hands each message to
// the client through a channel; cancelling ctx ends both.
func (c *localClient) Subscribe(ctx context.Context, in *streamv1.SubscribeRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
	ctx, cancel := context.WithCancel(ctx)
	ctx, span := startLocalSpan(ctx, streamv1.StreamService_Subscribe_FullMethodName)
	st := &localStream{ctx: ctx, cancel: cancel, msgs: make(chan *streamv1.SubscribeResponse, 16)}
	go func() {
		err := c.svc.Subscribe(in, &localServerStream{st: st})
		endLocalSpan(span, err)
		st.finish(err)
	}()
	return st, nil
}

// localStream is the client half of an in-process server stream.
type localStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	msgs   chan *streamv1.SubscribeResponse

	mu   sync.Mutex
	err  error
	done bool
}

func (s *localStream) finish(err error) {
	s.mu.Lock()
	s.err, s.done = err, true
	s.mu.Unlock()
	close(s.msgs)
}

func (s *localStream) Recv() (*streamv1.SubscribeResponse, error) {
	m, ok := <-s.msgs
	if ok {
		return m, nil
	}
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	// Whether the caller cancelled must be read before this stream's own
	// cancel, which would make every clean end look cancelled.
	cerr := s.ctx.Err()
	s.cancel()
	if err == nil {
		if cerr != nil {
			return nil, cerr
		}
		return nil, io.EOF
	}
	return nil, err
}

func (s *localStream) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (s *localStream) Trailer() metadata.MD         { return metadata.MD{} }
func (s *localStream) CloseSend() error             { return nil }
func (s *localStream) Context() context.Context     { return s.ctx }
func (s *localStream) SendMsg(any) error            { return nil }
func (s *localStream) RecvMsg(m any) error {
	r, err := s.Recv()
	if err != nil {
		return err
	}
	dst, ok := m.(*streamv1.SubscribeResponse)
	if !ok {
		return fmt.Errorf("node: local stream cannot receive into %T", m)
	}
	dst.Chunk = r.GetChunk()
	return nil
}

// localServerStream is the server half.
type localServerStream struct {
	grpc.ServerStream
	st *localStream
}

func (s *localServerStream) Context() context.Context { return s.st.ctx }

func (s *localServerStream) Send(m *streamv1.SubscribeResponse) error {
	select {
	case s.st.msgs <- m:
		return nil
	case <-s.st.ctx.Done():
		return s.st.ctx.Err()
	}
}

func (c *localClient) PutSnapshot(ctx context.Context, in *streamv1.PutSnapshotRequest, _ ...grpc.CallOption) (*streamv1.PutSnapshotResponse, error) {
	return c.svc.PutSnapshot(ctx, in)
}

func (c *localClient) PutSnapshotPart(ctx context.Context, in *streamv1.PutSnapshotPartRequest, _ ...grpc.CallOption) (*streamv1.PutSnapshotPartResponse, error) {
	return c.svc.PutSnapshotPart(ctx, in)
}

func (c *localClient) CommitSnapshot(ctx context.Context, in *streamv1.CommitSnapshotRequest, _ ...grpc.CallOption) (*streamv1.CommitSnapshotResponse, error) {
	return c.svc.CommitSnapshot(ctx, in)
}

func (c *localClient) GetSnapshot(ctx context.Context, in *streamv1.GetSnapshotRequest, _ ...grpc.CallOption) (*streamv1.GetSnapshotResponse, error) {
	return c.svc.GetSnapshot(ctx, in)
}

func (c *localClient) GetAttrs(ctx context.Context, in *streamv1.GetAttrsRequest, _ ...grpc.CallOption) (*streamv1.GetAttrsResponse, error) {
	return c.svc.GetAttrs(ctx, in)
}

func (c *localClient) SetAttrs(ctx context.Context, in *streamv1.SetAttrsRequest, _ ...grpc.CallOption) (*streamv1.SetAttrsResponse, error) {
	return c.svc.SetAttrs(ctx, in)
}

func (c *localClient) GetBucket(ctx context.Context, in *streamv1.GetBucketRequest, _ ...grpc.CallOption) (*streamv1.GetBucketResponse, error) {
	return c.svc.GetBucket(ctx, in)
}

func (c *localClient) DeleteBucket(ctx context.Context, in *streamv1.DeleteBucketRequest, _ ...grpc.CallOption) (*streamv1.DeleteBucketResponse, error) {
	return c.svc.DeleteBucket(ctx, in)
}

func (c *localClient) ListStreams(ctx context.Context, in *streamv1.ListStreamsRequest, _ ...grpc.CallOption) (*streamv1.ListStreamsResponse, error) {
	return c.svc.ListStreams(ctx, in)
}
