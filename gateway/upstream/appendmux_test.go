package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/tests/await"
)

func TestAppendsShareOneCall(t *testing.T) {
	c := newFakeCluster(t, 1, 4)
	r := newRouter(t, c.addrs(), false)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			resp, err := r.Append(ctx, &streamv1.AppendRequest{Ref: ref("b", fmt.Sprint("s", i))})
			if err == nil && resp.GetNextOffset() != "node1" {
				err = fmt.Errorf("answered %v", resp)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := c.node(1)
	if got := n.count("Append"); got != 200 {
		t.Fatalf("the node served %d appends, want 200", got)
	}
	if got := n.count("AppendStream"); got != 1 {
		t.Fatalf("the appends took %d AppendStream calls, want 1", got)
	}
}

func TestAppendStreamErrorsAreAppendErrors(t *testing.T) {
	c := newFakeCluster(t, 1, 4)
	r := newRouter(t, c.addrs(), false)
	want := grpcerr.ToStatus(errcode.New(errcode.StreamClosed, "closed").With(errcode.KeyNextOffset, "0000000000000000_0000000000000007"))
	c.node(1).fail("Append", want)
	_, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s")})
	if !proto.Equal(status.Convert(err).Proto(), status.Convert(want).Proto()) {
		t.Fatalf("Append = %v, want exactly %v", status.Convert(err).Proto(), status.Convert(want).Proto())
	}
	if c.node(1).count("AppendStream") != 1 {
		t.Fatal("the append did not go on AppendStream")
	}
}

func TestOlderNodeGetsUnaryAppends(t *testing.T) {
	c := newFakeCluster(t, 1, 4)
	n := c.node(1)
	n.mu.Lock()
	n.noAppendStream = true
	n.mu.Unlock()
	r := newRouter(t, c.addrs(), false)
	for i := range 20 {
		if _, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", fmt.Sprint("s", i))}); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
	}
	if got := n.count("Append"); got != 20 {
		t.Fatalf("%d appends served, want 20", got)
	}
	if got := n.count("AppendStream"); got != 1 {
		t.Fatalf("%d AppendStream calls, want 1 (then unary for %v)", got, unimplementedRetry)
	}
}

// scriptedNode serves AppendStream as told, for the call's edge cases.
type scriptedNode struct {
	streamv1.UnimplementedStreamServiceServer
	addr string
	srv  *grpc.Server

	// serve runs one AppendStream call.
	serve func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error
	mu    sync.Mutex
	calls int
	unary int
}

func startScriptedNode(t *testing.T, serve func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error) *scriptedNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &scriptedNode{addr: lis.Addr().String(), srv: grpc.NewServer(), serve: serve}
	streamv1.RegisterStreamServiceServer(n.srv, n)
	go func() { _ = n.srv.Serve(lis) }()
	t.Cleanup(n.srv.Stop)
	return n
}

func (n *scriptedNode) AppendStream(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
	n.mu.Lock()
	n.calls++
	n.mu.Unlock()
	return n.serve(call)
}

func (n *scriptedNode) Append(context.Context, *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
	n.mu.Lock()
	n.unary++
	n.mu.Unlock()
	return &streamv1.AppendResponse{NextOffset: "unary"}, nil
}

func (n *scriptedNode) counts() (calls, unary int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls, n.unary
}

// muxTo returns an append mux to n's address.
func muxTo(t *testing.T, n *scriptedNode) *appendMux {
	t.Helper()
	r := newRouter(t, []string{n.addr}, false)
	nc := r.seeds[0]
	if nc.appends == nil {
		t.Fatal("no append mux on the connection")
	}
	return nc.appends
}

func answer(id uint64, next string) *streamv1.AppendStreamResponse {
	return &streamv1.AppendStreamResponse{Id: id, Append: &streamv1.AppendResponse{NextOffset: next}}
}

func TestAppendStreamAnswersOutOfOrder(t *testing.T) {
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		var held []*streamv1.AppendStreamRequest
		for {
			req, err := call.Recv()
			if err != nil {
				return nil
			}
			held = append(held, req)
			if len(held) < 3 {
				continue
			}
			for i := len(held) - 1; i >= 0; i-- { // the last sent is answered first
				if err := call.Send(answer(held[i].GetId(), string(held[i].GetAppend().GetBody()))); err != nil {
					return err
				}
			}
			held = nil
		}
	})
	m := muxTo(t, n)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			body := fmt.Sprint("append ", i)
			resp, err := m.Append(t.Context(), &streamv1.AppendRequest{Body: []byte(body)})
			if err != nil || resp.GetNextOffset() != body {
				t.Errorf("append %d answered %v, %v", i, resp, err)
			}
		})
	}
	wg.Wait()
}

func TestBrokenAppendCallIsNoProofOfNotSending(t *testing.T) {
	got := make(chan struct{})
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		if _, err := call.Recv(); err != nil {
			return err
		}
		close(got)
		<-call.Context().Done() // never answers: the connection breaks first
		return nil
	})
	m := muxTo(t, n)
	errc := make(chan error, 1)
	go func() {
		_, err := m.Append(t.Context(), &streamv1.AppendRequest{Body: []byte("x")})
		errc <- err
	}()
	<-got
	n.srv.Stop() // the node dies with the append in hand
	err := <-errc
	if status.Code(err) != codes.Unavailable || notSent(err) {
		t.Fatalf("Append = %v, want UNAVAILABLE that does not claim the append was never sent", err)
	}
	if kind, _ := classify(err); kind != failTransport {
		t.Fatalf("classified %v, want a transport failure", kind)
	}
	if _, unary := n.counts(); unary != 0 {
		t.Fatalf("the append was sent again as a unary call (%d)", unary)
	}
}

func TestRefusedAppendCallFallsBackToUnary(t *testing.T) {
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		if _, err := call.Recv(); err != nil {
			return err
		}
		// The handler's own refusal: it answers what it started before it
		// returns, so what is left was never started.
		return status.Error(codes.Aborted, "shutting down")
	})
	m := muxTo(t, n)
	resp, err := m.Append(t.Context(), &streamv1.AppendRequest{Body: []byte("x")})
	if err != nil || resp.GetNextOffset() != "unary" {
		t.Fatalf("Append = %v, %v; want the unary answer", resp, err)
	}
}

func TestDrainingNodeEndsTheCallAndTheNextOneOpens(t *testing.T) {
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		req, err := call.Recv()
		if err != nil {
			return err
		}
		if err := call.Send(&streamv1.AppendStreamResponse{Draining: true}); err != nil {
			return err
		}
		if err := call.Send(answer(req.GetId(), "before the drain")); err != nil {
			return err
		}
		// The caller closes its side once told.
		if _, err := call.Recv(); err == nil {
			return status.Error(codes.Internal, "the caller sent after the drain")
		}
		return nil
	})
	m := muxTo(t, n)
	for i := range 2 {
		resp, err := m.Append(t.Context(), &streamv1.AppendRequest{Body: []byte("x")})
		if err != nil || resp.GetNextOffset() != "before the drain" {
			t.Fatalf("append %d = %v, %v", i, resp, err)
		}
	}
	if calls, unary := n.counts(); calls != 2 || unary != 0 {
		t.Fatalf("%d AppendStream calls and %d unary appends, want 2 and 0", calls, unary)
	}
}

func TestCancelledAppendIsCancelledOnTheNode(t *testing.T) {
	cancelled := make(chan uint64, 1)
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		for {
			req, err := call.Recv()
			if err != nil {
				return nil
			}
			if req.GetCancel() {
				cancelled <- req.GetId()
			}
		}
	})
	m := muxTo(t, n)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := m.Append(ctx, &streamv1.AppendRequest{Body: []byte("x")})
		errc <- err
	}()
	await.True(t, "the append is in flight", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.cur == nil {
			return false
		}
		m.cur.mu.Lock()
		defer m.cur.mu.Unlock()
		return len(m.cur.pending) == 1
	})
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("Append = %v, want CANCELED", err)
	}
	select {
	case id := <-cancelled:
		if id != 1 {
			t.Fatalf("cancel of id %d, want 1", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the node never heard of the cancel")
	}
}

func TestUndecodableAppendErrorIsInternal(t *testing.T) {
	n := startScriptedNode(t, func(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
		req, err := call.Recv()
		if err != nil {
			return err
		}
		if err := call.Send(&streamv1.AppendStreamResponse{Id: req.GetId(), Error: []byte{0xff, 0xff}}); err != nil {
			return err
		}
		_, _ = call.Recv()
		return nil
	})
	m := muxTo(t, n)
	_, err := m.Append(t.Context(), &streamv1.AppendRequest{Body: []byte("x")})
	if status.Code(err) != codes.Internal {
		t.Fatalf("Append = %v, want INTERNAL", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("unexpected cancel")
	}
}

func TestLargeAppendIsACallOfItsOwn(t *testing.T) {
	c := newFakeCluster(t, 1, 4)
	r := newRouter(t, c.addrs(), false)
	if _, err := r.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("b", "s"), Body: make([]byte, muxMaxBytes+1)}); err != nil {
		t.Fatal(err)
	}
	if n := c.node(1); n.count("Append") != 1 || n.count("AppendStream") != 0 {
		t.Fatalf("%d appends on %d AppendStream calls, want 1 on none", n.count("Append"), n.count("AppendStream"))
	}
}
