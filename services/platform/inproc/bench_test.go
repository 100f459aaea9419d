package inproc

import (
	"context"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
)

// servingResp is shared by every benchmark call: the handler returns it and
// never modifies it, which is all the no-copy contract asks.
var servingResp = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

func benchHealth() *fakeHealth {
	return &fakeHealth{
		check: func(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			return servingResp, nil
		},
		watch: func(_ *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			for range streamMessages {
				if err := ss.Send(servingResp); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// streamMessages is how many messages a benchmarked Watch sends.
const streamMessages = 16

type benchCase struct {
	name string
	conn func(testing.TB, setup) grpc.ClientConnInterface
	otel bool
}

var benchCases = []benchCase{
	{name: "inproc", conn: func(t testing.TB, c setup) grpc.ClientConnInterface { return newInproc(t, c) }},
	{name: "loopback", conn: func(t testing.TB, c setup) grpc.ClientConnInterface { return newLoopback(t, c) }},
	{name: "inproc+otelgrpc", conn: func(t testing.TB, c setup) grpc.ClientConnInterface { return newInproc(t, c) }, otel: true},
	{name: "loopback+otelgrpc", conn: func(t testing.TB, c setup) grpc.ClientConnInterface { return newLoopback(t, c) }, otel: true},
}

func (bc benchCase) client(b *testing.B) healthpb.HealthClient {
	cfg := setup{register: registerHealth(benchHealth())}
	if bc.otel {
		// Spans are made and sampled, then dropped: the cost of tracing
		// without the cost of an exporter.
		tp := sdktrace.NewTracerProvider()
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		opts := []otelgrpc.Option{otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{})}
		cfg.serverStats = []stats.Handler{otelgrpc.NewServerHandler(opts...)}
		cfg.clientStats = []stats.Handler{otelgrpc.NewClientHandler(opts...)}
	}
	return healthpb.NewHealthClient(bc.conn(b, cfg))
}

// BenchmarkUnary compares a unary call in-process with the same call over
// loopback TCP through a real grpc.Server, bare and with otelgrpc on both
// sides.
func BenchmarkUnary(b *testing.B) {
	for _, bc := range benchCases {
		b.Run(bc.name, func(b *testing.B) {
			client := bc.client(b)
			req := &healthpb.HealthCheckRequest{Service: "bench"}
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkServerStream compares a server-streaming call of 16 messages.
func BenchmarkServerStream(b *testing.B) {
	for _, bc := range benchCases {
		b.Run(bc.name, func(b *testing.B) {
			client := bc.client(b)
			req := &healthpb.HealthCheckRequest{Service: "bench"}
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				stream, err := client.Watch(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for {
					if _, err := stream.Recv(); err != nil {
						break
					}
					n++
				}
				if n != streamMessages {
					b.Fatalf("received %d messages, want %d", n, streamMessages)
				}
			}
		})
	}
}

// TestUnaryAllocations holds a unary call to a few small allocations beyond
// the generated code's own (the call option slice, the reply, the request
// the generated handler allocates and ignores, the interceptor info and
// handler closure): the server call, three context values and the
// interceptor stand-in.
func TestUnaryAllocations(t *testing.T) {
	s := newInproc(t, setup{register: registerHealth(benchHealth())})
	client := healthpb.NewHealthClient(s)
	req := &healthpb.HealthCheckRequest{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := client.Check(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	const generated, ours = 5, 5
	if allocs > generated+ours {
		t.Errorf("a unary call allocates %v objects, want at most %d", allocs, generated+ours)
	}
	t.Logf("%v allocations per call", allocs)
}
