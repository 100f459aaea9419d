package inproc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// notifyEnd passes events on to a stats handler and then signals every End,
// so that a test can wait for a grpc.Server that ends its span after its
// client has returned.
type notifyEnd struct {
	stats.Handler
	ends chan<- struct{}
}

func (n notifyEnd) HandleRPC(ctx context.Context, s stats.RPCStats) {
	n.Handler.HandleRPC(ctx, s)
	if _, ok := s.(*stats.End); ok {
		n.ends <- struct{}{}
	}
}

// TestOpenTelemetrySpans makes the same calls through both deployments with
// otelgrpc's client and server handlers and requires the same spans: names,
// kinds, parents, span status and rpc.response.status_code. In-process, as
// over the network, the client span is a child of the caller's span and the
// server span a child of the client span, in the same trace.
func TestOpenTelemetrySpans(t *testing.T) {
	h := &fakeHealth{check: func(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		switch req.GetService() {
		case "missing":
			return nil, status.Error(codes.NotFound, "no such service")
		case "broken":
			return nil, errors.New("disk on fire")
		}
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}}
	const calls = 4
	summaries := map[string][]string{}
	for _, name := range []string{"inproc", "loopback"} {
		t.Run(name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			otelOpts := []otelgrpc.Option{
				otelgrpc.WithTracerProvider(tp),
				otelgrpc.WithPropagators(propagation.TraceContext{}),
			}
			ends := make(chan struct{}, calls)
			cfg := setup{
				register:    registerHealth(h),
				serverStats: []stats.Handler{notifyEnd{Handler: otelgrpc.NewServerHandler(otelOpts...), ends: ends}},
				clientStats: []stats.Handler{otelgrpc.NewClientHandler(otelOpts...)},
			}
			var conn grpc.ClientConnInterface
			if name == "inproc" {
				conn = newInproc(t, cfg)
			} else {
				conn = newLoopback(t, cfg)
			}
			client := healthpb.NewHealthClient(conn)

			ctx, caller := tp.Tracer("test").Start(t.Context(), "caller")
			for _, svc := range []string{"ok", "missing", "broken"} {
				_, _ = client.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			}
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			for err == nil {
				_, err = stream.Recv()
			}
			caller.End()
			timeout := time.After(10 * time.Second)
			for range calls {
				select {
				case <-ends:
				case <-timeout:
					t.Fatalf("server spans did not end")
				}
			}

			spans := exp.GetSpans()
			summaries[name] = summarize(t, spans)
			if testing.Verbose() {
				t.Logf("spans:\n  %s", strings.Join(summaries[name], "\n  "))
			}
		})
	}
	in, net := summaries["inproc"], summaries["loopback"]
	if len(in) != 1+2*calls {
		t.Errorf("inproc recorded %d spans, want %d:\n  %s", len(in), 1+2*calls, strings.Join(in, "\n  "))
	}
	if !slices.Equal(in, net) {
		t.Errorf("spans differ\ninproc:\n  %s\nloopback:\n  %s", strings.Join(in, "\n  "), strings.Join(net, "\n  "))
	}
	for _, want := range []string{
		"client grpc.health.v1.Health/Check parent=caller status=Unset code=OK",
		"server grpc.health.v1.Health/Check parent=grpc.health.v1.Health/Check status=Unset code=OK",
		"client grpc.health.v1.Health/Check parent=caller status=Error code=NOT_FOUND",
		"server grpc.health.v1.Health/Check parent=grpc.health.v1.Health/Check status=Unset code=NOT_FOUND",
		"client grpc.health.v1.Health/Check parent=caller status=Error code=UNKNOWN",
		"server grpc.health.v1.Health/Check parent=grpc.health.v1.Health/Check status=Error code=UNKNOWN",
		"client grpc.health.v1.Health/Watch parent=caller status=Unset code=OK",
		"server grpc.health.v1.Health/Watch parent=grpc.health.v1.Health/Watch status=Unset code=OK",
	} {
		if !slices.Contains(in, want) {
			t.Errorf("inproc has no span %q", want)
		}
	}
}

// summarize describes each span by what both deployments must agree on,
// sorted; it checks on the way that every parent is in the same trace and
// that a server span's parent is a client span.
func summarize(t testing.TB, spans tracetest.SpanStubs) []string {
	t.Helper()
	bySpanID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		bySpanID[s.SpanContext.SpanID().String()] = s
	}
	var out []string
	for _, s := range spans {
		parent := "-"
		if s.Parent.IsValid() {
			p, ok := bySpanID[s.Parent.SpanID().String()]
			if !ok {
				t.Errorf("span %s: parent %s not recorded", s.Name, s.Parent.SpanID())
			}
			if s.Parent.TraceID() != s.SpanContext.TraceID() || p.SpanContext.TraceID() != s.SpanContext.TraceID() {
				t.Errorf("span %s is not in its parent's trace", s.Name)
			}
			if s.SpanKind.String() == "server" && p.SpanKind.String() != "client" {
				t.Errorf("server span %s has a %s parent", s.Name, p.SpanKind)
			}
			parent = p.Name
		}
		code := "-"
		for _, a := range s.Attributes {
			if a.Key == "rpc.response.status_code" {
				code = a.Value.String()
			}
		}
		out = append(out, fmt.Sprintf("%s %s parent=%s status=%s code=%s", s.SpanKind, s.Name, parent, s.Status.Code, code))
	}
	slices.Sort(out)
	return out
}
