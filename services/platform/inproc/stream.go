package inproc

import (
	"context"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// unaryStreamDesc is how a unary call looks from the client side of a stream.
var unaryStreamDesc = grpc.StreamDesc{}

// message is one message in flight on a stream. The sender sizes it before
// handing it over: after the handoff the receiver reads the object, and
// sizing writes into it.
type message struct {
	m    any
	size int
}

// clientStream is a streaming call as its caller holds it. The handler runs
// on a goroutine of its own (serve) and the two talk through two bounded
// channels, which stand in for HTTP/2 flow control: a side that sends faster
// than the other receives blocks.
type clientStream struct {
	s      *Server
	desc   *grpc.StreamDesc // the caller's view of the method
	method string
	opts   []grpc.CallOption
	ctx    context.Context // the caller's, tagged by the client stats handler
	ch     stats.Handler
	begin  time.Time
	call   *serverCall

	toServer chan message // closed by the client when it stops sending
	toClient chan message
	// done is closed once the handler has returned and the server half has
	// ended; st is final from then on.
	done chan struct{}
	st   *status.Status

	// For the sending goroutine only; grpc allows one.
	sentLast bool
	// For the receiving goroutine only; grpc allows one.
	recvFirst bool

	mu              sync.Mutex
	headerReported  bool
	trailerReported bool
	finished        bool
	finishErr       error
	stopWatch       func() bool
}

// serverStream is a streaming call as its handler sees it.
type serverStream struct {
	cs        *clientStream
	call      *serverCall
	desc      *grpc.StreamDesc // the server's view of the method
	recvFirst bool
}

var (
	_ grpc.ClientStream = (*clientStream)(nil)
	_ grpc.ServerStream = (*serverStream)(nil)
)

// NewStream starts a streaming call. The handler runs on a goroutine that
// ends when it returns; as with grpc, the caller must cancel ctx or call
// RecvMsg until it returns an error, or that goroutine may wait forever.
// Messages pass as objects: the handler's RecvMsg shallow-copies the
// caller's message into its own, and the caller's RecvMsg the handler's, so
// neither side may modify a message after SendMsg. NewStream also accepts a
// unary method, which it runs as grpc.Server does, and an unknown one, whose
// Unimplemented status RecvMsg returns.
func (s *Server) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return s.newStream(ctx, desc, method, opts)
}

func (s *Server) newStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts []grpc.CallOption) (*clientStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	m, lookupErr := s.lookup(method)
	cctx, begin, md, err := s.beginClient(ctx, method, desc, opts)
	if err != nil {
		return nil, err
	}
	cs := &clientStream{
		s:        s,
		desc:     desc,
		method:   method,
		opts:     opts,
		ctx:      cctx,
		ch:       s.clientStats,
		begin:    begin,
		toServer: make(chan message, s.streamBuffer),
		toClient: make(chan message, s.streamBuffer),
		done:     make(chan struct{}),
	}
	cs.call = s.newServerCall(cs.ctx, method, md, true)
	// grpc ends the call when the caller's context ends, even if the
	// caller never calls RecvMsg again.
	cs.mu.Lock() // the watch may fire before AfterFunc returns
	cs.stopWatch = context.AfterFunc(cs.ctx, func() {
		cs.finish(status.FromContextError(cs.ctx.Err()).Err())
	})
	cs.mu.Unlock()
	go cs.serve(m, lookupErr)
	return cs, nil
}

// invokeStream is Invoke of a method registered as a stream: a unary call
// made through the stream machinery, as grpc's Invoke always is.
func (s *Server) invokeStream(ctx context.Context, method string, args, reply any, opts []grpc.CallOption) error {
	cs, err := s.newStream(ctx, &unaryStreamDesc, method, opts)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(args); err != nil {
		return err
	}
	return cs.RecvMsg(reply)
}

// serve runs the server half of a stream, as grpc.Server's processRPC
// does, on the goroutine the stream owns.
func (cs *clientStream) serve(m *method, lookupErr *status.Status) {
	c := cs.call
	if lookupErr != nil {
		// grpc.Server answers without Begin or End.
		cs.st = lookupErr
		c.writeStatus()
		close(cs.done)
		return
	}
	sh := c.sh
	var begin time.Time
	if sh != nil {
		begin = time.Now()
		sh.HandleRPC(c.statsCtx, &stats.Begin{
			BeginTime:      begin,
			IsClientStream: m.stream.ClientStreams,
			IsServerStream: m.stream.ServerStreams,
		})
	}
	ss := &serverStream{cs: cs, call: c, desc: &m.stream}
	var err error
	if si := cs.s.streamInt; si != nil && (m.stream.ClientStreams || m.stream.ServerStreams) {
		info := &grpc.StreamServerInfo{
			FullMethod:     cs.method,
			IsClientStream: m.stream.ClientStreams,
			IsServerStream: m.stream.ServerStreams,
		}
		err = si(m.impl, ss, info, m.stream.Handler)
	} else {
		err = m.stream.Handler(m.impl, ss)
	}
	cs.st = statusOf(err)
	c.writeStatus()
	if sh != nil {
		sh.HandleRPC(c.statsCtx, &stats.End{BeginTime: begin, EndTime: time.Now(), Error: errOf(cs.st)})
	}
	close(cs.done)
}

func (cs *clientStream) Context() context.Context { return cs.ctx }

// Header waits for the handler's header. Like grpc, it returns nil, nil
// when the call ended without one (the error comes from RecvMsg).
func (cs *clientStream) Header() (metadata.MD, error) {
	select {
	case <-cs.call.headerReady:
	case <-cs.ctx.Done():
		cs.finish(status.FromContextError(cs.ctx.Err()).Err())
		return nil, nil
	}
	if header, sent := cs.reportHeader(); sent {
		return copyMD(header), nil
	}
	// Trailers-only: the handler has returned and its status is a moment
	// away. grpc ends the call here.
	<-cs.done
	cs.reportTrailer()
	cs.finish(errOf(cs.st))
	return nil, nil
}

// Trailer is the handler's trailer once the call has ended, nil before.
func (cs *clientStream) Trailer() metadata.MD {
	select {
	case <-cs.done:
	default:
		return nil
	}
	_, _, trailer := cs.call.sent()
	return copyMD(trailer)
}

func (cs *clientStream) SendMsg(m any) error {
	if cs.sentLast {
		err := status.Error(codes.Internal, "SendMsg called after CloseSend")
		cs.finish(err)
		return err
	}
	if !cs.desc.ClientStreams {
		cs.sentLast = true
	}
	size := 0
	if cs.ch != nil || cs.call.sh != nil {
		size = sizeOf(m)
	}
	select {
	case cs.toServer <- message{m: m, size: size}:
	case <-cs.done:
		return cs.sendEnded()
	case <-cs.ctx.Done():
		return cs.sendEnded()
	}
	if !cs.desc.ClientStreams {
		close(cs.toServer)
	}
	if cs.ch != nil {
		cs.ch.HandleRPC(cs.ctx, outPayload(true, m, size))
	}
	return nil
}

// sendEnded is SendMsg's answer when the call has ended: io.EOF, the signal
// to get the status from RecvMsg, or nil where grpc's generated code wants
// it (a caller that sends only once).
func (cs *clientStream) sendEnded() error {
	if !cs.desc.ClientStreams {
		return nil
	}
	return io.EOF
}

func (cs *clientStream) CloseSend() error {
	if cs.sentLast {
		return nil
	}
	cs.sentLast = true
	close(cs.toServer)
	return nil
}

func (cs *clientStream) RecvMsg(m any) error {
	// After a failure on the client's side (its context, a message it
	// could not take) RecvMsg keeps failing the same way.
	cs.mu.Lock()
	finishErr := cs.finishErr
	cs.mu.Unlock()
	if finishErr != nil {
		return finishErr
	}
	err := cs.recvMsg(m)
	if err != nil {
		cs.finish(err)
	}
	return err
}

func (cs *clientStream) recvMsg(m any) error {
	msg, err := cs.recv()
	if err != nil {
		if err == io.EOF && !cs.desc.ServerStreams && !cs.recvFirst {
			return status.Error(codes.Internal, "cardinality violation: received no response message from non-server-streaming RPC")
		}
		return err
	}
	if err := shallowCopy(m, msg.m); err != nil {
		return err
	}
	cs.recvFirst = true
	if cs.ch != nil {
		cs.ch.HandleRPC(cs.ctx, inPayload(true, m, msg.size))
	}
	if cs.desc.ServerStreams {
		return nil
	}
	// A caller expecting one message gets the status with it, as grpc's
	// second read does.
	switch _, err := cs.recv(); err {
	case io.EOF:
		cs.finish(nil)
		return nil
	case nil:
		return status.Error(codes.Internal, "cardinality violation: expected <EOF> for non server-streaming RPCs, but received another message")
	default:
		return err
	}
}

// recv takes the next message, or io.EOF or the handler's status once the
// handler has returned and every message it sent has been taken.
func (cs *clientStream) recv() (message, error) {
	select {
	case msg := <-cs.toClient:
		cs.reportHeader()
		return msg, nil
	case <-cs.done:
		// Everything the handler sent was in the channel before done
		// closed; take it first.
		select {
		case msg := <-cs.toClient:
			cs.reportHeader()
			return msg, nil
		default:
		}
		// A handler that ended because the caller cancelled reports the
		// caller's cancellation, as over the network, whichever of the two
		// this select saw first.
		if err := cs.ctx.Err(); err != nil {
			return message{}, status.FromContextError(err).Err()
		}
		cs.reportHeader()
		cs.reportTrailer()
		if err := errOf(cs.st); err != nil {
			return message{}, err
		}
		return message{}, io.EOF
	case <-cs.ctx.Done():
		return message{}, status.FromContextError(cs.ctx.Err()).Err()
	}
}

// reportHeader gives the client stats handler the InHeader event once, when
// the client first sees that a header came, and returns the header.
func (cs *clientStream) reportHeader() (header metadata.MD, sent bool) {
	header, sent, _ = cs.call.sent()
	if !sent || cs.ch == nil {
		return header, sent
	}
	cs.mu.Lock()
	first := !cs.headerReported
	cs.headerReported = true
	cs.mu.Unlock()
	if first {
		cs.ch.HandleRPC(cs.ctx, &stats.InHeader{Client: true, Header: copyMD(header)})
	}
	return header, sent
}

// reportTrailer gives the client stats handler the InTrailer event once; the
// call has ended.
func (cs *clientStream) reportTrailer() {
	if cs.ch == nil {
		return
	}
	cs.mu.Lock()
	first := !cs.trailerReported
	cs.trailerReported = true
	cs.mu.Unlock()
	if first {
		_, _, trailer := cs.call.sent()
		cs.ch.HandleRPC(cs.ctx, &stats.InTrailer{Client: true, Trailer: copyMD(trailer)})
	}
}

// finish ends the client half once: it ends the handler's context (a no-op
// if the handler has returned), gives the client stats handler its End and
// fills the call options.
func (cs *clientStream) finish(err error) {
	if err == io.EOF {
		err = nil
	}
	cs.mu.Lock()
	if cs.finished {
		cs.mu.Unlock()
		return
	}
	cs.finished, cs.finishErr = true, err
	stop := cs.stopWatch
	cs.mu.Unlock()
	stop()
	cs.call.root.cancel(context.Canceled)
	header, headerSent, trailer := cs.call.sent()
	select {
	case <-cs.done:
	default:
		trailer = nil
	}
	cs.s.endClient(cs.ctx, cs.begin, header, headerSent, trailer, err, cs.opts)
}

func (ss *serverStream) Context() context.Context { return ss.call.ctx }

func (ss *serverStream) SetHeader(md metadata.MD) error { return ss.call.SetHeader(md) }

func (ss *serverStream) SendHeader(md metadata.MD) error { return ss.call.SendHeader(md) }

// SetTrailer drops md after the call ended, as grpc does (it only logs).
func (ss *serverStream) SetTrailer(md metadata.MD) { _ = ss.call.SetTrailer(md) }

// SendMsg blocks while the stream's buffer is full, and fails once the
// call has ended or its context has.
func (ss *serverStream) SendMsg(m any) error {
	c := ss.call
	size := 0
	if c.sh != nil || ss.cs.ch != nil {
		size = sizeOf(m)
	}
	if err := c.ensureHeader(); err != nil {
		return err
	}
	select {
	case ss.cs.toClient <- message{m: m, size: size}:
	case <-c.root.Done():
		return status.FromContextError(c.root.Err()).Err()
	}
	if c.sh != nil {
		c.sh.HandleRPC(c.statsCtx, outPayload(false, m, size))
	}
	return nil
}

func (ss *serverStream) RecvMsg(m any) error {
	msg, ok, err := ss.recv()
	if err != nil {
		return err
	}
	if !ok {
		if !ss.desc.ClientStreams && !ss.recvFirst {
			return status.Error(codes.Internal, "cardinality violation: received no request message from non-client-streaming RPC")
		}
		return io.EOF
	}
	if err := shallowCopy(m, msg.m); err != nil {
		return err
	}
	ss.recvFirst = true
	if sh := ss.call.sh; sh != nil {
		sh.HandleRPC(ss.call.statsCtx, inPayload(false, m, msg.size))
	}
	if ss.desc.ClientStreams {
		return nil
	}
	// A handler expecting one message checks that no second one follows,
	// as grpc's does.
	if _, ok, err := ss.recv(); err != nil {
		return err
	} else if ok {
		return status.Error(codes.Internal, "cardinality violation: received multiple request messages for non-client-streaming RPC")
	}
	return nil
}

// recv takes the next message from the client; ok is false once the client
// has stopped sending.
func (ss *serverStream) recv() (msg message, ok bool, err error) {
	select {
	case msg, ok = <-ss.cs.toServer:
		return msg, ok, nil
	case <-ss.call.root.Done():
		return message{}, false, status.FromContextError(ss.call.root.Err()).Err()
	}
}
