package inproc

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// recorder writes down the stats events of both sides of calls.
type recorder struct {
	mu      sync.Mutex
	events  map[bool][]string // by Client
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{events: map[bool][]string{}, changed: make(chan struct{}, 1)}
}

// side is the stats.Handler of one side (client or server).
func (r *recorder) side(client bool) stats.Handler { return recorderSide{r: r, client: client} }

func (r *recorder) add(client bool, e string) {
	r.mu.Lock()
	r.events[client] = append(r.events[client], e)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = map[bool][]string{}
}

func (r *recorder) snapshot(client bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[client])
}

// waitServer waits until the server side has recorded an event starting
// with prefix: a grpc.Server may report the end of a call after its client
// has returned.
func (r *recorder) waitServer(t testing.TB, prefix string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		if slices.ContainsFunc(r.snapshot(false), func(e string) bool { return strings.HasPrefix(e, prefix) }) {
			return
		}
		select {
		case <-r.changed:
		case <-timeout:
			t.Fatalf("no server %q event; server saw %q", prefix, r.snapshot(false))
		}
	}
}

type recorderSide struct {
	r      *recorder
	client bool
}

func (h recorderSide) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	h.r.add(h.client, "Tag "+info.FullMethodName)
	return ctx
}

func (h recorderSide) HandleRPC(_ context.Context, s stats.RPCStats) {
	if s.IsClient() != h.client {
		h.r.add(h.client, fmt.Sprintf("%T from the wrong side", s))
		return
	}
	if e := describe(s); e != "" {
		h.r.add(h.client, e)
	}
}

func (recorderSide) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (recorderSide) HandleConn(context.Context, stats.ConnStats) {}

// describe is an event as far as both deployments must agree on it; it
// leaves out what a network hop has and an in-process one cannot
// (addresses, transport headers, header sizes).
func describe(s stats.RPCStats) string {
	switch s := s.(type) {
	case *stats.Begin:
		return fmt.Sprintf("Begin cs=%v ss=%v", s.IsClientStream, s.IsServerStream)
	case *stats.OutHeader:
		return words("OutHeader", s.FullMethod, probe(s.Header))
	case *stats.InHeader:
		return words("InHeader", s.FullMethod, probe(s.Header))
	case *stats.OutPayload:
		return fmt.Sprintf("OutPayload len=%d comp=%d wire=%d", s.Length, s.CompressedLength, s.WireLength)
	case *stats.InPayload:
		return fmt.Sprintf("InPayload len=%d comp=%d wire=%d", s.Length, s.CompressedLength, s.WireLength)
	case *stats.OutTrailer:
		return words("OutTrailer", probe(s.Trailer))
	case *stats.InTrailer:
		return words("InTrailer", probe(s.Trailer))
	case *stats.End:
		return "End " + status.Code(s.Error).String()
	case *stats.DelayedPickComplete:
		return "" // a network client waiting for its connection
	default:
		return fmt.Sprintf("%T", s)
	}
}

// words joins the non-empty ones.
func words(ws ...string) string {
	return strings.Join(slices.DeleteFunc(ws, func(w string) bool { return w == "" }), " ")
}

// probe shows the test's own metadata keys, which both deployments carry.
func probe(md metadata.MD) string {
	var out []string
	for _, k := range []string{"x-probe", "x-header", "x-trailer"} {
		if v := md.Get(k); len(v) > 0 {
			out = append(out, k+"="+strings.Join(v, ","))
		}
	}
	return strings.Join(out, " ")
}

// clientRank orders client events the way a network client reports them,
// except that its reader goroutine may report the response header before
// the caller reports its last request payload.
var clientRank = map[string]int{
	"Tag": 0, "Begin": 1, "OutHeader": 2, "OutPayload": 3,
	"InHeader": 4, "InPayload": 5, "InTrailer": 6, "End": 7,
}

func rankOrder(events []string) []string {
	out := slices.Clone(events)
	slices.SortStableFunc(out, func(a, b string) int {
		return clientRank[strings.Fields(a)[0]] - clientRank[strings.Fields(b)[0]]
	})
	return out
}

// TestStatsEvents drives the same calls through both deployments with a
// recording stats handler on each side and requires the same events: the
// server's in exactly the same order, the client's in the same order up to
// the race a network client has.
func TestStatsEvents(t *testing.T) {
	h := &fakeHealth{
		check: func(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			switch req.GetService() {
			case "missing":
				return nil, status.Error(codes.NotFound, "no such service")
			case "header then error":
				_ = grpc.SetHeader(ctx, metadata.Pairs("x-header", "h"))
				_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t"))
				return nil, status.Error(codes.Aborted, "retry")
			}
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t"))
			return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
		},
		watch: func(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			if req.GetService() == "closed" {
				return status.Error(codes.FailedPrecondition, "closed")
			}
			if err := ss.SendHeader(metadata.Pairs("x-header", "h")); err != nil {
				return err
			}
			for range 2 {
				if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	check := func(service string) func(context.Context, grpc.ClientConnInterface) error {
		return func(ctx context.Context, conn grpc.ClientConnInterface) error {
			_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			return err
		}
	}
	watch := func(service string) func(context.Context, grpc.ClientConnInterface) error {
		return func(ctx context.Context, conn grpc.ClientConnInterface) error {
			stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
			for err == nil {
				_, err = stream.Recv()
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
	tests := []struct {
		name       string
		call       func(context.Context, grpc.ClientConnInterface) error
		serverLast string // the server's last event
		// wantClient, if set, replaces the comparison of client events,
		// for a call whose network client events race.
		wantClient []string
	}{
		{name: "unary", call: check("ok"), serverLast: "End"},
		{name: "unary error", call: check("missing"), serverLast: "End"},
		{name: "unary error after header", call: check("header then error"), serverLast: "End"},
		{
			name: "unknown method", serverLast: "OutTrailer",
			call: func(ctx context.Context, conn grpc.ClientConnInterface) error {
				return conn.Invoke(ctx, "/grpc.health.v1.Health/Nope", &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse))
			},
			// A grpc.Server answers an unknown method as soon as it reads
			// the request header, and grpc's client may then see the
			// answer before it reports its own header and payload, or
			// not report them at all. These are its events when it does
			// not race.
			wantClient: []string{
				"Tag /grpc.health.v1.Health/Nope",
				"Begin cs=false ss=false",
				"OutHeader /grpc.health.v1.Health/Nope x-probe=p",
				"OutPayload len=0 comp=0 wire=5",
				"InTrailer",
				"End Unimplemented",
			},
		},
		{name: "server streaming", call: watch("ok"), serverLast: "End"},
		{name: "server streaming error first", call: watch("closed"), serverLast: "End"},
		{name: "client streaming", serverLast: "End", call: func(ctx context.Context, conn grpc.ClientConnInterface) error {
			cs, err := conn.NewStream(ctx, collectDesc, echoCollect)
			if err != nil {
				return err
			}
			for _, s := range []string{"first", "second"} {
				if err := cs.SendMsg(wrapperspb.String(s)); err != nil {
					return err
				}
			}
			if err := cs.CloseSend(); err != nil {
				return err
			}
			return cs.RecvMsg(new(wrapperspb.StringValue))
		}},
	}

	rec := newRecorder()
	cfg := setup{
		register:    registerAll(h),
		serverStats: []stats.Handler{rec.side(false)},
		clientStats: []stats.Handler{rec.side(true)},
	}
	deps := bothDeployments(t, cfg)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string][2][]string{} // deployment → client, server
			for _, d := range deps {
				rec.reset()
				ctx := metadata.AppendToOutgoingContext(t.Context(), "x-probe", "p")
				_ = tc.call(ctx, d.conn)
				rec.waitServer(t, tc.serverLast)
				got[d.name] = [2][]string{rec.snapshot(true), rec.snapshot(false)}
			}
			in, net := got["inproc"], got["loopback"]
			if !slices.Equal(in[0], rankOrder(in[0])) {
				t.Errorf("inproc client events out of order:\n  %s", strings.Join(in[0], "\n  "))
			}
			switch {
			case tc.wantClient != nil:
				if !slices.Equal(in[0], tc.wantClient) {
					t.Errorf("client events\ninproc:\n  %s\nwant:\n  %s", strings.Join(in[0], "\n  "), strings.Join(tc.wantClient, "\n  "))
				}
			case !slices.Equal(rankOrder(in[0]), rankOrder(net[0])):
				t.Errorf("client events\ninproc:\n  %s\nloopback:\n  %s", strings.Join(in[0], "\n  "), strings.Join(net[0], "\n  "))
			}
			if !slices.Equal(in[1], net[1]) {
				t.Errorf("server events\ninproc:\n  %s\nloopback:\n  %s", strings.Join(in[1], "\n  "), strings.Join(net[1], "\n  "))
			}
			if testing.Verbose() {
				t.Logf("inproc client:\n  %s\ninproc server:\n  %s", strings.Join(in[0], "\n  "), strings.Join(in[1], "\n  "))
			}
		})
	}
}
