package inproc

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deployment is one way to reach the test services. Most tests run on both:
// in-process, and through a real grpc.Server on a loopback listener, so that
// the in-process connection is held to what grpc itself does.
type deployment struct {
	name string
	conn grpc.ClientConnInterface
}

// setup is what both deployments are built from.
type setup struct {
	register    func(grpc.ServiceRegistrar)
	serverStats []stats.Handler
	clientStats []stats.Handler
	unaryInts   []grpc.UnaryServerInterceptor
	streamInts  []grpc.StreamServerInterceptor
}

func bothDeployments(t testing.TB, cfg setup) []deployment {
	t.Helper()
	return []deployment{
		{name: "inproc", conn: newInproc(t, cfg)},
		{name: "loopback", conn: newLoopback(t, cfg)},
	}
}

func newInproc(t testing.TB, cfg setup) *Server {
	t.Helper()
	var opts []Option
	for _, h := range cfg.serverStats {
		opts = append(opts, WithServerStatsHandler(h))
	}
	for _, h := range cfg.clientStats {
		opts = append(opts, WithClientStatsHandler(h))
	}
	for _, i := range cfg.unaryInts {
		opts = append(opts, WithUnaryInterceptor(i))
	}
	for _, i := range cfg.streamInts {
		opts = append(opts, WithStreamInterceptor(i))
	}
	s := NewServer(opts...)
	if cfg.register != nil {
		cfg.register(s)
	}
	return s
}

// newLoopback serves cfg with a real grpc.Server on 127.0.0.1:0 and returns a
// client connection to it; both close when the test ends.
func newLoopback(t testing.TB, cfg setup) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	sopts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(cfg.unaryInts...),
		grpc.ChainStreamInterceptor(cfg.streamInts...),
	}
	for _, h := range cfg.serverStats {
		sopts = append(sopts, grpc.StatsHandler(h))
	}
	srv := grpc.NewServer(sopts...)
	if cfg.register != nil {
		cfg.register(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	copts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	for _, h := range cfg.clientStats {
		copts = append(copts, grpc.WithStatsHandler(h))
	}
	cc, err := grpc.NewClient(lis.Addr().String(), copts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	})
	return cc
}

// fakeHealth is a grpc_health_v1.HealthServer whose methods the test
// supplies, for precise control of results, errors and metadata.
type fakeHealth struct {
	healthpb.UnimplementedHealthServer
	check func(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
	watch func(*healthpb.HealthCheckRequest, grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error
}

func (f *fakeHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if f.check == nil {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return f.check(ctx, req)
}

func (f *fakeHealth) Watch(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if f.watch == nil {
		return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	}
	return f.watch(req, ss)
}

func registerHealth(h healthpb.HealthServer) func(grpc.ServiceRegistrar) {
	return func(r grpc.ServiceRegistrar) { healthpb.RegisterHealthServer(r, h) }
}

// The echo service covers what health does not: client streaming (Collect
// concatenates what it receives) and bidirectional streaming (Chat echoes
// every message). Its descriptor is written by hand as generated code would
// be.
const (
	echoCollect = "/inproc.test.Echo/Collect"
	echoChat    = "/inproc.test.Echo/Chat"
)

type echoServer struct{}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "inproc.test.Echo",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "Collect", ClientStreams: true, Handler: collectHandler},
		{StreamName: "Chat", ClientStreams: true, ServerStreams: true, Handler: chatHandler},
	},
}

func collectHandler(_ any, ss grpc.ServerStream) error {
	var all string
	for {
		in := new(wrapperspb.StringValue)
		err := ss.RecvMsg(in)
		if err == io.EOF {
			return ss.SendMsg(wrapperspb.String(all))
		}
		if err != nil {
			return err
		}
		all += in.GetValue()
	}
}

func chatHandler(_ any, ss grpc.ServerStream) error {
	for {
		in := new(wrapperspb.StringValue)
		err := ss.RecvMsg(in)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.SendMsg(wrapperspb.String(in.GetValue())); err != nil {
			return err
		}
	}
}

func registerEcho(r grpc.ServiceRegistrar) { r.RegisterService(&echoDesc, echoServer{}) }

func registerAll(h healthpb.HealthServer) func(grpc.ServiceRegistrar) {
	return func(r grpc.ServiceRegistrar) {
		registerHealth(h)(r)
		registerEcho(r)
	}
}

var (
	collectDesc = &echoDesc.Streams[0]
	chatDesc    = &echoDesc.Streams[1]
)
