package node

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// errorInfo returns the gRPC code and the Ursula ErrorInfo of err.
func errorInfo(err error) (codes.Code, *errdetails.ErrorInfo) {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == grpcerr.Domain {
			return st.Code(), info
		}
	}
	return st.Code(), nil
}

// testStreamClient is the StreamService contract, run against every client
// (gRPC over the client plane, and the in-process Conn): it needs a
// ready single-node server whose counters start at zero.
func testStreamClient(t *testing.T, c streamv1.StreamServiceClient) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: "b"}); err != nil {
		t.Fatalf("CreateBucket: %v", err)
	}
	ref := func(name string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: "b", Stream: name} }
	if _, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain"}); err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	for _, body := range []string{"hello ", "world"} {
		if _, err := c.Append(ctx, &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain", Body: []byte(body)}); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	t.Run("read and head", func(t *testing.T) {
		r, err := c.Read(ctx, &streamv1.ReadRequest{Ref: ref("s"), Offset: "-1"})
		if err != nil || string(r.GetData()) != "hello world" || !r.GetUpToDate() {
			t.Fatalf("Read = %v, %v", r, err)
		}
		h, err := c.Head(ctx, &streamv1.HeadRequest{Ref: ref("s")})
		if err != nil || h.GetInfo().GetNextOffset() != stream.FormatOffset(11) || h.GetInfo().GetContentType() != "text/plain" {
			t.Fatalf("Head = %v, %v", h, err)
		}
	})
	t.Run("errors keep their domain code", func(t *testing.T) {
		tests := []struct {
			name     string
			call     func() error
			wantGRPC codes.Code
			wantCode errcode.Code
		}{
			{"missing stream", func() error {
				_, err := c.Head(ctx, &streamv1.HeadRequest{Ref: ref("nope")})
				return err
			}, codes.NotFound, errcode.StreamNotFound},
			{"missing bucket", func() error {
				_, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "nope", Stream: "s"}})
				return err
			}, codes.NotFound, errcode.BucketNotFound},
			{"config mismatch", func() error {
				_, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "application/json"})
				return err
			}, codes.AlreadyExists, errcode.StreamExists},
			{"content type mismatch", func() error {
				_, err := c.Append(ctx, &streamv1.AppendRequest{Ref: ref("s"), ContentType: "application/json", Body: []byte("1")})
				return err
			}, codes.FailedPrecondition, errcode.ContentTypeMismatch},
			{"malformed offset", func() error {
				_, err := c.Read(ctx, &streamv1.ReadRequest{Ref: ref("s"), Offset: "x"})
				return err
			}, codes.InvalidArgument, errcode.InvalidArgument},
			{"offset beyond the tail", func() error {
				_, err := c.Read(ctx, &streamv1.ReadRequest{Ref: ref("s"), Offset: stream.FormatOffset(12)})
				return err
			}, codes.OutOfRange, errcode.OffsetOutOfRange},
			{"producer gap", func() error {
				_, err := c.Append(ctx, &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain", Body: []byte("x"), Producer: &streamv1.Producer{Id: "p", Seq: 3}})
				return err
			}, codes.Aborted, errcode.ProducerSeqGap},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				code, info := errorInfo(tc.call())
				if code != tc.wantGRPC || info == nil || info.GetReason() != errcode.Reason(tc.wantCode) {
					t.Fatalf("error %v %v, want %v %s", code, info, tc.wantGRPC, tc.wantCode)
				}
			})
		}
	})
	t.Run("subscribe until close", func(t *testing.T) {
		if _, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref("sub"), HasBody: true, Body: []byte("a")}); err != nil {
			t.Fatal(err)
		}
		sub, err := c.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref("sub"), Offset: "-1"})
		if err != nil {
			t.Fatal(err)
		}
		first, err := sub.Recv()
		if err != nil || string(first.GetChunk().GetData()) != "a" {
			t.Fatalf("catch-up = %v, %v", first, err)
		}
		if _, err := c.Append(ctx, &streamv1.AppendRequest{Ref: ref("sub"), ContentType: "application/octet-stream", Body: []byte("b"), Close: true}); err != nil {
			t.Fatal(err)
		}
		last, err := sub.Recv()
		if err != nil || string(last.GetChunk().GetData()) != "b" || !last.GetChunk().GetClosed() {
			t.Fatalf("live chunk = %v, %v", last, err)
		}
		if _, err := sub.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Recv after the closing chunk = %v, want io.EOF", err)
		}
	})
	t.Run("subscribe to a missing stream", func(t *testing.T) {
		sub, err := c.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref("nope")})
		if err == nil {
			_, err = sub.Recv()
		}
		if code, info := errorInfo(err); code != codes.NotFound || info.GetReason() != errcode.Reason(errcode.StreamNotFound) {
			t.Fatalf("Subscribe = %v", err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		if _, err := c.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref("sub")}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Head(ctx, &streamv1.HeadRequest{Ref: ref("sub")}); status.Code(err) != codes.NotFound {
			t.Fatalf("Head after delete = %v", err)
		}
	})
}

func TestInProcessConn(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	c := streamv1.NewStreamServiceClient(s.Conn())
	testStreamClient(t, c)

	t.Run("metrics count the requests", func(t *testing.T) {
		m := s.metricsSnapshot()
		if m["append_requests"].(float64) < 5 || m["append_errors"].(float64) < 2 || m["read_requests"].(float64) < 3 {
			t.Fatalf("counters: appends %v errors %v reads %v", m["append_requests"], m["append_errors"], m["read_requests"])
		}
		if m["sse_subscribers"] != float64(0) || m["live_read_waiters"] != float64(0) {
			t.Fatalf("gauges not back to zero: subscribers %v waiters %v", m["sse_subscribers"], m["live_read_waiters"])
		}
	})
	t.Run("subscribe ends when its context is cancelled", func(t *testing.T) {
		ref := &streamv1.StreamRef{Bucket: "b", Stream: "cancel"}
		if _, err := c.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		sub, err := c.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.Recv(); err != nil {
			t.Fatalf("first chunk: %v", err)
		}
		if got := s.metricsSnapshot()["sse_subscribers"]; got != float64(1) {
			t.Fatalf("sse_subscribers = %v while subscribed", got)
		}
		cancel()
		done := make(chan error, 1)
		go func() {
			_, err := sub.Recv()
			done <- err
		}()
		// As over the network: the caller's cancellation is a Canceled
		// status.
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("Recv after cancel = %v, want Canceled", err)
		}
		// The server half has finished too (goleak checks the goroutine).
		await.True(t, "the subscriber gauge to drop", func() bool {
			return s.metricsSnapshot()["sse_subscribers"] == float64(0)
		})
	})
	t.Run("subscribe with an unread backlog ends on cancel", func(t *testing.T) {
		ref := &streamv1.StreamRef{Bucket: "b", Stream: "backlog"}
		if _, err := c.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref}); err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			if _, err := c.Append(t.Context(), &streamv1.AppendRequest{Ref: ref, ContentType: "application/octet-stream", Body: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		// One byte per chunk: more chunks than the stream's buffer holds,
		// and nobody reads them.
		if _, err := c.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref, MaxBytes: 1}); err != nil {
			t.Fatal(err)
		}
		await.True(t, "the subscriber to start", func() bool {
			return s.metricsSnapshot()["sse_subscribers"] == float64(1)
		})
		cancel()
		await.True(t, "the blocked server half to end", func() bool {
			return s.metricsSnapshot()["sse_subscribers"] == float64(0)
		})
	})
}

func TestNotLeaderNamesTheLeadersAddress(t *testing.T) {
	svc := &streamService{leaderAddrs: map[uint64]string{2: "n2:4437"}}
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code
		wantAddr string
	}{
		{"known leader", errcode.New(errcode.NotLeader, "x").With(errcode.KeyLeaderID, "2"), codes.Unavailable, "n2:4437"},
		{"unknown leader id", errcode.New(errcode.NotLeader, "x").With(errcode.KeyLeaderID, "9"), codes.Unavailable, ""},
		{"no leader", errcode.New(errcode.NotLeader, "x"), codes.Unavailable, ""},
		{"other errors untouched", errcode.New(errcode.StreamNotFound, "x").With(errcode.KeyLeaderID, "2"), codes.NotFound, ""},
		{"context", context.Canceled, codes.Canceled, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, info := errorInfo(svc.status(tc.err))
			if code != tc.wantCode || info.GetMetadata()[errcode.KeyLeaderAddr] != tc.wantAddr {
				t.Fatalf("status %v %v, want %v leader_addr %q", code, info, tc.wantCode, tc.wantAddr)
			}
		})
	}
	if svc.status(nil) != nil {
		t.Fatal("status(nil) is not nil")
	}
}
