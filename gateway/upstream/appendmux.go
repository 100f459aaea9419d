package upstream

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// unimplementedRetry is how long a node that does not know AppendStream
// (an older release, during a rolling upgrade) gets unary appends before
// the mux asks it again.
const unimplementedRetry = time.Minute

// appendMux carries a node's appends on AppendStream calls, one open at a
// time: an append is a message each way on a call already open instead of
// a call of its own, which halves the gateway's gRPC cost per append and
// spares the node a call's setup (docs/scaling.md). Each append still
// gets what a unary Append would have answered: its response or its
// status, NOT_LEADER hints included, so routing and retries (route.go)
// are unchanged.
//
// Whatever proves an append was not sent (the call could not be opened,
// Send failed, the node does not implement AppendStream) sends it as a
// unary Append instead. An append sent on a call that then breaks fails
// UNAVAILABLE without a "not sent" cause: it may have been applied.
type appendMux struct {
	client streamv1.StreamServiceClient
	addr   string

	mu       sync.Mutex
	cur      *appendCall
	unaryTil time.Time // the node answered UNIMPLEMENTED: unary until then
	now      func() time.Time
}

func newAppendMux(client streamv1.StreamServiceClient, addr string) *appendMux {
	return &appendMux{client: client, addr: addr, now: time.Now}
}

// appendResult is a call's answer to one append; unsent says the node
// never saw it (the caller sends it as a unary Append).
type appendResult struct {
	resp   *streamv1.AppendResponse
	err    error
	unsent bool
}

// appendCall is one open AppendStream call.
type appendCall struct {
	m      *appendMux
	stream streamv1.StreamService_AppendStreamClient
	cancel context.CancelFunc
	sendMu sync.Mutex // gRPC allows one sender at a time

	mu      sync.Mutex
	pending map[uint64]chan appendResult
	nextID  uint64
	closed  bool // no more sends: broken, draining or closed
}

// Append sends in on the open call (opening one if needed) and waits for
// its answer.
func (m *appendMux) Append(ctx context.Context, in *streamv1.AppendRequest, opts ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	c := m.call()
	if c == nil {
		return m.client.Append(ctx, in, opts...)
	}
	id, ch, ok := c.register()
	if !ok {
		return m.client.Append(ctx, in, opts...)
	}
	c.sendMu.Lock()
	err := c.stream.Send(&streamv1.AppendStreamRequest{Id: id, Append: in})
	c.sendMu.Unlock()
	if err != nil {
		// Send failed: the message did not leave, and the call is over
		// (its receiving loop reports why to the appends already sent).
		c.forget(id)
		c.shut()
		return m.client.Append(ctx, in, opts...)
	}
	select {
	case res := <-ch:
		if res.unsent {
			return m.client.Append(ctx, in, opts...)
		}
		return res.resp, res.err
	case <-ctx.Done():
		if c.forget(id) {
			c.sendMu.Lock()
			_ = c.stream.Send(&streamv1.AppendStreamRequest{Id: id, Cancel: true})
			c.sendMu.Unlock()
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// call returns the open call, opening one; nil means unary for now.
func (m *appendMux) call() *appendCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur != nil {
		return m.cur
	}
	if m.now().Before(m.unaryTil) {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := m.client.AppendStream(ctx)
	if err != nil {
		cancel()
		return nil // the unary call reports the node's state itself
	}
	c := &appendCall{m: m, stream: stream, cancel: cancel, pending: make(map[uint64]chan appendResult)}
	m.cur = c
	go c.receive()
	return c
}

// detach makes c no longer the open call.
func (m *appendMux) detach(c *appendCall) {
	m.mu.Lock()
	if m.cur == c {
		m.cur = nil
	}
	m.mu.Unlock()
}

// close ends the open call (Router.Close closes the connection under it).
func (m *appendMux) close() {
	m.mu.Lock()
	c := m.cur
	m.cur = nil
	m.mu.Unlock()
	if c != nil {
		c.shut()
	}
}

func (c *appendCall) register() (uint64, chan appendResult, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, false
	}
	c.nextID++
	ch := make(chan appendResult, 1)
	c.pending[c.nextID] = ch
	return c.nextID, ch, true
}

// forget drops an append nobody waits for any more; it reports whether it
// was still unanswered.
func (c *appendCall) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

// stopSending makes c no longer the open call and refuses new appends on
// it; the answers to those already sent still come.
func (c *appendCall) stopSending() {
	c.m.detach(c)
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// shut stops new sends on the call; its receiving loop ends it.
func (c *appendCall) shut() {
	c.stopSending()
	c.cancel()
}

// receive delivers answers until the call ends, then fails what is left.
func (c *appendCall) receive() {
	for {
		msg, err := c.stream.Recv()
		if err != nil {
			c.end(err)
			return
		}
		if msg.GetDraining() {
			// Answers to what was sent still come; the node ends the call
			// when this side is closed.
			c.stopSending()
			c.sendMu.Lock()
			_ = c.stream.CloseSend()
			c.sendMu.Unlock()
			continue
		}
		c.mu.Lock()
		ch := c.pending[msg.GetId()]
		delete(c.pending, msg.GetId())
		c.mu.Unlock()
		if ch == nil {
			continue // given up on (cancel), or an id this side never sent
		}
		res := appendResult{resp: msg.GetAppend()}
		if b := msg.GetError(); len(b) > 0 {
			st := &spb.Status{}
			if uerr := proto.Unmarshal(b, st); uerr != nil || st.GetCode() == int32(codes.OK) {
				res = appendResult{err: status.Errorf(codes.Internal, "upstream: node %s sent an append error that does not decode", c.m.addr)}
			} else {
				res = appendResult{err: status.ErrorProto(st)}
			}
		} else if res.resp == nil {
			res = appendResult{err: status.Errorf(codes.Internal, "upstream: node %s answered an append with neither a response nor an error", c.m.addr)}
		}
		ch <- res
	}
}

// end fails the appends still waiting when the call ended with err.
func (c *appendCall) end(err error) {
	c.shut()
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		// An older node, or a caller it refuses: unary calls answer for
		// themselves for a while.
		c.m.mu.Lock()
		c.m.unaryTil = c.m.now().Add(unimplementedRetry)
		c.m.mu.Unlock()
	}
	unsent := refusedUnstarted(err)
	for _, ch := range pending {
		if unsent {
			ch <- appendResult{unsent: true}
			continue
		}
		ch <- appendResult{err: status.Errorf(codes.Unavailable,
			"upstream: the append call to node %s ended (%s) before its answer; the append may have been applied", c.m.addr, status.Code(err))}
	}
}

// refusedUnstarted reports an end of call that the node's handler (or the
// interceptors before it) returned: the handler answers every append it
// started before it returns, so the appends still waiting were never
// started. A broken connection or a cancelled call (UNAVAILABLE, CANCELED,
// INTERNAL, UNKNOWN) proves nothing.
func refusedUnstarted(err error) bool {
	if errors.Is(err, io.EOF) {
		return true // the handler returned OK
	}
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument,
		codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}
