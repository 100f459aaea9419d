package inproc

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// errHeaderSent is grpc-go's answer to SendHeader after the header went out.
var errHeaderSent = status.Error(codes.Internal, "transport: SendHeader called multiple times")

// errCallEnded answers SetHeader and SetTrailer after the call ended.
var errCallEnded = status.Error(codes.Internal, "transport: the stream is done")

// serverCall is the server half of one call: the handler's context and what
// a grpc.Server keeps in its transport stream (header, trailer). It is the
// grpc.ServerTransportStream in the handler's context, so grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer and grpc.Method work in handlers and
// interceptors.
type serverCall struct {
	root   callContext // embedded to save an allocation per call
	method string
	sh     stats.Handler
	// statsCtx is the context the server stats handlers see: tagged by
	// TagRPC, without the transport stream, as in grpc.
	statsCtx context.Context
	// ctx is the handler's context.
	ctx context.Context

	// The caller's request and the interceptors, for the unary path only.
	req      any
	reqSize  int
	unaryInt grpc.UnaryServerInterceptor // the Server's chain

	// headerReady, for streams only, is closed when the header is sent or
	// the call ends, whichever is first.
	headerReady chan struct{}

	mu         sync.Mutex
	header     metadata.MD
	trailer    metadata.MD
	headerSent bool // the header went out (never, for a trailers-only response)
	ended      bool
}

// newServerCall builds the server half of a call on the caller's (client
// tagged) context: incoming metadata, peer, server stats tag and InHeader,
// transport stream, in grpc.Server's order.
func (s *Server) newServerCall(cctx context.Context, method string, md metadata.MD, stream bool) *serverCall {
	c := &serverCall{method: method, sh: s.serverStats, unaryInt: s.unaryInt}
	if stream {
		c.headerReady = make(chan struct{})
	}
	c.root.caller = cctx
	c.root.values = s.connCtx
	ctx := peer.NewContext(&c.root, s.peer)
	ctx = metadata.NewIncomingContext(ctx, md)
	if sh := c.sh; sh != nil {
		ctx = sh.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: method})
		sh.HandleRPC(ctx, &stats.InHeader{
			FullMethod: method,
			RemoteAddr: s.peer.Addr,
			LocalAddr:  s.peer.LocalAddr,
			Header:     copyMD(md), // the handler's own must not change under it
		})
	}
	c.statsCtx = ctx
	c.ctx = grpc.NewContextWithServerTransportStream(ctx, c)
	return c
}

func (c *serverCall) Method() string { return c.method }

func (c *serverCall) SetHeader(md metadata.MD) error {
	if md.Len() == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.headerSent || c.ended {
		return errHeaderSent
	}
	c.header = metadata.Join(c.header, md)
	return nil
}

func (c *serverCall) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	if c.headerSent || c.ended {
		c.mu.Unlock()
		return errHeaderSent
	}
	if md.Len() > 0 {
		c.header = metadata.Join(c.header, md)
	}
	c.sendHeaderLocked()
	c.mu.Unlock()
	c.statsOutHeader()
	return nil
}

func (c *serverCall) SetTrailer(md metadata.MD) error {
	if md.Len() == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return errCallEnded
	}
	c.trailer = metadata.Join(c.trailer, md)
	return nil
}

// sendHeaderLocked marks the header sent; the caller reports it to the
// stats handler once the lock is released.
func (c *serverCall) sendHeaderLocked() {
	c.headerSent = true
	if c.headerReady != nil {
		close(c.headerReady)
	}
}

// ensureHeader sends the header before the first message, as grpc does. It
// fails once the call has ended: a message sent then would go nowhere.
func (c *serverCall) ensureHeader() error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return errCallEnded
	}
	if c.headerSent {
		c.mu.Unlock()
		return nil
	}
	c.sendHeaderLocked()
	c.mu.Unlock()
	c.statsOutHeader()
	return nil
}

func (c *serverCall) statsOutHeader() {
	if c.sh != nil {
		c.sh.HandleRPC(c.statsCtx, &stats.OutHeader{Header: copyMD(c.header)})
	}
}

// writeStatus ends the server half as grpc's WriteStatus does: a header
// set but not yet sent goes out first (otherwise the response is
// "trailers-only"), then the trailer; then the handler's context ends.
func (c *serverCall) writeStatus() {
	c.mu.Lock()
	sendHeader := !c.headerSent && c.header.Len() > 0
	if !c.headerSent && c.headerReady != nil {
		close(c.headerReady)
	}
	c.headerSent = c.headerSent || sendHeader
	c.ended = true
	trailer := c.trailer
	c.mu.Unlock()
	if sendHeader {
		c.statsOutHeader()
	}
	if c.sh != nil {
		c.sh.HandleRPC(c.statsCtx, &stats.OutTrailer{Trailer: copyMD(trailer)})
	}
	c.root.cancel(context.Canceled)
}

// sent is what the client can see: whether the header went out and what it
// held, and the trailer (final once the call has ended). SetHeader and
// SetTrailer replace these maps rather than modify them, so they may be
// read after the lock is released.
func (c *serverCall) sent() (header metadata.MD, headerSent bool, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.headerSent {
		header = c.header
	}
	return header, c.headerSent, c.trailer
}

// beginClient starts the client half of a call as a grpc.ClientConn does:
// the client stats handler tags the call on the caller's context and sees
// Begin and OutHeader, and the outgoing metadata, checked, becomes md, what
// the server receives.
func (s *Server) beginClient(ctx context.Context, method string, desc *grpc.StreamDesc, opts []grpc.CallOption) (cctx context.Context, begin time.Time, md metadata.MD, err error) {
	cctx = ctx
	ch := s.clientStats
	if ch != nil {
		ff := failFast(opts)
		begin = time.Now()
		cctx = ch.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: method, FailFast: ff})
		ch.HandleRPC(cctx, &stats.Begin{
			Client:         true,
			BeginTime:      begin,
			FailFast:       ff,
			IsClientStream: desc.ClientStreams,
			IsServerStream: desc.ServerStreams,
		})
	}
	md, err = outgoingMD(cctx)
	if err != nil {
		s.endClient(cctx, begin, nil, false, nil, err, opts)
		return cctx, begin, nil, err
	}
	if ch != nil {
		ch.HandleRPC(cctx, &stats.OutHeader{
			Client:     true,
			FullMethod: method,
			RemoteAddr: s.peer.Addr,
			LocalAddr:  s.peer.LocalAddr,
			Header:     copyMD(md), // the server's must not change under it
		})
	}
	return cctx, begin, md, nil
}

// endClient ends the client half of a call: the End event and the call
// options that report on the call.
func (s *Server) endClient(cctx context.Context, begin time.Time, header metadata.MD, headerSent bool, trailer metadata.MD, err error, opts []grpc.CallOption) {
	if ch := s.clientStats; ch != nil {
		ch.HandleRPC(cctx, &stats.End{Client: true, BeginTime: begin, EndTime: time.Now(), Trailer: trailer, Error: err})
	}
	finishCallOptions(opts, header, headerSent, trailer, s.peer, err)
}
