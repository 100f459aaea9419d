package inproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

func TestUnaryHandsOverTheRequestObject(t *testing.T) {
	resp := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}
	var gotReq, interceptorReq *healthpb.HealthCheckRequest
	h := &fakeHealth{check: func(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		gotReq = req
		return resp, nil
	}}
	s := newInproc(t, setup{
		register: registerHealth(h),
		unaryInts: []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			interceptorReq = req.(*healthpb.HealthCheckRequest)
			return handler(ctx, req)
		}},
	})

	req := &healthpb.HealthCheckRequest{Service: "svc"}
	reply, err := healthpb.NewHealthClient(s).Check(t.Context(), req)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if gotReq != req || interceptorReq != req {
		t.Errorf("handler got %p, interceptor %p; want the caller's request %p", gotReq, interceptorReq, req)
	}
	if reply == resp {
		t.Errorf("reply is the handler's response object; want the client's own copy")
	}
	if !proto.Equal(reply, resp) {
		t.Errorf("reply = %v, want %v", reply, resp)
	}
}

func TestReplyDelivery(t *testing.T) {
	h := &fakeHealth{check: func(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if req.GetService() == "nil" {
			return nil, nil
		}
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}}
	tests := []struct {
		name    string
		service string
		reply   any
		want    codes.Code
		// netAccepts: over the network the call succeeds instead.
		netAccepts bool
		check      func(t *testing.T, reply any)
	}{
		{
			name: "same type", reply: new(healthpb.HealthCheckResponse), want: codes.OK,
			check: func(t *testing.T, reply any) {
				if got := reply.(*healthpb.HealthCheckResponse).GetStatus(); got != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("status = %v, want SERVING", got)
				}
			},
		},
		{
			name: "nil response is the empty message", service: "nil", reply: &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, want: codes.OK,
			check: func(t *testing.T, reply any) {
				if !proto.Equal(reply.(proto.Message), &healthpb.HealthCheckResponse{}) {
					t.Errorf("reply = %v, want empty", reply)
				}
			},
		},
		// Protobuf decoding takes the other type's bytes as unknown fields;
		// in-process there are no bytes, and a wrong type is an error.
		{name: "other reply type", reply: new(healthpb.HealthListResponse), want: codes.Internal, netAccepts: true},
		{name: "nil reply", reply: nil, want: codes.Internal},
	}
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		for _, tc := range tests {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				req := &healthpb.HealthCheckRequest{Service: tc.service}
				err := d.conn.Invoke(t.Context(), healthpb.Health_Check_FullMethodName, req, tc.reply)
				want := tc.want
				if d.name == "loopback" && tc.netAccepts {
					want = codes.OK
				}
				if got := status.Code(err); got != want {
					t.Fatalf("code = %v (%v), want %v", got, err, want)
				}
				if tc.check != nil {
					tc.check(t, tc.reply)
				}
			})
		}
	}
}

func TestErrors(t *testing.T) {
	withDetails, err := status.New(codes.FailedPrecondition, "stream closed").WithDetails(&errdetails.ErrorInfo{
		Reason:   "STREAM_CLOSED",
		Domain:   "ursula",
		Metadata: map[string]string{"next_offset": "5"},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		method      string // Check if empty
		handlerErr  error
		wantCode    codes.Code
		wantMessage string
		wantDetails []proto.Message
	}{
		{name: "status with details", handlerErr: withDetails.Err(), wantCode: codes.FailedPrecondition, wantMessage: "stream closed",
			wantDetails: []proto.Message{&errdetails.ErrorInfo{Reason: "STREAM_CLOSED", Domain: "ursula", Metadata: map[string]string{"next_offset": "5"}}}},
		{name: "wrapped status", handlerErr: fmt.Errorf("lookup: %w", status.Error(codes.NotFound, "no such stream")),
			wantCode: codes.NotFound, wantMessage: "lookup: rpc error: code = NotFound desc = no such stream"},
		{name: "context canceled", handlerErr: context.Canceled, wantCode: codes.Canceled, wantMessage: "context canceled"},
		{name: "wrapped deadline", handlerErr: fmt.Errorf("read: %w", context.DeadlineExceeded), wantCode: codes.DeadlineExceeded, wantMessage: "read: context deadline exceeded"},
		{name: "plain error", handlerErr: errors.New("boom"), wantCode: codes.Unknown, wantMessage: "boom"},
		{name: "unknown service", method: "/nope.v1.Nope/Get", wantCode: codes.Unimplemented, wantMessage: "unknown service nope.v1.Nope"},
		{name: "unknown method", method: "/grpc.health.v1.Health/Nope", wantCode: codes.Unimplemented, wantMessage: "unknown method Nope for service grpc.health.v1.Health"},
		{name: "malformed method", method: "/nope", wantCode: codes.Unimplemented, wantMessage: `malformed method name: "/nope"`},
	}
	var mu sync.Mutex
	handlerErr := map[string]error{}
	h := &fakeHealth{check: func(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		return nil, handlerErr[req.GetService()]
	}}
	for _, tc := range tests {
		handlerErr[tc.name] = tc.handlerErr
	}
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		for _, tc := range tests {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				method := cmpOr(tc.method, healthpb.Health_Check_FullMethodName)
				err := d.conn.Invoke(t.Context(), method, &healthpb.HealthCheckRequest{Service: tc.name}, new(healthpb.HealthCheckResponse))
				assertStatus(t, err, tc.wantCode, tc.wantMessage, tc.wantDetails)
				if tc.handlerErr != nil && err == tc.handlerErr {
					t.Errorf("the caller's error is the handler's error value; over a network it cannot be")
				}
			})
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func assertStatus(t testing.TB, err error, code codes.Code, message string, details []proto.Message) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v (%T) is not a status", err, err)
	}
	if st.Code() != code || st.Message() != message {
		t.Errorf("status = %v %q, want %v %q", st.Code(), st.Message(), code, message)
	}
	got := st.Details()
	if len(got) != len(details) {
		t.Fatalf("details = %v, want %v", got, details)
	}
	for i := range got {
		if pm, ok := got[i].(proto.Message); !ok || !proto.Equal(pm, details[i]) {
			t.Errorf("detail %d = %v, want %v", i, got[i], details[i])
		}
	}
}

func TestHandlerPanicIsNotRecovered(t *testing.T) {
	h := &fakeHealth{check: func(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		panic("handler bug")
	}}
	s := newInproc(t, setup{register: registerHealth(h)})
	got := func() (r any) {
		defer func() { r = recover() }()
		_, _ = healthpb.NewHealthClient(s).Check(t.Context(), &healthpb.HealthCheckRequest{})
		return nil
	}()
	if got != "handler bug" {
		t.Fatalf("recovered %v, want the handler's panic", got)
	}
}

type callerKey struct{}

// seen is what a handler observed of its context.
type seen struct {
	incoming    metadata.MD
	hasOutgoing bool
	peer        *peer.Peer
	deadline    time.Time
	callerValue any
	method      string
}

func observe(ctx context.Context) seen {
	var s seen
	s.incoming, _ = metadata.FromIncomingContext(ctx)
	_, s.hasOutgoing = metadata.FromOutgoingContext(ctx)
	s.peer, _ = peer.FromContext(ctx)
	s.deadline, _ = ctx.Deadline()
	s.callerValue = ctx.Value(callerKey{})
	s.method, _ = grpc.Method(ctx)
	return s
}

func TestMetadataPeerDeadline(t *testing.T) {
	seenc := make(chan seen, 1)
	h := &fakeHealth{
		check: func(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			seenc <- observe(ctx)
			if err := grpc.SetHeader(ctx, metadata.Pairs("x-header", "h1")); err != nil {
				return nil, err
			}
			if err := grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t1")); err != nil {
				return nil, err
			}
			return &healthpb.HealthCheckResponse{}, nil
		},
		watch: func(_ *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			seenc <- observe(ss.Context())
			if err := ss.SendHeader(metadata.Pairs("x-header", "h2")); err != nil {
				return err
			}
			ss.SetTrailer(metadata.Pairs("x-trailer", "t2"))
			return ss.Send(&healthpb.HealthCheckResponse{})
		},
	}
	deadline := time.Now().Add(time.Hour)
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		ctx, cancel := context.WithDeadline(t.Context(), deadline)
		defer cancel()
		ctx = context.WithValue(ctx, callerKey{}, "caller's")
		ctx = metadata.AppendToOutgoingContext(ctx, "x-key", "v", "x-raw-bin", "\x00\xff")
		client := healthpb.NewHealthClient(d.conn)

		checkSeen := func(t *testing.T, s seen, method string) {
			t.Helper()
			if got := s.incoming.Get("x-key"); !slices.Equal(got, []string{"v"}) {
				t.Errorf("incoming x-key = %q, want [v]", got)
			}
			if got := s.incoming.Get("x-raw-bin"); !slices.Equal(got, []string{"\x00\xff"}) {
				t.Errorf("incoming x-raw-bin = %q, want the bytes", got)
			}
			if s.hasOutgoing {
				t.Errorf("handler context carries outgoing metadata")
			}
			if s.callerValue != nil {
				t.Errorf("handler context carries the caller's value %v", s.callerValue)
			}
			if diff := s.deadline.Sub(deadline).Abs(); diff > time.Second {
				t.Errorf("handler deadline %v, want the caller's %v", s.deadline, deadline)
			}
			if s.method != method {
				t.Errorf("grpc.Method = %q, want %q", s.method, method)
			}
			if s.peer == nil {
				t.Fatalf("no peer")
			}
			if d.name == "inproc" {
				if s.peer.Addr.Network() != "inproc" || !s.deadline.Equal(deadline) {
					t.Errorf("peer %v on %q, deadline %v; want inproc and exactly %v", s.peer.Addr, s.peer.Addr.Network(), s.deadline, deadline)
				}
			}
		}

		t.Run(d.name+"/unary", func(t *testing.T) {
			var header, trailer metadata.MD
			var p peer.Peer
			if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer), grpc.Peer(&p)); err != nil {
				t.Fatalf("Check: %v", err)
			}
			checkSeen(t, <-seenc, healthpb.Health_Check_FullMethodName)
			if got := header.Get("x-header"); !slices.Equal(got, []string{"h1"}) {
				t.Errorf("header x-header = %q, want [h1]", got)
			}
			if got := trailer.Get("x-trailer"); !slices.Equal(got, []string{"t1"}) {
				t.Errorf("trailer x-trailer = %q, want [t1]", got)
			}
			if p.Addr == nil {
				t.Errorf("grpc.Peer not filled")
			}
		})
		t.Run(d.name+"/stream", func(t *testing.T) {
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			header, err := stream.Header()
			if err != nil {
				t.Fatalf("Header: %v", err)
			}
			if got := header.Get("x-header"); !slices.Equal(got, []string{"h2"}) {
				t.Errorf("header x-header = %q, want [h2]", got)
			}
			if _, err := stream.Recv(); err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if _, err := stream.Recv(); err != io.EOF {
				t.Fatalf("Recv = %v, want EOF", err)
			}
			if got := stream.Trailer().Get("x-trailer"); !slices.Equal(got, []string{"t2"}) {
				t.Errorf("trailer x-trailer = %q, want [t2]", got)
			}
			checkSeen(t, <-seenc, healthpb.Health_Watch_FullMethodName)
		})
	}
}

func TestInvalidOutgoingMetadata(t *testing.T) {
	for _, d := range bothDeployments(t, setup{register: registerHealth(&fakeHealth{})}) {
		t.Run(d.name, func(t *testing.T) {
			ctx := metadata.NewOutgoingContext(t.Context(), metadata.MD{"bad key": {"v"}})
			_, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Internal {
				t.Fatalf("Check = %v, want Internal", err)
			}
		})
	}
}

func TestServerStreaming(t *testing.T) {
	send := func(ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse], n int) error {
		for range n {
			if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
				return err
			}
		}
		return nil
	}
	tests := []struct {
		name     string
		watch    func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error
		wantMsgs int
		wantCode codes.Code // OK: io.EOF
	}{
		{name: "three then end", watch: func(ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error { return send(ss, 3) }, wantMsgs: 3},
		{name: "more than the buffer", watch: func(ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			return send(ss, 3*defaultStreamBuffer)
		}, wantMsgs: 3 * defaultStreamBuffer},
		{name: "one then error", watch: func(ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			if err := send(ss, 1); err != nil {
				return err
			}
			return status.Error(codes.Aborted, "moved")
		}, wantMsgs: 1, wantCode: codes.Aborted},
		{name: "error first", watch: func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			return status.Error(codes.FailedPrecondition, "closed")
		}, wantCode: codes.FailedPrecondition},
	}
	byName := map[string]func(grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error{}
	for _, tc := range tests {
		byName[tc.name] = tc.watch
	}
	h := &fakeHealth{watch: func(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
		return byName[req.GetService()](ss)
	}}
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		for _, tc := range tests {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				stream, err := healthpb.NewHealthClient(d.conn).Watch(t.Context(), &healthpb.HealthCheckRequest{Service: tc.name})
				if err != nil {
					t.Fatalf("Watch: %v", err)
				}
				n := 0
				for {
					_, err = stream.Recv()
					if err != nil {
						break
					}
					n++
				}
				if n != tc.wantMsgs {
					t.Errorf("received %d messages, want %d", n, tc.wantMsgs)
				}
				if tc.wantCode == codes.OK && err != io.EOF {
					t.Errorf("end = %v, want EOF", err)
				}
				if tc.wantCode != codes.OK && status.Code(err) != tc.wantCode {
					t.Errorf("end = %v, want %v", err, tc.wantCode)
				}
			})
		}
	}
}

func TestClientAndBidiStreaming(t *testing.T) {
	for _, d := range bothDeployments(t, setup{register: registerEcho}) {
		t.Run(d.name+"/client streaming", func(t *testing.T) {
			cs, err := d.conn.NewStream(t.Context(), collectDesc, echoCollect)
			if err != nil {
				t.Fatalf("NewStream: %v", err)
			}
			for _, s := range []string{"a", "b", "c"} {
				if err := cs.SendMsg(wrapperspb.String(s)); err != nil {
					t.Fatalf("SendMsg: %v", err)
				}
			}
			if err := cs.CloseSend(); err != nil {
				t.Fatalf("CloseSend: %v", err)
			}
			got := new(wrapperspb.StringValue)
			if err := cs.RecvMsg(got); err != nil {
				t.Fatalf("RecvMsg: %v", err)
			}
			if got.GetValue() != "abc" {
				t.Errorf("got %q, want abc", got.GetValue())
			}
			if err := cs.SendMsg(wrapperspb.String("late")); status.Code(err) != codes.Internal {
				t.Errorf("SendMsg after CloseSend = %v, want Internal", err)
			}
		})
		t.Run(d.name+"/bidi", func(t *testing.T) {
			cs, err := d.conn.NewStream(t.Context(), chatDesc, echoChat)
			if err != nil {
				t.Fatalf("NewStream: %v", err)
			}
			for _, s := range []string{"x", "y", "z"} {
				if err := cs.SendMsg(wrapperspb.String(s)); err != nil {
					t.Fatalf("SendMsg: %v", err)
				}
				got := new(wrapperspb.StringValue)
				if err := cs.RecvMsg(got); err != nil {
					t.Fatalf("RecvMsg: %v", err)
				}
				if got.GetValue() != s {
					t.Errorf("echo %q, want %q", got.GetValue(), s)
				}
			}
			if err := cs.CloseSend(); err != nil {
				t.Fatalf("CloseSend: %v", err)
			}
			if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != io.EOF {
				t.Errorf("RecvMsg after CloseSend = %v, want EOF", err)
			}
		})
		t.Run(d.name+"/invoke a streaming method", func(t *testing.T) {
			// Invoke on a client-streaming method: a unary call through
			// the stream machinery, as grpc's Invoke always is.
			got := new(wrapperspb.StringValue)
			err := d.conn.Invoke(t.Context(), echoCollect, wrapperspb.String("one"), got)
			if err != nil {
				t.Fatalf("Invoke: %v", err)
			}
			if got.GetValue() != "one" {
				t.Errorf("got %q, want one", got.GetValue())
			}
		})
	}
}

func TestUnaryMethodThroughNewStream(t *testing.T) {
	for _, d := range bothDeployments(t, setup{register: registerHealth(&fakeHealth{})}) {
		t.Run(d.name, func(t *testing.T) {
			cs, err := d.conn.NewStream(t.Context(), &grpc.StreamDesc{}, healthpb.Health_Check_FullMethodName)
			if err != nil {
				t.Fatalf("NewStream: %v", err)
			}
			if err := cs.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("SendMsg: %v", err)
			}
			got := new(healthpb.HealthCheckResponse)
			if err := cs.RecvMsg(got); err != nil {
				t.Fatalf("RecvMsg: %v", err)
			}
			if got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("status = %v, want SERVING", got.GetStatus())
			}
		})
	}
}

// TestCancel cancels the caller's context in the middle of calls: the
// handler's context ends, a blocked server SendMsg returns, the handler's
// goroutine ends (TestMain's goleak checks that) and the caller sees
// Canceled.
func TestCancel(t *testing.T) {
	type outcome struct {
		sent    int
		sendErr error
		ctxErr  error
	}
	// Each subtest's request names its hooks, so that a late handler of one
	// subtest cannot signal another.
	type hooks struct {
		started  chan struct{}
		outcomes chan outcome
	}
	var byName sync.Map
	hooksOf := func(req *healthpb.HealthCheckRequest) hooks {
		h, _ := byName.Load(req.GetService())
		return h.(hooks)
	}
	newHooks := func(t *testing.T) (*healthpb.HealthCheckRequest, hooks) {
		h := hooks{started: make(chan struct{}, 1), outcomes: make(chan outcome, 1)}
		byName.Store(t.Name(), h)
		return &healthpb.HealthCheckRequest{Service: t.Name()}, h
	}
	h := &fakeHealth{
		check: func(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			hooksOf(req).started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		},
		watch: func(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			hk := hooksOf(req)
			var o outcome
			for o.sendErr == nil {
				o.sendErr = ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
				if o.sendErr == nil {
					o.sent++
					if o.sent == 1 {
						hk.started <- struct{}{}
					}
				}
			}
			// grpc may fail the send a moment before it ends the context.
			<-ss.Context().Done()
			o.ctxErr = ss.Context().Err()
			hk.outcomes <- o
			return o.sendErr
		},
	}
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		client := healthpb.NewHealthClient(d.conn)
		t.Run(d.name+"/unary", func(t *testing.T) {
			req, hk := newHooks(t)
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				<-hk.started
				cancel()
			}()
			_, err := client.Check(ctx, req)
			if status.Code(err) != codes.Canceled {
				t.Fatalf("Check = %v, want Canceled", err)
			}
		})
		t.Run(d.name+"/deadline", func(t *testing.T) {
			req, _ := newHooks(t)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			defer cancel()
			_, err := client.Check(ctx, req)
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("Check = %v, want DeadlineExceeded", err)
			}
		})
		t.Run(d.name+"/server stream", func(t *testing.T) {
			req, hk := newHooks(t)
			ctx, cancel := context.WithCancel(t.Context())
			stream, err := client.Watch(ctx, req)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			<-hk.started // the handler is sending; nobody reads
			cancel()
			o := <-hk.outcomes
			if status.Code(o.sendErr) != codes.Canceled || o.ctxErr == nil {
				t.Errorf("handler: SendMsg = %v, context error %v; want Canceled and an ended context", o.sendErr, o.ctxErr)
			}
			for err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.Canceled {
				t.Errorf("Recv = %v, want Canceled", err)
			}
		})
	}
}

// TestStreamSendBlocksOnFullBuffer holds the bounded buffer to its bound: with
// room for one message and a caller that does not read, the handler's second
// SendMsg cannot succeed, and returns once the caller gives up.
func TestStreamSendBlocksOnFullBuffer(t *testing.T) {
	first := make(chan struct{})
	result := make(chan error, 1)
	h := &fakeHealth{watch: func(_ *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
		if err := ss.Send(&healthpb.HealthCheckResponse{}); err != nil {
			result <- err
			return err
		}
		close(first)
		err := ss.Send(&healthpb.HealthCheckResponse{})
		result <- err
		return err
	}}
	s := NewServer(WithStreamBuffer(1))
	healthpb.RegisterHealthServer(s, h)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := healthpb.NewHealthClient(s).Watch(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	<-first
	select {
	case err := <-result:
		t.Fatalf("second SendMsg returned %v with the buffer full", err)
	default:
	}
	cancel()
	if err := <-result; status.Code(err) != codes.Canceled {
		t.Fatalf("second SendMsg = %v, want Canceled", err)
	}
}

// TestHandlerContextEndsWithTheCall checks that a handler's context, and
// contexts derived from it, end when the call ends, as grpc.Server's do.
func TestHandlerContextEndsWithTheCall(t *testing.T) {
	type kept struct {
		ctx, child context.Context
		cancel     context.CancelFunc
		fired      chan struct{}
	}
	keptc := make(chan kept, 1)
	h := &fakeHealth{check: func(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		child, cancel := context.WithCancel(ctx)
		k := kept{ctx: ctx, child: child, cancel: cancel, fired: make(chan struct{})}
		context.AfterFunc(ctx, func() { close(k.fired) })
		keptc <- k
		return &healthpb.HealthCheckResponse{}, nil
	}}
	for _, d := range bothDeployments(t, setup{register: registerHealth(h)}) {
		t.Run(d.name, func(t *testing.T) {
			if _, err := healthpb.NewHealthClient(d.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("Check: %v", err)
			}
			k := <-keptc
			defer k.cancel()
			<-k.ctx.Done()
			<-k.child.Done()
			<-k.fired
			if !errors.Is(k.ctx.Err(), context.Canceled) || !errors.Is(k.child.Err(), context.Canceled) {
				t.Errorf("errors %v, %v; want Canceled", k.ctx.Err(), k.child.Err())
			}
		})
	}
}

func TestCallContext(t *testing.T) {
	t.Run("caller canceled before anyone waits", func(t *testing.T) {
		caller, cancel := context.WithCancel(t.Context())
		c := &callContext{caller: caller, values: context.Background()}
		cancel()
		if err := c.Err(); err != context.Canceled {
			t.Fatalf("Err = %v, want Canceled", err)
		}
		<-c.Done()
	})
	t.Run("caller canceled while waiting", func(t *testing.T) {
		caller, cancel := context.WithCancel(t.Context())
		c := &callContext{caller: caller, values: context.Background()}
		done := c.Done()
		if c.Err() != nil {
			t.Fatalf("Err before cancel = %v", c.Err())
		}
		cancel()
		<-done
		if err := c.Err(); err != context.Canceled {
			t.Fatalf("Err = %v, want Canceled", err)
		}
	})
	t.Run("call ends first", func(t *testing.T) {
		caller, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		c := &callContext{caller: caller, values: context.WithValue(context.Background(), callerKey{}, "conn")}
		child, childCancel := context.WithCancel(c)
		defer childCancel()
		stopped := context.AfterFunc(c, func() { t.Error("stopped AfterFunc ran") })
		if !stopped() {
			t.Fatalf("stop = false before the context ended")
		}
		c.cancel(context.Canceled)
		<-child.Done()
		if got := child.Value(callerKey{}); got != "conn" {
			t.Errorf("value = %v, want conn", got)
		}
		if dl, ok := child.Deadline(); !ok || time.Until(dl) < time.Minute {
			t.Errorf("deadline = %v, %v; want the caller's", dl, ok)
		}
		if caller.Err() != nil {
			t.Errorf("the call's end canceled the caller")
		}
	})
}

func TestInterceptors(t *testing.T) {
	var mu sync.Mutex
	var trace []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trace = append(trace, s)
	}
	impl := &fakeHealth{}
	unary := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			record(fmt.Sprintf("%s> %s server=%v", name, info.FullMethod, info.Server == impl))
			resp, err := handler(ctx, req)
			record("<" + name)
			return resp, err
		}
	}
	stream := func(name string) grpc.StreamServerInterceptor {
		return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			_, hasMD := metadata.FromIncomingContext(ss.Context())
			record(fmt.Sprintf("%s> %s cs=%v ss=%v md=%v", name, info.FullMethod, info.IsClientStream, info.IsServerStream, hasMD))
			err := handler(srv, ss)
			record("<" + name)
			return err
		}
	}
	cfg := setup{
		register:   registerAll(impl),
		unaryInts:  []grpc.UnaryServerInterceptor{unary("u1"), unary("u2")},
		streamInts: []grpc.StreamServerInterceptor{stream("s1"), stream("s2")},
	}
	tests := []struct {
		name string
		call func(t *testing.T, conn grpc.ClientConnInterface)
		want []string
	}{
		{
			name: "unary",
			call: func(t *testing.T, conn grpc.ClientConnInterface) {
				if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatalf("Check: %v", err)
				}
			},
			want: []string{"u1> /grpc.health.v1.Health/Check server=true", "u2> /grpc.health.v1.Health/Check server=true", "<u2", "<u1"},
		},
		{
			name: "unary through NewStream",
			call: func(t *testing.T, conn grpc.ClientConnInterface) {
				cs, err := conn.NewStream(t.Context(), &grpc.StreamDesc{}, healthpb.Health_Check_FullMethodName)
				if err != nil {
					t.Fatalf("NewStream: %v", err)
				}
				if err := cs.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
					t.Fatalf("SendMsg: %v", err)
				}
				if err := cs.RecvMsg(new(healthpb.HealthCheckResponse)); err != nil {
					t.Fatalf("RecvMsg: %v", err)
				}
			},
			want: []string{"u1> /grpc.health.v1.Health/Check server=true", "u2> /grpc.health.v1.Health/Check server=true", "<u2", "<u1"},
		},
		{
			name: "server streaming",
			call: func(t *testing.T, conn grpc.ClientConnInterface) {
				stream, err := healthpb.NewHealthClient(conn).Watch(t.Context(), &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatalf("Watch: %v", err)
				}
				for err == nil {
					_, err = stream.Recv()
				}
			},
			want: []string{"s1> /grpc.health.v1.Health/Watch cs=false ss=true md=true", "s2> /grpc.health.v1.Health/Watch cs=false ss=true md=true", "<s2", "<s1"},
		},
		{
			name: "bidi",
			call: func(t *testing.T, conn grpc.ClientConnInterface) {
				cs, err := conn.NewStream(t.Context(), chatDesc, echoChat)
				if err != nil {
					t.Fatalf("NewStream: %v", err)
				}
				if err := cs.CloseSend(); err != nil {
					t.Fatalf("CloseSend: %v", err)
				}
				if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != io.EOF {
					t.Fatalf("RecvMsg = %v, want EOF", err)
				}
			},
			want: []string{"s1> /inproc.test.Echo/Chat cs=true ss=true md=true", "s2> /inproc.test.Echo/Chat cs=true ss=true md=true", "<s2", "<s1"},
		},
	}
	for _, d := range bothDeployments(t, cfg) {
		for _, tc := range tests {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				mu.Lock()
				trace = nil
				mu.Unlock()
				tc.call(t, d.conn)
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(trace, tc.want) {
					t.Errorf("interceptors ran\n  %s\nwant\n  %s", strings.Join(trace, "\n  "), strings.Join(tc.want, "\n  "))
				}
			})
		}
	}
}

func TestRegisterService(t *testing.T) {
	tests := []struct {
		name      string
		register  func(s *Server)
		wantPanic string
	}{
		{
			name: "duplicate",
			register: func(s *Server) {
				healthpb.RegisterHealthServer(s, &fakeHealth{})
				healthpb.RegisterHealthServer(s, &fakeHealth{})
			},
			wantPanic: `duplicate service registration for "grpc.health.v1.Health"`,
		},
		{
			name:      "wrong implementation",
			register:  func(s *Server) { s.RegisterService(&healthpb.Health_ServiceDesc, echoServer{}) },
			wantPanic: "does not satisfy grpc_health_v1.HealthServer",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := func() (r any) {
				defer func() { r = recover() }()
				tc.register(NewServer())
				return nil
			}()
			if s, _ := got.(string); !strings.Contains(s, tc.wantPanic) {
				t.Fatalf("panic %v, want one containing %q", got, tc.wantPanic)
			}
		})
	}
}

// TestConcurrentCalls runs unary and streaming calls from several goroutines
// while a service is registered, for the race detector. Every Check returns
// the same response object, which the no-copy contract allows.
func TestConcurrentCalls(t *testing.T) {
	rec := newRecorder()
	h := &fakeHealth{check: func(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		return servingResp, nil
	}}
	s := newInproc(t, setup{
		register:    registerHealth(h),
		serverStats: []stats.Handler{rec.side(false)},
		clientStats: []stats.Handler{rec.side(true)},
		unaryInts: []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}},
	})
	client := healthpb.NewHealthClient(s)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
					t.Errorf("Check: %v", err)
					return
				}
			}
		})
		wg.Go(func() {
			for range 10 {
				stream, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Errorf("Watch: %v", err)
					return
				}
				go func() { _, _ = stream.Header() }()
				for err == nil {
					_, err = stream.Recv()
				}
				if err != io.EOF {
					t.Errorf("Recv: %v", err)
				}
			}
		})
	}
	wg.Go(func() { registerEcho(s) })
	wg.Wait()

	got := new(wrapperspb.StringValue)
	if err := s.Invoke(t.Context(), echoCollect, wrapperspb.String("late"), got); err != nil || got.GetValue() != "late" {
		t.Fatalf("service registered after calls: %v, %q", err, got.GetValue())
	}
}

// fakeStreams is the project's StreamService with only Subscribe, the
// server-streaming call the all-in-one gateway makes.
type fakeStreams struct {
	streamv1.UnimplementedStreamServiceServer
}

func (fakeStreams) Subscribe(req *streamv1.SubscribeRequest, srv streamv1.StreamService_SubscribeServer) error {
	for i := range 2 {
		chunk := &streamv1.ReadResponse{Data: []byte(req.GetRef().GetStream()), NextOffset: fmt.Sprint(i + 1), UpToDate: i == 1}
		if err := srv.Send(&streamv1.SubscribeResponse{Chunk: chunk}); err != nil {
			return err
		}
	}
	return nil
}

func TestProjectStreamService(t *testing.T) {
	register := func(r grpc.ServiceRegistrar) { streamv1.RegisterStreamServiceServer(r, fakeStreams{}) }
	for _, d := range bothDeployments(t, setup{register: register}) {
		client := streamv1.NewStreamServiceClient(d.conn)
		t.Run(d.name+"/subscribe", func(t *testing.T) {
			sub, err := client.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: &streamv1.StreamRef{Bucket: "b", Stream: "s"}})
			if err != nil {
				t.Fatalf("Subscribe: %v", err)
			}
			var offsets []string
			for {
				resp, err := sub.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("Recv: %v", err)
				}
				if string(resp.GetChunk().GetData()) != "s" {
					t.Errorf("chunk data %q, want s", resp.GetChunk().GetData())
				}
				offsets = append(offsets, resp.GetChunk().GetNextOffset())
			}
			if !slices.Equal(offsets, []string{"1", "2"}) {
				t.Errorf("offsets %q, want [1 2]", offsets)
			}
		})
		t.Run(d.name+"/unimplemented", func(t *testing.T) {
			_, err := client.Append(t.Context(), &streamv1.AppendRequest{})
			assertStatus(t, err, codes.Unimplemented, "method Append not implemented", nil)
		})
	}
}
