package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	"github.com/ursula/ursula/internal/pki"
	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
)

// Metadata keys every Raft RPC carries.
const (
	MetadataClusterID = "ursula-cluster-id"
	MetadataNodeID    = "ursula-node-id"
)

// StepReporter is the part of the Raft host the transport drives; it is
// satisfied by *multiraft.Host. Every method must not block.
type StepReporter interface {
	// Step hands an inbound message to its group.
	Step(groupID uint32, m *pb.Message) error
	// ReportUnreachable tells the group a message to `to` was not sent.
	ReportUnreachable(groupID uint32, to uint64) error
	// ReportSnapshot tells the group whether a MsgSnap to `to` arrived.
	ReportSnapshot(groupID uint32, to uint64, failed bool) error
}

var (
	// ErrClosed is returned once the transport has been closed.
	ErrClosed = errors.New("transport: closed")
	// ErrUnknownPeer is returned for a node id that is not a configured peer.
	ErrUnknownPeer = errors.New("transport: unknown peer")
	// ErrPeerClusterMismatch is matched (errors.Is) by a *RefusalError for a
	// peer that belongs to another cluster.
	ErrPeerClusterMismatch = errors.New("transport: peer belongs to another cluster")
	// ErrProtocolMismatch is matched by a *RefusalError for a peer that
	// found no cluster id in the request (an older format epoch).
	ErrProtocolMismatch = errors.New("transport: raft protocol mismatch")
)

// Transport carries Raft messages between this node and its peers: the
// sending side (Send, SendSnapshot) and the receiving side (Register) of
// RaftService. See the package documentation for the wire behaviour.
type Transport struct {
	cfg    Config
	logger *slog.Logger
	host   atomic.Pointer[hostBox]
	probe  atomic.Pointer[ProbeFunc]
	shed   atomic.Pointer[ShedStateFunc]

	peers   atomic.Pointer[map[uint64]*peer] // copy on write, under mu
	stats   counters
	refusal refusals

	// life ends when the transport closes; snapshot sends and peer loops
	// derive their contexts from it (Send has no context of its own).
	life     context.Context
	stopLife context.CancelFunc
	closing  chan struct{}
	wg       sync.WaitGroup // peer loops and snapshot senders

	mu      sync.Mutex
	running bool
	closed  bool
	runDone chan struct{} // closed when Run returns; nil if Run never ran
}

type hostBox struct{ h StepReporter }

// New validates cfg and builds a transport. It starts nothing and dials
// nobody; Run starts the peer senders. host may be nil and set later with
// SetHost (the Raft host needs the transport to be built first).
func New(cfg Config, host StepReporter, logger *slog.Logger) (*Transport, error) {
	cfg.Peers = maps.Clone(cfg.Peers)
	cfg.DialOptions = slices.Clone(cfg.DialOptions)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{
		cfg:     cfg,
		logger:  logger.With("node_id", cfg.NodeID),
		closing: make(chan struct{}),
	}
	t.life, t.stopLife = context.WithCancel(context.Background())
	t.refusal.init(cfg.MismatchWindow)
	if host != nil {
		t.SetHost(host)
	}
	if cfg.Probe != nil {
		t.SetProbeFunc(cfg.Probe)
	}
	if cfg.ShedState != nil {
		t.SetShedStateFunc(cfg.ShedState)
	}
	peers := map[uint64]*peer{}
	for id, addr := range cfg.Peers {
		if id == cfg.NodeID {
			continue
		}
		peers[id] = newPeer(t, id, addr)
	}
	t.peers.Store(&peers)
	return t, nil
}

func (t *Transport) peer(id uint64) *peer { return (*t.peers.Load())[id] }

func (t *Transport) peerList() []*peer {
	return slices.Collect(maps.Values(*t.peers.Load()))
}

// startPeer starts p's sender; t.mu is held and the transport is running.
func (t *Transport) startPeer(p *peer) {
	ctx, cancel := context.WithCancel(t.life)
	p.stop = cancel
	t.wg.Go(func() { p.run(ctx) })
}

// AddPeer adds (or re-addresses) peer id at the host:port addr of its
// cluster plane, for a membership change. Re-addressing replaces the
// peer's sender and connection.
func (t *Transport) AddPeer(id uint64, addr string) error {
	if id == 0 || id == t.cfg.NodeID {
		return fmt.Errorf("%w: cannot add peer %d", ErrInvalidConfig, id)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%w: peer %d address %q: %v", ErrInvalidConfig, id, addr, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	old := *t.peers.Load()
	if p := old[id]; p != nil && p.addr == addr {
		return nil
	}
	peers := maps.Clone(old)
	p := newPeer(t, id, addr)
	peers[id] = p
	t.peers.Store(&peers)
	if prev := old[id]; prev != nil {
		prev.retire()
	}
	if t.running {
		t.startPeer(p)
	}
	return nil
}

// RemovePeer stops sending to peer id and closes its connection; messages
// for it are then dropped and reported unreachable.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.peers.Load()
	p := old[id]
	if p == nil {
		return
	}
	peers := maps.Clone(old)
	delete(peers, id)
	t.peers.Store(&peers)
	p.retire()
}

// SetHost sets the Raft host inbound messages are stepped into and
// delivery reports go to. Inbound Raft traffic is refused (UNAVAILABLE)
// until it is set.
func (t *Transport) SetHost(h StepReporter) {
	t.host.Store(&hostBox{h: h})
}

// SetProbeFunc sets the callback answering Probe.
func (t *Transport) SetProbeFunc(f ProbeFunc) { t.probe.Store(&f) }

// SetShedStateFunc sets the callback answering GetShedState.
func (t *Transport) SetShedStateFunc(f ShedStateFunc) { t.shed.Store(&f) }

func (t *Transport) getHost() StepReporter {
	if b := t.host.Load(); b != nil {
		return b.h
	}
	return nil
}

func (t *Transport) reportUnreachable(groupID uint32, to uint64) {
	if h := t.getHost(); h != nil {
		_ = h.ReportUnreachable(groupID, to)
	}
}

func (t *Transport) reportSnapshot(groupID uint32, to uint64, failed bool) {
	if h := t.getHost(); h != nil {
		_ = h.ReportSnapshot(groupID, to, failed)
	}
}

// Run starts one sender per peer and blocks until ctx ends or Close is
// called; it then stops every goroutine of the transport and closes its
// connections. It returns nil, or ErrClosed when the transport was closed
// or already ran.
func (t *Transport) Run(ctx context.Context) error {
	t.mu.Lock()
	if t.closed || t.running {
		t.mu.Unlock()
		return ErrClosed
	}
	t.running = true
	t.runDone = make(chan struct{})
	for _, p := range t.peerList() {
		t.startPeer(p)
	}
	t.mu.Unlock()
	defer close(t.runDone)

	select {
	case <-ctx.Done():
	case <-t.closing:
	}
	t.shutdown()
	return nil
}

// Close stops the transport: it ends Run, waits for every goroutine the
// transport started, closes its connections, and makes inbound streams
// end. It is idempotent.
func (t *Transport) Close() {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.closing)
	}
	done := t.runDone
	t.mu.Unlock()
	if done != nil {
		<-done
		return
	}
	t.shutdown()
}

func (t *Transport) shutdown() {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.closing)
	}
	t.mu.Unlock()
	t.stopLife()
	t.wg.Wait()
	for _, p := range t.peerList() {
		p.closeConn()
	}
}

func (t *Transport) isClosed() bool {
	select {
	case <-t.closing:
		return true
	default:
		return false
	}
}

// Send queues msgs of groupID for their peers and returns at once. A
// message for an unknown peer, or beyond a peer's queue bound, is dropped
// and reported unreachable; a MsgSnap goes out on its own goroutine and is
// reported with ReportSnapshot. Send implements multiraft.Transport.
func (t *Transport) Send(groupID uint32, msgs []*pb.Message) {
	if t.isClosed() {
		return
	}
	for _, m := range msgs {
		to := m.GetTo()
		p := t.peer(to)
		if p == nil {
			t.stats.dropped.Add(1)
			t.logger.Debug("dropping raft message for an unknown peer", "group_id", groupID, "to", to, "type", m.GetType().String())
			t.reportUnreachable(groupID, to)
			if m.GetType() == pb.MessageType_MsgSnap {
				t.reportSnapshot(groupID, to, true)
			}
			continue
		}
		if m.GetType() == pb.MessageType_MsgSnap {
			t.sendSnapshot(groupID, p, m)
			continue
		}
		if !p.enqueue(groupID, m) {
			t.stats.dropped.Add(1)
			t.reportUnreachable(groupID, to)
		}
	}
}

// conn returns the peer's connection, creating it on first use.
func (t *Transport) conn(p *peer) (*grpc.ClientConn, error) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if t.isClosed() {
		return nil, ErrClosed
	}
	if p.retired {
		return nil, fmt.Errorf("%w: %d (removed)", ErrUnknownPeer, p.id)
	}
	if p.conn != nil {
		return p.conn, nil
	}
	creds := insecure.NewCredentials()
	if t.cfg.TLS != nil {
		creds = credentials.NewTLS(t.cfg.TLS.ClientConfig(pki.ExpectNode(p.id)))
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  t.cfg.BackoffMin,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   t.cfg.BackoffMax,
			},
			MinConnectTimeout: t.cfg.DialTimeout,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                t.cfg.KeepaliveTime,
			Timeout:             t.cfg.KeepaliveTime,
			PermitWithoutStream: true,
		}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(t.cfg.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(t.cfg.MaxMessageBytes),
		),
	}
	opts = append(opts, t.DialOptions()...)
	opts = append(opts, t.cfg.DialOptions...)
	cc, err := grpc.NewClient(p.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("transport: connect to node %d at %s: %w", p.id, p.addr, err)
	}
	p.conn = cc
	return cc, nil
}

// Conn is the connection to peer id (created on first use), for the
// node's other cluster-plane clients (forwards): it carries this node's
// identity as every Raft RPC does.
func (t *Transport) Conn(id uint64) (*grpc.ClientConn, error) {
	p := t.peer(id)
	if p == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownPeer, id)
	}
	return t.conn(p)
}

// DialOptions are the client options that make every RPC on a connection
// carry this node's ursula-cluster-id and ursula-node-id metadata.
func (t *Transport) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(t.OutgoingContext(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(t.OutgoingContext(ctx), desc, cc, method, opts...)
		}),
	}
}

// OutgoingContext returns ctx with this node's identity metadata attached.
func (t *Transport) OutgoingContext(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx,
		MetadataClusterID, t.cfg.ClusterID,
		MetadataNodeID, fmt.Sprint(t.cfg.NodeID))
}

func (t *Transport) client(peerID uint64) (*peer, raftv1.RaftServiceClient, error) {
	p := t.peer(peerID)
	if p == nil {
		return nil, nil, fmt.Errorf("%w: %d", ErrUnknownPeer, peerID)
	}
	cc, err := t.conn(p)
	if err != nil {
		return p, nil, err
	}
	return p, raftv1.NewRaftServiceClient(cc), nil
}

// Probe asks peer peerID for its state of groups (every group when empty).
func (t *Transport) Probe(ctx context.Context, peerID uint64, groups []uint32) (*raftv1.ProbeResponse, error) {
	p, c, err := t.client(peerID)
	if err != nil {
		return nil, fmt.Errorf("transport: probe node %d: %w", peerID, err)
	}
	resp, err := c.Probe(ctx, &raftv1.ProbeRequest{GroupIds: groups})
	if err != nil {
		return nil, fmt.Errorf("transport: probe node %d: %w", peerID, t.outboundError(p, err))
	}
	return resp, nil
}

// GetShedState asks peer peerID for its leadership-shed state. An answer
// naming another cluster id fails with ErrPeerClusterMismatch.
func (t *Transport) GetShedState(ctx context.Context, peerID uint64) (*raftv1.ShedState, error) {
	p, c, err := t.client(peerID)
	if err != nil {
		return nil, fmt.Errorf("transport: get shed state of node %d: %w", peerID, err)
	}
	resp, err := c.GetShedState(ctx, &raftv1.GetShedStateRequest{})
	if err != nil {
		return nil, fmt.Errorf("transport: get shed state of node %d: %w", peerID, t.outboundError(p, err))
	}
	if resp.GetClusterId() != t.cfg.ClusterID {
		return nil, fmt.Errorf("transport: get shed state of node %d: %w: answered with cluster id %q", peerID, ErrPeerClusterMismatch, resp.GetClusterId())
	}
	return resp, nil
}
