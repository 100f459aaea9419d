package inproc

import (
	"context"
	"fmt"
	"maps"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Network is what Addr.Network returns.
const Network = "inproc"

// Addr is the address of both ends of an in-process call: the peer a handler
// finds with peer.FromContext has Addr and LocalAddr of this type, so code
// that logs or checks its peer can tell an in-process caller apart.
type Addr string

// Network returns "inproc".
func (Addr) Network() string { return Network }

func (a Addr) String() string { return string(a) }

// defaultStreamBuffer is how many messages each direction of a stream holds
// before SendMsg blocks. A few messages are enough to keep both sides busy;
// more would only hide a slow reader, which over a network the HTTP/2 flow
// control window exposes.
const defaultStreamBuffer = 16

// Option configures a Server.
type Option func(*options)

type options struct {
	serverStats  []stats.Handler
	clientStats  []stats.Handler
	unaryInts    []grpc.UnaryServerInterceptor
	streamInts   []grpc.StreamServerInterceptor
	streamBuffer int
}

// WithServerStatsHandler adds a stats handler that sees every call as a
// grpc.Server with grpc.StatsHandler(h) would, for example
// otelgrpc.NewServerHandler(). Handlers run in the order given.
func WithServerStatsHandler(h stats.Handler) Option {
	return func(o *options) { o.serverStats = append(o.serverStats, h) }
}

// WithClientStatsHandler adds a stats handler that sees every call as a
// grpc.ClientConn with grpc.WithStatsHandler(h) would, for example
// otelgrpc.NewClientHandler(). Handlers run in the order given.
func WithClientStatsHandler(h stats.Handler) Option {
	return func(o *options) { o.clientStats = append(o.clientStats, h) }
}

// WithUnaryInterceptor adds a unary server interceptor. Interceptors are
// chained in the order given, the first outermost, as with
// grpc.ChainUnaryInterceptor.
func WithUnaryInterceptor(i grpc.UnaryServerInterceptor) Option {
	return func(o *options) { o.unaryInts = append(o.unaryInts, i) }
}

// WithStreamInterceptor adds a stream server interceptor. Interceptors are
// chained in the order given, the first outermost, as with
// grpc.ChainStreamInterceptor. As in grpc, they do not run for unary
// methods, even when a unary method is called through NewStream.
func WithStreamInterceptor(i grpc.StreamServerInterceptor) Option {
	return func(o *options) { o.streamInts = append(o.streamInts, i) }
}

// WithStreamBuffer sets how many messages each direction of a stream holds
// before SendMsg blocks (default 16; at least 1).
func WithStreamBuffer(n int) Option {
	return func(o *options) { o.streamBuffer = max(n, 1) }
}

// Server holds in-process services. It implements grpc.ServiceRegistrar, so
// generated Register*Server functions work on it, and
// grpc.ClientConnInterface, so generated New*Client functions work on it.
// It is safe for concurrent use. It starts no goroutine of its own: a
// streaming call runs its handler on a goroutine that ends with the call.
type Server struct {
	serverStats  stats.Handler // nil when none
	clientStats  stats.Handler // nil when none
	unaryInt     grpc.UnaryServerInterceptor
	streamInt    grpc.StreamServerInterceptor
	streamBuffer int

	// peer is the one peer of every call, shared because nobody modifies a
	// peer.Peer they get from a context.
	peer *peer.Peer
	// connCtx gives handler contexts their values, as a grpc.Server derives
	// every stream's context from its connection's (tagged by TagConn).
	connCtx context.Context

	mu       sync.Mutex                          // serialises RegisterService
	services atomic.Pointer[map[string]*service] // copied on write, read without a lock
}

var (
	_ net.Addr                   = Addr("")
	_ grpc.ServiceRegistrar      = (*Server)(nil)
	_ grpc.ClientConnInterface   = (*Server)(nil)
	_ grpc.ServerTransportStream = (*serverCall)(nil)
)

type service struct {
	methods map[string]*method
}

// method is one registered method. Unary methods have both forms: unary for
// Invoke's direct path, stream (the unary wrapped as grpc.Server wraps it)
// for NewStream.
type method struct {
	impl   any
	unary  *grpc.MethodDesc // nil for a streaming method
	stream grpc.StreamDesc
}

// NewServer returns a Server with no services. The in-process "connection"
// opens here: the stats handlers' TagConn and HandleConn(ConnBegin) run
// once, and never see a ConnEnd, because the connection lasts as long as the
// Server.
func NewServer(opts ...Option) *Server {
	o := options{streamBuffer: defaultStreamBuffer}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{
		serverStats:  combine(o.serverStats),
		clientStats:  combine(o.clientStats),
		unaryInt:     chainUnary(o.unaryInts),
		streamInt:    chainStream(o.streamInts),
		streamBuffer: o.streamBuffer,
		peer:         &peer.Peer{Addr: Addr("inproc"), LocalAddr: Addr("inproc")},
	}
	connCtx := context.Background()
	if sh := s.serverStats; sh != nil {
		connCtx = sh.TagConn(connCtx, &stats.ConnTagInfo{RemoteAddr: s.peer.Addr, LocalAddr: s.peer.LocalAddr})
		sh.HandleConn(connCtx, &stats.ConnBegin{})
	}
	// WithoutCancel: handler contexts take their cancellation from the
	// caller alone, whatever TagConn returned.
	s.connCtx = context.WithoutCancel(connCtx)
	if ch := s.clientStats; ch != nil {
		ctx := ch.TagConn(context.Background(), &stats.ConnTagInfo{RemoteAddr: s.peer.Addr, LocalAddr: s.peer.LocalAddr})
		ch.HandleConn(ctx, &stats.ConnBegin{Client: true})
	}
	s.services.Store(&map[string]*service{})
	return s
}

// RegisterService registers a service and its implementation, as
// grpc.Server.RegisterService does, and panics where grpc would stop the
// process: on a duplicate service name or an implementation that does not
// satisfy desc.HandlerType. Unlike grpc it may be called after calls have
// started; a call sees the services registered before it began.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	if impl != nil && desc.HandlerType != nil {
		want := reflect.TypeOf(desc.HandlerType).Elem()
		if got := reflect.TypeOf(impl); !got.Implements(want) {
			panic(fmt.Sprintf("inproc: RegisterService: handler of type %v does not satisfy %v", got, want))
		}
	}
	svc := &service{methods: make(map[string]*method, len(desc.Methods)+len(desc.Streams))}
	for i := range desc.Streams {
		d := desc.Streams[i]
		svc.methods[d.StreamName] = &method{impl: impl, stream: d}
	}
	for i := range desc.Methods {
		d := &desc.Methods[i]
		svc.methods[d.MethodName] = &method{
			impl:  impl,
			unary: d,
			stream: grpc.StreamDesc{
				StreamName: d.MethodName,
				Handler:    s.unaryAsStream(d),
			},
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.services.Load()
	if _, dup := old[desc.ServiceName]; dup {
		panic(fmt.Sprintf("inproc: RegisterService: duplicate service registration for %q", desc.ServiceName))
	}
	next := maps.Clone(old)
	next[desc.ServiceName] = svc
	s.services.Store(&next)
}

// unaryAsStream is a unary method as a stream handler, the way grpc.Server
// runs every unary method; NewStream and the stream path of Invoke use it.
func (s *Server) unaryAsStream(d *grpc.MethodDesc) grpc.StreamHandler {
	return func(srv any, stream grpc.ServerStream) error {
		reply, err := d.Handler(srv, stream.Context(), stream.RecvMsg, s.unaryInt)
		if err != nil {
			return err
		}
		return stream.SendMsg(reply)
	}
}

// lookup finds a method by its full name, "/package.Service/Method", and
// otherwise gives the status a grpc.Server answers.
func (s *Server) lookup(fullMethod string) (*method, *status.Status) {
	sm, ok := strings.CutPrefix(fullMethod, "/")
	pos := strings.LastIndex(sm, "/")
	if !ok || pos < 0 {
		return nil, status.Newf(codes.Unimplemented, "malformed method name: %q", fullMethod)
	}
	svcName, name := sm[:pos], sm[pos+1:]
	svc := (*s.services.Load())[svcName]
	if svc == nil {
		return nil, status.Newf(codes.Unimplemented, "unknown service %v", svcName)
	}
	m := svc.methods[name]
	if m == nil {
		return nil, status.Newf(codes.Unimplemented, "unknown method %v for service %v", name, svcName)
	}
	return m, nil
}

// chainUnary makes one interceptor of several, the first outermost.
func chainUnary(ints []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return ints[0](ctx, req, info, unaryStep(ints[1:], info, handler))
	}
}

func unaryStep(rest []grpc.UnaryServerInterceptor, info *grpc.UnaryServerInfo, final grpc.UnaryHandler) grpc.UnaryHandler {
	if len(rest) == 0 {
		return final
	}
	return func(ctx context.Context, req any) (any, error) {
		return rest[0](ctx, req, info, unaryStep(rest[1:], info, final))
	}
}

// chainStream makes one interceptor of several, the first outermost.
func chainStream(ints []grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	switch len(ints) {
	case 0:
		return nil
	case 1:
		return ints[0]
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return ints[0](srv, ss, info, streamStep(ints[1:], info, handler))
	}
}

func streamStep(rest []grpc.StreamServerInterceptor, info *grpc.StreamServerInfo, final grpc.StreamHandler) grpc.StreamHandler {
	if len(rest) == 0 {
		return final
	}
	return func(srv any, ss grpc.ServerStream) error {
		return rest[0](srv, ss, info, streamStep(rest[1:], info, final))
	}
}
