package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/services/platform/telemetry"
)

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("upstream: router closed")

// maxReconnectBackoff caps gRPC's reconnect backoff so that a node that
// comes back is used again within seconds, not minutes.
const maxReconnectBackoff = 2 * time.Second

// nodeConn is one gRPC connection to one node address.
type nodeConn struct {
	addr   string
	conn   *grpc.ClientConn
	client streamv1.StreamServiceClient
	// appends carries Append calls on AppendStream; nil when every call
	// must be a call of its own (traced: each append keeps its spans).
	appends *appendMux
	// id is the node id once learned (0 for a seed not yet heard from).
	id atomic.Uint64
	// up is false after a transport failure, true again after any answer.
	up atomic.Bool
}

// close closes the connection and the append call on it.
func (nc *nodeConn) close() {
	if nc.appends != nil {
		nc.appends.close()
	}
	_ = nc.conn.Close()
}

// append sends one append to the node.
func (nc *nodeConn) append(ctx context.Context, in *streamv1.AppendRequest, opts ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	if nc.appends != nil && len(opts) == 0 && appendBytes(in) <= muxMaxBytes {
		return nc.appends.Append(ctx, in)
	}
	return nc.client.Append(ctx, in, opts...)
}

// muxMaxBytes is the largest append carried on the shared AppendStream
// call: a larger one goes as a call of its own, so that its bytes do not
// hold up the small appends behind it in one stream's flow-control window
// (and a call is cheap beside them).
const muxMaxBytes = 64 << 10

func appendBytes(in *streamv1.AppendRequest) int {
	n := len(in.GetBody())
	for _, f := range in.GetFrames() {
		n += len(f)
	}
	return n
}

// markUp records that the node answered.
func (nc *nodeConn) markUp() {
	if !nc.up.Load() {
		nc.up.Store(true)
	}
}

// view is one published picture of the cluster. Everything but leaders is
// immutable after publication; leaders are updated in place as NOT_LEADER
// answers teach the router better.
type view struct {
	clusterID  string
	groupCount int
	nodes      map[uint64]*nodeConn
	order      []*nodeConn // by node id
	leaders    []atomic.Uint64
	// claims[g] is the node that claimed group g for itself in the poll
	// this view was made from (0: none did), and polled is when that poll
	// started: a node's claim of its own leadership in a poll made after
	// it refused a call outweighs the refusal (route.go, relearn).
	claims []uint64
	polled time.Time
	// single is set in single-node mode: every call goes to it directly.
	single *nodeConn
}

// claimedAfter returns the node that claimed group g for itself in a poll
// that started after t, or 0.
func (v *view) claimedAfter(g uint32, t time.Time) uint64 {
	if int(g) >= len(v.claims) || !v.polled.After(t) {
		return 0
	}
	return v.claims[g]
}

// leaderOf returns the cached leader of group g, or nil.
func (v *view) leaderOf(g uint32) *nodeConn {
	if int(g) >= len(v.leaders) {
		return nil
	}
	id := v.leaders[g].Load()
	if id == 0 {
		return nil
	}
	return v.nodes[id]
}

// flight is one cluster-info refresh in progress; waiters block on done.
type flight struct {
	done chan struct{}
	err  error
}

// Router implements streamv1.StreamServiceClient over a cluster of storage
// nodes: it sends each call to the node that can serve it (see doc.go).
// It is safe for concurrent use.
type Router struct {
	cfg    Config
	logger *slog.Logger
	opts   []grpc.DialOption

	view atomic.Pointer[view]
	// gen counts completed refreshes (successful or not).
	gen  atomic.Uint64
	kick chan struct{}
	rr   atomic.Uint64 // round-robin cursor for calls any node can serve

	mu        sync.Mutex
	conns     map[string]*nodeConn // by address; seeds included
	seeds     []*nodeConn
	inFlight  *flight
	closed    bool
	refreshOK bool // last refresh outcome, for logging transitions only
	// traced: calls carry spans and rpc metrics (an exporter is set up),
	// so appends are calls of their own rather than AppendStream messages.
	traced bool

	m metrics
}

var _ streamv1.StreamServiceClient = (*Router)(nil)

// New validates cfg and creates the seed connections (gRPC connects lazily,
// in the background). It sends no request; the first call, or Run, learns
// the cluster.
func New(cfg Config, logger *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		cfg:    cfg,
		logger: logger,
		kick:   make(chan struct{}, 1),
		conns:  make(map[string]*nodeConn),
	}
	creds, err := cfg.ClientPlane.DialOptions(logger)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	r.opts = append(creds,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxMessageBytes), grpc.MaxCallSendMsgSize(cfg.MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(connWindowSize),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxReconnectBackoff},
			MinConnectTimeout: cfg.DialTimeout,
		}),
	)
	if telemetry.TracesExported() || telemetry.MetricsExported() {
		// Nobody would see the spans and rpc metrics otherwise, and they
		// cost about a tenth of the gateway's CPU per append.
		r.opts = append(r.opts, grpc.WithStatsHandler(clientStatsHandler()))
		r.traced = true
	}
	for _, addr := range cfg.Nodes {
		if _, ok := r.conns[addr]; ok {
			continue
		}
		nc, err := r.dial(addr)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.conns[addr] = nc
		r.seeds = append(r.seeds, nc)
	}
	return r, nil
}

// dial creates a connection to addr; it does not wait for it.
func (r *Router) dial(addr string) (*nodeConn, error) {
	conn, err := grpc.NewClient(addr, r.opts...)
	if err != nil {
		return nil, fmt.Errorf("upstream: connect to node %s: %w", addr, err)
	}
	conn.Connect()
	nc := &nodeConn{addr: addr, conn: conn, client: streamv1.NewStreamServiceClient(conn)}
	if !r.traced {
		nc.appends = newAppendMux(nc.client, addr)
	}
	nc.up.Store(true)
	return nc, nil
}

// Run polls cluster info every RefreshInterval, and at once when a call
// asks for it, until ctx ends. It returns nil when ctx ends.
func (r *Router) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.RefreshInterval)
	defer t.Stop()
	for {
		_ = r.refreshAfter(ctx, r.gen.Load())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.kick:
		}
	}
}

// Close closes every node connection. It is idempotent; calls in flight
// fail, later calls get ErrClosed (as an Unavailable status).
func (r *Router) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	for _, nc := range r.conns {
		nc.close()
	}
	r.conns = nil
	r.view.Store(nil)
}

// requestRefresh asks Run for a refresh soon, without waiting.
func (r *Router) requestRefresh() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// refreshAfter makes sure a refresh completed after generation gen was
// observed: it returns at once if one did, joins one in progress, or runs
// one. Concurrent callers share one refresh.
func (r *Router) refreshAfter(ctx context.Context, gen uint64) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if r.gen.Load() > gen {
		r.mu.Unlock()
		return nil
	}
	if f := r.inFlight; f != nil {
		r.mu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	r.inFlight = f
	r.mu.Unlock()

	// The refresh is shared, so the caller's cancellation must not cut it
	// short for the others; DialTimeout bounds it instead.
	f.err = r.refresh(context.WithoutCancel(ctx))

	r.mu.Lock()
	r.inFlight = nil
	r.gen.Add(1)
	ok := f.err == nil
	if ok != r.refreshOK {
		if ok {
			r.logger.Info("cluster info refreshed", "nodes", len(r.currentNodes()))
		} else {
			r.logger.Warn("cluster info refresh failed", "err", f.err)
		}
		r.refreshOK = ok
	}
	r.mu.Unlock()
	close(f.done)
	return f.err
}

// NodeAddrs returns the client-plane addresses of the cluster's nodes as
// the router last learned them (by node id), or the seeds before it
// learned any. In single-node mode it is the seed's address, which the
// node answers on whatever it advertises.
func (r *Router) NodeAddrs() []string {
	v := r.view.Load()
	if v == nil {
		return slices.Clone(r.cfg.Nodes)
	}
	if v.single != nil {
		return []string{v.single.addr}
	}
	out := make([]string, 0, len(v.order))
	for _, nc := range v.order {
		out = append(out, nc.addr)
	}
	return out
}

// currentNodes returns the nodes of the current view (r.mu held or not).
func (r *Router) currentNodes() []*nodeConn {
	if v := r.view.Load(); v != nil {
		return v.order
	}
	return nil
}

// infoResult is one node's answer to GetClusterInfo.
type infoResult struct {
	nc   *nodeConn
	info *streamv1.GetClusterInfoResponse
	err  error
}

// poll asks every node in ncs for cluster info, concurrently.
func (r *Router) poll(ctx context.Context, ncs []*nodeConn) []infoResult {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DialTimeout)
	defer cancel()
	res := make([]infoResult, len(ncs))
	var wg sync.WaitGroup
	for i, nc := range ncs {
		wg.Go(func() {
			info, err := nc.client.GetClusterInfo(ctx, &streamv1.GetClusterInfoRequest{})
			res[i] = infoResult{nc: nc, info: info, err: err}
			if err != nil {
				if nc.up.Swap(false) {
					r.logger.Warn("node unreachable", "node_id", nc.id.Load(), "addr", nc.addr, "err", err)
				}
				return
			}
			nc.id.Store(info.GetNodeId())
			if !nc.up.Swap(true) {
				r.logger.Info("node reachable", "node_id", info.GetNodeId(), "addr", nc.addr)
			}
		})
	}
	wg.Wait()
	return res
}

// refresh polls the known nodes (the seeds when none is known or none
// answers), merges their answers and publishes a new view.
func (r *Router) refresh(ctx context.Context) error {
	r.m.refreshes.Add(1)
	polled := time.Now()
	targets := r.currentNodes()
	var results []infoResult
	if len(targets) > 0 {
		results = r.poll(ctx, targets)
	}
	if !anyOK(results) {
		r.mu.Lock()
		seeds := slices.Clone(r.seeds)
		r.mu.Unlock()
		results = append(results, r.poll(ctx, seeds)...)
	}
	if !anyOK(results) {
		r.m.refreshFailures.Add(1)
		errs := make([]error, 0, len(results))
		for _, res := range results {
			errs = append(errs, fmt.Errorf("node %s: %w", res.nc.addr, res.err))
		}
		return fmt.Errorf("upstream: no node answered cluster info: %w", errors.Join(errs...))
	}
	return r.publish(results, polled)
}

func anyOK(results []infoResult) bool {
	for _, res := range results {
		if res.err == nil {
			return true
		}
	}
	return false
}

// publish merges cluster info answers into a new view, opening connections
// to new nodes and closing those to nodes that left.
func (r *Router) publish(results []infoResult, polled time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	old := r.view.Load()
	clusterID := ""
	if old != nil {
		clusterID = old.clusterID
	}
	var answers []*streamv1.GetClusterInfoResponse
	for _, res := range results {
		if res.err != nil {
			continue
		}
		if clusterID == "" {
			clusterID = res.info.GetClusterId()
		}
		if res.info.GetClusterId() != clusterID {
			r.logger.Warn("node belongs to another cluster; ignored", "addr", res.nc.addr, "node_id", res.info.GetNodeId(), "cluster_id", res.info.GetClusterId(), "want_cluster_id", clusterID)
			continue
		}
		answers = append(answers, res.info)
	}
	if len(answers) == 0 {
		return fmt.Errorf("upstream: no node of cluster %q answered", clusterID)
	}
	slices.SortFunc(answers, func(a, b *streamv1.GetClusterInfoResponse) int { return cmp.Compare(a.GetNodeId(), b.GetNodeId()) })
	groupCount := int(answers[0].GetGroupCount())
	if groupCount <= 0 {
		return fmt.Errorf("upstream: node %d reports %d groups", answers[0].GetNodeId(), groupCount)
	}

	// Nodes: the union of what every answer lists, first answer wins on an
	// address conflict.
	addrs := make(map[uint64]string)
	for _, a := range answers {
		if int(a.GetGroupCount()) != groupCount {
			r.logger.Warn("nodes disagree on the group count", "node_id", a.GetNodeId(), "group_count", a.GetGroupCount(), "want_group_count", groupCount)
		}
		for _, n := range a.GetNodes() {
			if n.GetId() == 0 || n.GetClientAddr() == "" {
				continue
			}
			if _, ok := addrs[n.GetId()]; !ok {
				addrs[n.GetId()] = n.GetClientAddr()
			}
		}
	}

	v := &view{clusterID: clusterID, groupCount: groupCount, nodes: make(map[uint64]*nodeConn, len(addrs))}
	if len(r.seeds) == 1 && len(addrs) <= 1 {
		// Single-node mode: the seed is the node, whatever address it
		// advertises (often a wildcard listen address).
		seed := r.seeds[0]
		v.single = seed
		v.nodes[answers[0].GetNodeId()] = seed
	} else {
		for id, addr := range addrs {
			nc := r.conns[addr]
			if nc == nil {
				var err error
				if nc, err = r.dial(addr); err != nil {
					r.logger.Warn("cannot connect to node", "node_id", id, "addr", addr, "err", err)
					continue
				}
				r.conns[addr] = nc
				r.logger.Info("node added", "node_id", id, "addr", addr)
			}
			nc.id.Store(id)
			v.nodes[id] = nc
		}
	}
	for _, nc := range v.nodes {
		v.order = append(v.order, nc)
	}
	slices.SortFunc(v.order, func(a, b *nodeConn) int { return cmp.Compare(a.id.Load(), b.id.Load()) })

	v.leaders = make([]atomic.Uint64, groupCount)
	v.claims = make([]uint64, groupCount)
	v.polled = polled
	for g := range groupCount {
		id, claimed := electLeader(answers, g)
		v.leaders[g].Store(id)
		if claimed {
			v.claims[g] = id
		}
	}

	// Close connections nobody uses any more (seeds stay).
	keep := make(map[*nodeConn]bool, len(v.nodes)+len(r.seeds))
	for _, nc := range v.nodes {
		keep[nc] = true
	}
	for _, nc := range r.seeds {
		keep[nc] = true
	}
	for addr, nc := range r.conns {
		if !keep[nc] {
			r.logger.Info("node removed", "node_id", nc.id.Load(), "addr", addr)
			nc.close()
			delete(r.conns, addr)
		}
	}
	r.view.Store(v)
	return nil
}

// electLeader picks group g's leader from the answers: a node claiming the
// group for itself wins (claimed is then true); otherwise the most common
// claim; 0 when none.
func electLeader(answers []*streamv1.GetClusterInfoResponse, g int) (id uint64, claimed bool) {
	var best uint64
	bestVotes := 0
	votes := make(map[uint64]int, 2)
	for _, a := range answers {
		leaders := a.GetGroupLeaders()
		if g >= len(leaders) || leaders[g] == 0 {
			continue
		}
		l := leaders[g]
		if l == a.GetNodeId() {
			return l, true
		}
		votes[l]++
		if votes[l] > bestVotes {
			best, bestVotes = l, votes[l]
		}
	}
	return best, false
}

// setLeader records id (at addr, when given and new) as group g's leader
// and returns its connection, or nil when the node is unknown.
func (r *Router) setLeader(v *view, g uint32, id uint64, addr string) *nodeConn {
	if id == 0 || int(g) >= len(v.leaders) {
		return nil
	}
	if nc := v.nodes[id]; nc != nil {
		v.leaders[g].Store(id)
		return nc
	}
	if addr == "" || v.single != nil {
		return nil
	}
	// A leader the view does not list yet: add it now rather than wait for
	// the next refresh.
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.view.Load()
	if r.closed || cur == nil {
		return nil
	}
	if nc := cur.nodes[id]; nc != nil {
		cur.leaders[g].Store(id)
		return nc
	}
	nc := r.conns[addr]
	if nc == nil {
		var err error
		if nc, err = r.dial(addr); err != nil {
			r.logger.Warn("cannot connect to leader", "node_id", id, "addr", addr, "err", err)
			return nil
		}
		r.conns[addr] = nc
		r.logger.Info("node added", "node_id", id, "addr", addr)
	}
	nc.id.Store(id)
	nv := &view{clusterID: cur.clusterID, groupCount: cur.groupCount, nodes: make(map[uint64]*nodeConn, len(cur.nodes)+1), claims: cur.claims, polled: cur.polled}
	for k, n := range cur.nodes {
		nv.nodes[k] = n
	}
	nv.nodes[id] = nc
	nv.order = append(slices.Clone(cur.order), nc)
	slices.SortFunc(nv.order, func(a, b *nodeConn) int { return cmp.Compare(a.id.Load(), b.id.Load()) })
	nv.leaders = make([]atomic.Uint64, len(cur.leaders))
	for i := range cur.leaders {
		nv.leaders[i].Store(cur.leaders[i].Load())
	}
	nv.leaders[g].Store(id)
	r.view.Store(nv)
	return nc
}

// unavailable is the error for "no node can take this call now": an
// Unavailable status carrying retry_after_ms.
func (r *Router) unavailable(format string, args ...any) error {
	ms := r.cfg.RetryAfter.Milliseconds()
	if ms <= 0 {
		ms = 1
	}
	return grpcerr.ToStatus(errcode.New(errcode.Unavailable, format, args...).With(errcode.KeyRetryAfterMS, strconv.FormatInt(ms, 10)))
}

// Flow-control windows of the node connections. Fixed windows (instead of
// gRPC's default 64 KiB with bandwidth-delay probing) spare a ping per
// round trip and most window updates on connections carrying thousands of
// small calls a second.
const (
	windowSize     = 1 << 20
	connWindowSize = 16 << 20
)
