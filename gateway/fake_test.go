package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// fakeClient is a StreamServiceClient whose answers are set per test.
// Unset methods fail the test.
type fakeClient struct {
	t            testing.TB
	createBucket func(*streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error)
	createStream func(*streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error)
	appendFn     func(*streamv1.AppendRequest) (*streamv1.AppendResponse, error)
	read         func(context.Context, *streamv1.ReadRequest) (*streamv1.ReadResponse, error)
	head         func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error)
	setRetention func(*streamv1.SetRetentionRequest) (*streamv1.SetRetentionResponse, error)
	deleteStream func(*streamv1.DeleteStreamRequest) (*streamv1.DeleteStreamResponse, error)
	subscribe    func(context.Context, *streamv1.SubscribeRequest) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error)
	putSnapshot  func(*streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error)
	getSnapshot  func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error)
	putPart      func(*streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error)
	commit       func(*streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error)
	bucketFakes  // attrs, buckets and listing (buckets_test.go)
}

func (f *fakeClient) missing(name string) error {
	f.t.Helper()
	f.t.Errorf("unexpected call to %s", name)
	return io.ErrUnexpectedEOF
}

func (f *fakeClient) CreateBucket(_ context.Context, in *streamv1.CreateBucketRequest, _ ...grpc.CallOption) (*streamv1.CreateBucketResponse, error) {
	if f.createBucket == nil {
		return nil, f.missing("CreateBucket")
	}
	return f.createBucket(in)
}

func (f *fakeClient) CreateStream(_ context.Context, in *streamv1.CreateStreamRequest, _ ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	if f.createStream == nil {
		return nil, f.missing("CreateStream")
	}
	return f.createStream(in)
}

func (f *fakeClient) AppendStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse], error) {
	return nil, status.Error(codes.Unimplemented, "fake: no AppendStream")
}

func (f *fakeClient) Append(_ context.Context, in *streamv1.AppendRequest, _ ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	if f.appendFn == nil {
		return nil, f.missing("Append")
	}
	return f.appendFn(in)
}

func (f *fakeClient) Read(ctx context.Context, in *streamv1.ReadRequest, _ ...grpc.CallOption) (*streamv1.ReadResponse, error) {
	if f.read == nil {
		return nil, f.missing("Read")
	}
	return f.read(ctx, in)
}

func (f *fakeClient) Head(_ context.Context, in *streamv1.HeadRequest, _ ...grpc.CallOption) (*streamv1.HeadResponse, error) {
	if f.head == nil {
		return nil, f.missing("Head")
	}
	return f.head(in)
}

func (f *fakeClient) DeleteStream(_ context.Context, in *streamv1.DeleteStreamRequest, _ ...grpc.CallOption) (*streamv1.DeleteStreamResponse, error) {
	if f.deleteStream == nil {
		return nil, f.missing("DeleteStream")
	}
	return f.deleteStream(in)
}

func (f *fakeClient) SetRetention(_ context.Context, in *streamv1.SetRetentionRequest, _ ...grpc.CallOption) (*streamv1.SetRetentionResponse, error) {
	if f.setRetention == nil {
		return nil, f.missing("SetRetention")
	}
	return f.setRetention(in)
}

func (f *fakeClient) Subscribe(ctx context.Context, in *streamv1.SubscribeRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
	if f.subscribe == nil {
		return nil, f.missing("Subscribe")
	}
	return f.subscribe(ctx, in)
}

func (f *fakeClient) GetClusterInfo(context.Context, *streamv1.GetClusterInfoRequest, ...grpc.CallOption) (*streamv1.GetClusterInfoResponse, error) {
	return nil, f.missing("GetClusterInfo")
}

// fakeSubscription replays chunks, then blocks until its context ends
// (unless end is set, which makes it return io.EOF).
type fakeSubscription struct {
	grpc.ClientStream
	ctx    context.Context
	chunks []*streamv1.ReadResponse
	end    bool
}

func (s *fakeSubscription) Recv() (*streamv1.SubscribeResponse, error) {
	if len(s.chunks) > 0 {
		c := s.chunks[0]
		s.chunks = s.chunks[1:]
		return &streamv1.SubscribeResponse{Chunk: c}, nil
	}
	if s.end {
		return nil, io.EOF
	}
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}

// newTestGateway returns a gateway over f with test defaults.
func newTestGateway(t testing.TB, f *fakeClient, mutate func(*Config)) *Gateway {
	t.Helper()
	f.t = t
	cfg := Config{}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := New(cfg, f, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(g.Close)
	return g
}

// do runs one request through the gateway's handler.
func do(t testing.TB, g *Gateway, method, target string, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, req)
	return rec
}

var _ http.Flusher = (*recorder)(nil)

// cursorPattern matches the cursor field of control events.
var cursorPattern = regexp.MustCompile(`"streamCursor":"[0-9]+"`)

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

// failingClient answers every call with UNAVAILABLE.
type failingClient struct{}

func (failingClient) err() error { return status.Error(codes.Unavailable, "down") }

func (c failingClient) CreateBucket(context.Context, *streamv1.CreateBucketRequest, ...grpc.CallOption) (*streamv1.CreateBucketResponse, error) {
	return nil, c.err()
}

func (c failingClient) CreateStream(context.Context, *streamv1.CreateStreamRequest, ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	return nil, c.err()
}

func (c failingClient) AppendStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse], error) {
	return nil, c.err()
}

func (c failingClient) Append(context.Context, *streamv1.AppendRequest, ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	return nil, c.err()
}

func (c failingClient) Read(context.Context, *streamv1.ReadRequest, ...grpc.CallOption) (*streamv1.ReadResponse, error) {
	return nil, c.err()
}

func (c failingClient) Head(context.Context, *streamv1.HeadRequest, ...grpc.CallOption) (*streamv1.HeadResponse, error) {
	return nil, c.err()
}

func (c failingClient) DeleteStream(context.Context, *streamv1.DeleteStreamRequest, ...grpc.CallOption) (*streamv1.DeleteStreamResponse, error) {
	return nil, c.err()
}

func (c failingClient) GetClusterInfo(context.Context, *streamv1.GetClusterInfoRequest, ...grpc.CallOption) (*streamv1.GetClusterInfoResponse, error) {
	return nil, c.err()
}

func (c failingClient) Subscribe(context.Context, *streamv1.SubscribeRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
	return nil, c.err()
}

func (c failingClient) SetRetention(context.Context, *streamv1.SetRetentionRequest, ...grpc.CallOption) (*streamv1.SetRetentionResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) PutSnapshot(_ context.Context, in *streamv1.PutSnapshotRequest, _ ...grpc.CallOption) (*streamv1.PutSnapshotResponse, error) {
	if f.putSnapshot == nil {
		return nil, f.missing("PutSnapshot")
	}
	return f.putSnapshot(in)
}

func (c failingClient) PutSnapshot(context.Context, *streamv1.PutSnapshotRequest, ...grpc.CallOption) (*streamv1.PutSnapshotResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) GetSnapshot(_ context.Context, in *streamv1.GetSnapshotRequest, _ ...grpc.CallOption) (*streamv1.GetSnapshotResponse, error) {
	if f.getSnapshot == nil {
		return nil, f.missing("GetSnapshot")
	}
	return f.getSnapshot(in)
}

func (c failingClient) GetSnapshot(context.Context, *streamv1.GetSnapshotRequest, ...grpc.CallOption) (*streamv1.GetSnapshotResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) PutSnapshotPart(_ context.Context, in *streamv1.PutSnapshotPartRequest, _ ...grpc.CallOption) (*streamv1.PutSnapshotPartResponse, error) {
	if f.putPart == nil {
		return nil, f.missing("PutSnapshotPart")
	}
	return f.putPart(in)
}

func (c failingClient) PutSnapshotPart(context.Context, *streamv1.PutSnapshotPartRequest, ...grpc.CallOption) (*streamv1.PutSnapshotPartResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) CommitSnapshot(_ context.Context, in *streamv1.CommitSnapshotRequest, _ ...grpc.CallOption) (*streamv1.CommitSnapshotResponse, error) {
	if f.commit == nil {
		return nil, f.missing("CommitSnapshot")
	}
	return f.commit(in)
}

func (c failingClient) CommitSnapshot(context.Context, *streamv1.CommitSnapshotRequest, ...grpc.CallOption) (*streamv1.CommitSnapshotResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) GetAttrs(_ context.Context, in *streamv1.GetAttrsRequest, _ ...grpc.CallOption) (*streamv1.GetAttrsResponse, error) {
	if f.getAttrs == nil {
		return nil, f.missing("GetAttrs")
	}
	return f.getAttrs(in)
}

func (c failingClient) GetAttrs(context.Context, *streamv1.GetAttrsRequest, ...grpc.CallOption) (*streamv1.GetAttrsResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) SetAttrs(_ context.Context, in *streamv1.SetAttrsRequest, _ ...grpc.CallOption) (*streamv1.SetAttrsResponse, error) {
	if f.setAttrs == nil {
		return nil, f.missing("SetAttrs")
	}
	return f.setAttrs(in)
}

func (c failingClient) SetAttrs(context.Context, *streamv1.SetAttrsRequest, ...grpc.CallOption) (*streamv1.SetAttrsResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) GetBucket(_ context.Context, in *streamv1.GetBucketRequest, _ ...grpc.CallOption) (*streamv1.GetBucketResponse, error) {
	if f.getBucket == nil {
		return nil, f.missing("GetBucket")
	}
	return f.getBucket(in)
}

func (c failingClient) GetBucket(context.Context, *streamv1.GetBucketRequest, ...grpc.CallOption) (*streamv1.GetBucketResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) DeleteBucket(_ context.Context, in *streamv1.DeleteBucketRequest, _ ...grpc.CallOption) (*streamv1.DeleteBucketResponse, error) {
	if f.deleteBucket == nil {
		return nil, f.missing("DeleteBucket")
	}
	return f.deleteBucket(in)
}

func (c failingClient) DeleteBucket(context.Context, *streamv1.DeleteBucketRequest, ...grpc.CallOption) (*streamv1.DeleteBucketResponse, error) {
	return nil, c.err()
}

func (f *fakeClient) ListStreams(_ context.Context, in *streamv1.ListStreamsRequest, _ ...grpc.CallOption) (*streamv1.ListStreamsResponse, error) {
	if f.listStreams == nil {
		return nil, f.missing("ListStreams")
	}
	return f.listStreams(in)
}

func (c failingClient) ListStreams(context.Context, *streamv1.ListStreamsRequest, ...grpc.CallOption) (*streamv1.ListStreamsResponse, error) {
	return nil, c.err()
}
