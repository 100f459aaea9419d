package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
)

// queued is one message waiting for its peer.
type queued struct {
	group uint32
	m     *pb.Message
	size  int // entry payload bytes, for the queue bound
}

// peer is the sending side towards one node: a bounded queue drained by one
// goroutine that owns one long-lived Stream RPC.
type peer struct {
	t      *Transport
	id     uint64
	addr   string
	logger *slog.Logger

	mu     sync.Mutex
	queue  []queued
	qbytes int
	notify chan struct{} // capacity 1: the queue went non-empty

	connMu  sync.Mutex
	conn    *grpc.ClientConn
	retired bool // removed or replaced: no new connection

	stop context.CancelFunc // ends run; set when started (under Transport.mu)

	connected atomic.Bool
	snaps     atomic.Int32 // snapshot sends in flight

	// refusedMu guards the refusal state of the peer towards this node.
	refusedMu sync.Mutex
	refused   bool   // the peer refuses this node; logged once until accepted
	refusal   string // why: "peer_cluster_mismatch" or "protocol_mismatch"
}

func newPeer(t *Transport, id uint64, addr string) *peer {
	return &peer{
		t:      t,
		id:     id,
		addr:   addr,
		logger: t.logger.With("peer_id", id, "address", addr),
		notify: make(chan struct{}, 1),
	}
}

func entryBytes(m *pb.Message) int {
	n := 0
	for _, e := range m.GetEntries() {
		n += len(e.GetData())
	}
	return n
}

// enqueue adds m to the queue; false when the queue is full.
func (p *peer) enqueue(group uint32, m *pb.Message) bool {
	size := entryBytes(m)
	p.mu.Lock()
	if len(p.queue) >= p.t.cfg.QueueMessages || (p.qbytes+size > p.t.cfg.QueueBytes && len(p.queue) > 0) {
		p.mu.Unlock()
		return false
	}
	p.queue = append(p.queue, queued{group: group, m: m, size: size})
	p.qbytes += size
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
	return true
}

// take removes and returns everything queued.
func (p *peer) take() []queued {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queue
	p.queue, p.qbytes = nil, 0
	return q
}

func (p *peer) queueLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// fail reports every (group, peer) pair of q unreachable once.
func (p *peer) fail(q []queued) {
	if len(q) == 0 {
		return
	}
	p.t.stats.dropped.Add(uint64(len(q)))
	seen := make(map[uint32]struct{}, len(q))
	for _, x := range q {
		if _, ok := seen[x.group]; ok {
			continue
		}
		seen[x.group] = struct{}{}
		p.t.reportUnreachable(x.group, p.id)
	}
}

// retire stops p's sender and closes its connection, for a removed or
// re-addressed peer; the caller holds Transport.mu.
func (p *peer) retire() {
	p.connMu.Lock()
	p.retired = true
	p.connMu.Unlock()
	if p.stop != nil {
		p.stop()
	}
	// Closing the connection ends the stream and any snapshot in flight;
	// the sender fails what is queued as it exits.
	p.closeConn()
	p.fail(p.take())
}

func (p *peer) closeConn() {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}

// run keeps one Stream to the peer open until ctx ends, reconnecting with
// capped exponential backoff. Messages queued while there is no stream are
// dropped and reported unreachable.
func (p *peer) run(ctx context.Context) {
	delay := p.t.cfg.BackoffMin
	downLogged := false // one warning per outage, not one per attempt
	for ctx.Err() == nil {
		up, err := p.session(ctx)
		p.connected.Store(false)
		p.fail(p.take())
		if ctx.Err() != nil {
			return
		}
		if up {
			delay = p.t.cfg.BackoffMin
			downLogged = false
		}
		wait := delay
		var ref *RefusalError
		switch {
		case errors.As(err, &ref):
			// Logged once by outboundError; retry at a slow rate.
			wait = p.t.cfg.RefusedRetry
		case up:
			p.logger.Warn("raft stream to peer broke", "err", err)
			downLogged = true
		case !downLogged:
			p.logger.Warn("cannot open raft stream to peer; retrying", "err", err)
			downLogged = true
		default:
			p.logger.Debug("cannot open raft stream to peer", "err", err)
		}
		// Jitter ±20% so that peers do not reconnect in lockstep.
		wait = time.Duration(float64(wait) * (0.8 + 0.4*rand.Float64()))
		if !p.idle(ctx, wait) {
			return
		}
		if !up {
			delay = min(delay*2, p.t.cfg.BackoffMax)
		}
	}
}

// idle waits d while failing whatever gets queued; false when ctx ended.
func (p *peer) idle(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tm.C:
			return true
		case <-p.notify:
			p.fail(p.take())
		}
	}
}

// session opens one Stream, waits for the peer's first ack, then sends
// everything queued as it arrives. It returns when the stream breaks or
// ctx ends; up reports whether the peer accepted the stream.
func (p *peer) session(ctx context.Context) (up bool, err error) {
	cc, err := p.t.conn(p)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	recvDone := make(chan struct{})
	defer func() {
		cancel()
		<-recvDone
	}()
	stream, err := raftv1.NewRaftServiceClient(cc).Stream(sctx)
	if err != nil {
		close(recvDone)
		return false, p.t.outboundError(p, err)
	}
	recvErr := make(chan error, 1)
	acked := make(chan struct{})
	go func() {
		defer close(recvDone)
		first := true
		for {
			if _, err := stream.Recv(); err != nil {
				recvErr <- err
				return
			}
			if first {
				first = false
				close(acked)
			}
		}
	}()

	hs := time.NewTimer(p.t.cfg.DialTimeout)
	defer hs.Stop()
	select {
	case <-acked:
	case err := <-recvErr:
		return false, p.t.outboundError(p, err)
	case <-hs.C:
		return false, fmt.Errorf("transport: node %d at %s did not accept the raft stream within %s", p.id, p.addr, p.t.cfg.DialTimeout)
	case <-ctx.Done():
		return false, ctx.Err()
	}
	p.accepted()
	p.connected.Store(true)
	p.logger.Debug("raft stream to peer open")

	var batch raftv1.MessageBatch
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-recvErr:
			return true, p.t.outboundError(p, err)
		case <-p.notify:
		}
		q := p.take()
		for len(q) > 0 {
			n, size, err := p.fill(&batch, q)
			if err != nil {
				// Cannot happen for a valid raftpb.Message; drop the rest.
				p.fail(q)
				return true, err
			}
			if err := stream.Send(&batch); err != nil {
				p.fail(q)
				if errors.Is(err, io.EOF) {
					// The stream ended; Recv holds the reason.
					select {
					case err = <-recvErr:
					case <-time.After(time.Second):
					}
				}
				return true, p.t.outboundError(p, err)
			}
			p.t.stats.batchesSent.Add(1)
			p.t.stats.messagesSent.Add(uint64(n))
			p.t.stats.bytesSent.Add(uint64(size))
			q = q[n:]
		}
	}
}

// fill encodes a prefix of q into batch, up to MaxBatchBytes (at least one
// message), and returns how many messages and bytes it holds.
func (p *peer) fill(batch *raftv1.MessageBatch, q []queued) (n, size int, err error) {
	for _, gm := range batch.Messages {
		gm.Message = nil
	}
	batch.Messages = batch.Messages[:0]
	for n < len(q) {
		b, err := proto.Marshal(q[n].m)
		if err != nil {
			return n, size, fmt.Errorf("transport: encode raft message for node %d: %w", p.id, err)
		}
		if n > 0 && size+len(b) > p.t.cfg.MaxBatchBytes {
			break
		}
		batch.Messages = append(batch.Messages, &raftv1.GroupMessage{GroupId: q[n].group, Message: b})
		size += len(b)
		n++
	}
	return n, size, nil
}
