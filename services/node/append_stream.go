package node

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// AppendStream limits.
const (
	// appendStreamInflight bounds the appends of one call being applied at
	// once: past it the node stops reading the call, and HTTP/2 flow
	// control holds the caller.
	appendStreamInflight = 1024
	// appendStreamDrainGrace is how long a draining node goes on reading
	// a call after it told the caller to close it; the appends the caller
	// sent after that are not applied, and their outcome is unknown to it.
	appendStreamDrainGrace = 5 * time.Second
)

// AppendStream serves many appends on one call, each as Append would
// (the same engine call, metrics and error statuses), concurrently and
// answered in the order they complete.
func (s *streamService) AppendStream(call streamv1.StreamService_AppendStreamServer) error {
	ctx, cancelAll := context.WithCancel(call.Context())
	defer cancelAll()
	a := &appendStreamCall{
		call:     call,
		inflight: make(map[uint64]context.CancelFunc),
		slots:    make(chan struct{}, appendStreamInflight),
	}
	defer a.wg.Wait() // before cancelAll: the appends run to their end

	reqs := make(chan *streamv1.AppendStreamRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := call.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	draining := s.draining
	var grace <-chan time.Time
	for {
		select {
		case req := <-reqs:
			if err := a.start(ctx, s, req); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil // the caller closed its side; wg.Wait answers the rest
			}
			return err
		case <-draining:
			draining = nil
			if err := a.send(&streamv1.AppendStreamResponse{Draining: true}); err != nil {
				return err
			}
			grace = time.After(appendStreamDrainGrace)
		case <-grace:
			// ABORTED, not UNAVAILABLE: the caller learns that what it is
			// still waiting for was never started.
			return status.Error(codes.Aborted, "node: shutting down; the appends sent after it said so were not applied")
		}
	}
}

// appendStreamCall is the state of one AppendStream call.
type appendStreamCall struct {
	call   streamv1.StreamService_AppendStreamServer
	sendMu sync.Mutex // gRPC allows one sender at a time
	wg     sync.WaitGroup
	slots  chan struct{}

	mu       sync.Mutex
	inflight map[uint64]context.CancelFunc
}

// start runs one request: an append in its own goroutine, or a cancel.
// It returns an error that ends the call for a request that breaks the
// call's rules.
func (a *appendStreamCall) start(ctx context.Context, s *streamService, req *streamv1.AppendStreamRequest) error {
	id := req.GetId()
	if req.GetCancel() {
		a.mu.Lock()
		cancel := a.inflight[id]
		a.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return nil
	}
	if id == 0 || req.GetAppend() == nil {
		return status.Error(codes.InvalidArgument, "node: an AppendStream request needs a non-zero id and an append")
	}
	select {
	case a.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	actx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	_, dup := a.inflight[id]
	if !dup {
		a.inflight[id] = cancel
	}
	a.mu.Unlock()
	if dup {
		cancel()
		<-a.slots
		return status.Errorf(codes.InvalidArgument, "node: AppendStream id %d is already in flight on this call", id)
	}
	a.wg.Go(func() {
		resp, err := s.Append(actx, req.GetAppend())
		a.mu.Lock()
		delete(a.inflight, id)
		a.mu.Unlock()
		cancel()
		<-a.slots
		out := &streamv1.AppendStreamResponse{Id: id}
		if err != nil {
			out.Error, _ = proto.Marshal(status.Convert(err).Proto())
		} else {
			out.Append = resp
		}
		// A failed send means the call is over; the receiving loop sees it.
		_ = a.send(out)
	})
	return nil
}

func (a *appendStreamCall) send(m *streamv1.AppendStreamResponse) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.call.Send(m)
}
