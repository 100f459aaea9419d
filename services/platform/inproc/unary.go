package inproc

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Invoke makes a unary call. A unary method runs on the caller's goroutine
// and receives args itself, not a copy; its response is shallow-copied into
// reply. The caller must not modify args after the call (the handler may
// have kept it) and the handler must not modify its response after
// returning it. The call waits for the handler even when ctx ends first;
// handlers are expected to honour their context.
func (s *Server) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m, lookupErr := s.lookup(method)
	if m != nil && m.unary == nil {
		return s.invokeStream(ctx, method, args, reply, opts)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	cctx, cbegin, md, err := s.beginClient(ctx, method, &unaryStreamDesc, opts)
	if err != nil {
		return err
	}
	ch := s.clientStats
	reqSize := 0
	if ch != nil || s.serverStats != nil {
		reqSize = sizeOf(args)
	}
	if ch != nil {
		ch.HandleRPC(cctx, outPayload(true, args, reqSize))
	}

	c := s.newServerCall(cctx, method, md, false)
	var st *status.Status
	var deliverErr error
	respSize := 0
	if lookupErr != nil {
		// grpc.Server answers without Begin or End.
		st = lookupErr
		c.writeStatus()
	} else {
		st, respSize, deliverErr = c.runUnary(m, args, reqSize, reply, ch != nil)
	}
	header, headerSent, trailer := c.sent()

	// The client half receives the response.
	var clientErr error
	ctxErr := ctx.Err()
	switch {
	case ctxErr != nil:
		// The caller gave up before the response arrived.
		clientErr = status.FromContextError(ctxErr).Err()
	case st != nil && st.Code() == codes.OK:
		// A handler error that is a status with code OK: grpc sends OK and
		// no message, which its client rejects.
		clientErr = status.Error(codes.Internal, "cardinality violation: received no response message from non-server-streaming RPC")
	case st != nil:
		clientErr = st.Err()
	default:
		clientErr = deliverErr
	}
	if ch != nil && ctxErr == nil {
		if headerSent {
			ch.HandleRPC(cctx, &stats.InHeader{Client: true, Header: copyMD(header)})
		}
		if clientErr == nil {
			ch.HandleRPC(cctx, inPayload(true, reply, respSize))
		}
		ch.HandleRPC(cctx, &stats.InTrailer{Client: true, Trailer: copyMD(trailer)})
	}
	s.endClient(cctx, cbegin, header, headerSent, trailer, clientErr, opts)
	return clientErr
}

// runUnary runs the server half of a unary call as grpc.Server does, and
// delivers the response into reply. st is the handler's status (nil for
// success); deliverErr is the failure to deliver, which is the client's
// alone, as a message that does not decode is over a network; respSize is
// the response's size if stats handlers want it.
func (c *serverCall) runUnary(m *method, args any, reqSize int, reply any, clientStats bool) (st *status.Status, respSize int, deliverErr error) {
	sh := c.sh
	var begin time.Time
	if sh != nil {
		begin = time.Now()
		sh.HandleRPC(c.statsCtx, &stats.Begin{BeginTime: begin})
	}
	c.req, c.reqSize = args, reqSize
	dec := noDecode
	if sh != nil {
		dec = c.decode
	}
	resp, err := m.unary.Handler(m.impl, c.ctx, dec, c.intercept)
	if err == nil {
		deliverErr = shallowCopy(reply, resp)
		if clientStats || sh != nil {
			// Sized on the caller's copy, because sizing writes into the
			// message and the handler's response may be shared.
			respSize = sizeOf(reply)
			if deliverErr != nil {
				respSize = sizeOf(resp)
			}
		}
		_ = c.ensureHeader() // the call has not ended
		if sh != nil {
			sh.HandleRPC(c.statsCtx, outPayload(false, resp, respSize))
		}
	}
	st = statusOf(err)
	c.writeStatus()
	if sh != nil {
		sh.HandleRPC(c.statsCtx, &stats.End{BeginTime: begin, EndTime: time.Now(), Error: errOf(st)})
	}
	return st, respSize, deliverErr
}

// decode is the dec the generated unary handler calls to fill its request:
// the request is the caller's object itself (see intercept), so decoding is
// only the server's InPayload event, where grpc reports it.
func (c *serverCall) decode(any) error {
	c.sh.HandleRPC(c.statsCtx, inPayload(false, c.req, c.reqSize))
	return nil
}

func noDecode(any) error { return nil }

// intercept stands in for the interceptor argument of a generated unary
// handler: it drops the empty request the generated code allocated and
// hands the caller's request to the configured interceptors and the method.
func (c *serverCall) intercept(ctx context.Context, _ any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if c.unaryInt != nil {
		return c.unaryInt(ctx, c.req, info, handler)
	}
	return handler(ctx, c.req)
}
