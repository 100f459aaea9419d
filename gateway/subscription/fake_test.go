package subscription

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// fakeStreams is a tiny in-memory StreamServiceClient for unit tests: byte
// offsets formatted as %016d_%016d, JSON streams stored one value per line.
type fakeStreams struct {
	streamv1.StreamServiceClient // unimplemented methods panic

	mu         sync.Mutex
	streams    map[string]*fakeStream
	appendErr  error
	heads      int
	appendHook func(ref *streamv1.StreamRef)
}

type fakeStream struct {
	contentType string
	data        []byte
}

func newFakeStreams() *fakeStreams { return &fakeStreams{streams: map[string]*fakeStream{}} }

func key(ref *streamv1.StreamRef) string { return ref.GetBucket() + "/" + ref.GetStream() }

func fakeOffset(n int) string { return fmt.Sprintf("%016d_%016d", 0, n) }

func notFound(ref *streamv1.StreamRef) error {
	return grpcerr.ToStatus(errcode.New(errcode.StreamNotFound, "stream %s not found", key(ref)))
}

func encodeBody(contentType string, body []byte) ([]byte, error) {
	if !isJSONContentType(contentType) {
		return body, nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, grpcerr.ToStatus(errcode.New(errcode.InvalidArgument, "invalid json"))
	}
	var out bytes.Buffer
	vals := []any{v}
	if arr, ok := v.([]any); ok {
		vals = arr
	}
	for _, x := range vals {
		b, _ := json.Marshal(x)
		out.Write(b)
		out.WriteByte('\n')
	}
	return out.Bytes(), nil
}

func (f *fakeStreams) CreateStream(_ context.Context, in *streamv1.CreateStreamRequest, _ ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.streams[key(in.GetRef())]; ok {
		return &streamv1.CreateStreamResponse{Info: &streamv1.StreamInfo{ContentType: s.contentType, NextOffset: fakeOffset(len(s.data))}}, nil
	}
	ct := in.GetContentType()
	if ct == "" {
		ct = "application/octet-stream"
	}
	s := &fakeStream{contentType: ct}
	if len(in.GetBody()) > 0 {
		b, err := encodeBody(ct, in.GetBody())
		if err != nil {
			return nil, err
		}
		s.data = b
	}
	f.streams[key(in.GetRef())] = s
	return &streamv1.CreateStreamResponse{Created: true, Info: &streamv1.StreamInfo{ContentType: ct, NextOffset: fakeOffset(len(s.data))}}, nil
}

func (f *fakeStreams) Append(_ context.Context, in *streamv1.AppendRequest, _ ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.appendErr != nil {
		return nil, f.appendErr
	}
	s, ok := f.streams[key(in.GetRef())]
	if !ok {
		return nil, notFound(in.GetRef())
	}
	if in.GetContentType() != s.contentType {
		return nil, grpcerr.ToStatus(errcode.New(errcode.ContentTypeMismatch, "content type mismatch"))
	}
	b, err := encodeBody(s.contentType, in.GetBody())
	if err != nil {
		return nil, err
	}
	s.data = append(s.data, b...)
	if f.appendHook != nil {
		f.appendHook(in.GetRef())
	}
	return &streamv1.AppendResponse{NextOffset: fakeOffset(len(s.data))}, nil
}

func (f *fakeStreams) Read(_ context.Context, in *streamv1.ReadRequest, _ ...grpc.CallOption) (*streamv1.ReadResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.streams[key(in.GetRef())]
	if !ok {
		return nil, notFound(in.GetRef())
	}
	start := 0
	if in.GetOffset() != "-1" {
		_, pos, _ := strings.Cut(in.GetOffset(), "_")
		n, err := strconv.Atoi(pos)
		if err != nil || n > len(s.data) {
			return nil, grpcerr.ToStatus(errcode.New(errcode.OffsetOutOfRange, "bad offset"))
		}
		start = n
	}
	// Serve at most 64 bytes per read to exercise pagination.
	end := min(len(s.data), start+64)
	if isJSONContentType(s.contentType) && end < len(s.data) {
		if i := bytes.IndexByte(s.data[end:], '\n'); i >= 0 {
			end += i + 1
		}
	}
	return &streamv1.ReadResponse{
		Data: append([]byte(nil), s.data[start:end]...), StartOffset: fakeOffset(start),
		NextOffset: fakeOffset(end), UpToDate: end == len(s.data), ContentType: s.contentType,
	}, nil
}

func (f *fakeStreams) Head(_ context.Context, in *streamv1.HeadRequest, _ ...grpc.CallOption) (*streamv1.HeadResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heads++
	s, ok := f.streams[key(in.GetRef())]
	if !ok {
		return nil, notFound(in.GetRef())
	}
	return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: s.contentType, NextOffset: fakeOffset(len(s.data))}}, nil
}

func (f *fakeStreams) DeleteStream(_ context.Context, in *streamv1.DeleteStreamRequest, _ ...grpc.CallOption) (*streamv1.DeleteStreamResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.streams[key(in.GetRef())]; !ok {
		return nil, notFound(in.GetRef())
	}
	delete(f.streams, key(in.GetRef()))
	return &streamv1.DeleteStreamResponse{}, nil
}

// write creates or appends to a family-1 stream, like the gateway would.
func (f *fakeStreams) write(bucket, path, contentType string, body []byte) (created bool) {
	ref := &streamv1.StreamRef{Bucket: bucket, Stream: path}
	f.mu.Lock()
	_, exists := f.streams[key(ref)]
	f.mu.Unlock()
	if !exists {
		if _, err := f.CreateStream(context.Background(), &streamv1.CreateStreamRequest{Ref: ref, ContentType: contentType, Body: body, HasBody: true}); err != nil {
			panic(err)
		}
		return true
	}
	if _, err := f.Append(context.Background(), &streamv1.AppendRequest{Ref: ref, ContentType: contentType, Body: body}); err != nil {
		panic(err)
	}
	return false
}

// lines returns the JSON values stored in a stream.
func (f *fakeStreams) lines(bucket, path string) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.streams[bucket+"/"+path]
	if !ok {
		return nil
	}
	var out []map[string]any
	for l := range bytes.SplitSeq(s.data, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var v map[string]any
		_ = json.Unmarshal(l, &v)
		out = append(out, v)
	}
	return out
}
