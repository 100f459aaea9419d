package upstream

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// mode says where a call may go and when it may be retried.
type mode uint8

const (
	// modeWrite: the group leader; retried after NOT_LEADER (up to
	// maxAttempts), or once after a transport failure that certainly
	// happened before the request left.
	modeWrite mode = iota
	// modeLeaderRead: the group leader (it must see the tail); idempotent,
	// so also retried once after any transport failure.
	modeLeaderRead
	// modeAnyRead: any replica of the group, the leader preferred; a
	// follower that cannot serve answers NOT_LEADER and the call moves to
	// the leader.
	modeAnyRead
)

func (m mode) idempotent() bool { return m != modeWrite }

// failure classifies an error from a node.
type failure uint8

const (
	failOther     failure = iota // a domain answer or anything else: return it
	failNotLeader                // NOT_LEADER from the node
	failTransport                // Unavailable without an Ursula error: the link failed
)

// classify sorts err and returns the domain error when there is one.
func classify(err error) (failure, *errcode.Error) {
	st, ok := status.FromError(err)
	if !ok {
		return failOther, nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == grpcerr.Domain {
			de := grpcerr.FromStatus(err)
			if de.Code == errcode.NotLeader {
				return failNotLeader, de
			}
			return failOther, de
		}
	}
	if st.Code() == codes.Unavailable {
		return failTransport, nil
	}
	return failOther, nil
}

// notSent reports whether a transport failure certainly happened before the
// request left this process: gRPC failed the call while picking a
// connection (dial error, refused connection, unresolvable name), so no
// node saw it.
func notSent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := strings.ToLower(st.Message())
	for _, s := range []string{"while dialing", "connection refused", "produced zero addresses", "name resolver error", "no such host"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// currentView returns the published view, learning the cluster first when
// there is none yet.
func (r *Router) currentView(ctx context.Context) (*view, error) {
	if v := r.view.Load(); v != nil {
		return v, nil
	}
	gen := r.gen.Load()
	if v := r.view.Load(); v != nil {
		return v, nil
	}
	if err := r.refreshAfter(ctx, gen); err != nil {
		if err == ErrClosed {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		return nil, r.unavailable("no storage node reachable: %v", err)
	}
	if v := r.view.Load(); v != nil {
		return v, nil
	}
	return nil, r.unavailable("no storage node reachable")
}

// pick chooses the node for a call on group g, never avoid.
func (r *Router) pick(v *view, g uint32, m mode, avoid *nodeConn) *nodeConn {
	if l := v.leaderOf(g); l != nil && l != avoid {
		if m != modeAnyRead || l.up.Load() {
			return l
		}
	}
	if m != modeAnyRead {
		return nil
	}
	return r.anyNode(v, avoid)
}

// anyNode returns a node other than avoid, nodes believed up first, round
// robin among them; nil when there is none.
func (r *Router) anyNode(v *view, avoid *nodeConn) *nodeConn {
	n := len(v.order)
	if n == 0 {
		return nil
	}
	start := int(r.rr.Add(1) % uint64(n))
	var down *nodeConn
	for i := range n {
		nc := v.order[(start+i)%n]
		if nc == avoid {
			continue
		}
		if nc.up.Load() {
			return nc
		}
		if down == nil {
			down = nc
		}
	}
	return down
}

// first picks the node for the first attempt of a call on group g. When the
// call needs the leader and none is cached, it re-learns the cluster first
// (sharing the refresh with concurrent callers).
func (r *Router) first(ctx context.Context, v *view, gen uint64, g uint32, m mode) (*nodeConn, error) {
	if v.leaderOf(g) != nil {
		r.m.cacheHits.Add(1)
	} else {
		r.m.cacheMisses.Add(1)
		if m != modeAnyRead {
			return r.relearn(ctx, gen, g, m, nil)
		}
		r.requestRefresh()
	}
	if nc := r.pick(v, g, m, nil); nc != nil {
		return nc, nil
	}
	return r.relearn(ctx, gen, g, m, nil)
}

// next decides, after attempt at node tried failed with err, whether to
// retry and where. It updates the leader cache and node health on the way.
// It returns the node to retry at, or nil and the error to return.
func (r *Router) next(ctx context.Context, gen uint64, g uint32, m mode, tried *nodeConn, err error) (*nodeConn, error) {
	if ctx.Err() != nil {
		return nil, err
	}
	kind, de := classify(err)
	switch kind {
	case failNotLeader:
		r.m.notLeader.Add(1)
		tried.up.Store(true)
		v := r.view.Load()
		if v == nil {
			return nil, err
		}
		id, _ := strconv.ParseUint(de.Metadata[errcode.KeyLeaderID], 10, 64)
		if id == tried.id.Load() {
			id = 0 // a node naming itself while refusing is no help
		}
		if id != 0 {
			if nc := r.setLeader(v, g, id, de.Metadata[errcode.KeyLeaderAddr]); nc != nil && nc != tried {
				r.requestRefresh()
				return nc, nil
			}
		} else if int(g) < len(v.leaders) {
			v.leaders[g].CompareAndSwap(tried.id.Load(), 0)
		}
		// The node named no usable leader: learn it from the cluster.
		return r.relearn(ctx, gen, g, modeLeaderRead, tried)
	case failTransport:
		r.m.transportFailures.Add(1)
		if tried.up.Swap(false) {
			r.logger.Warn("node unreachable", "node_id", tried.id.Load(), "addr", tried.addr, "err", err)
		}
		if v := r.view.Load(); v != nil && int(g) < len(v.leaders) {
			v.leaders[g].CompareAndSwap(tried.id.Load(), 0)
		}
		if !m.idempotent() && !notSent(err) {
			r.requestRefresh()
			return nil, err // it may have been proposed: the caller must not guess
		}
		if m == modeAnyRead {
			if v := r.view.Load(); v != nil {
				if nc := r.anyNode(v, tried); nc != nil {
					r.requestRefresh()
					return nc, nil
				}
			}
			return nil, err
		}
		return r.relearn(ctx, gen, g, m, tried)
	default:
		return nil, err
	}
}

// leaderPoll is the pause between two cluster info polls of a call that
// waits for its group's leader to be known.
const leaderPoll = 25 * time.Millisecond

// relearn refreshes cluster info (shared with concurrent callers) and
// returns group g's leader if it is now known and is not tried. A call
// that needs the leader waits for one up to Config.LeaderWait, polling
// again: a handoff or an election leaves a group without a known leader
// for a moment, and a refused call proposed nothing, so waiting beats a
// 503. The node tried is avoided unless a poll made after its refusal
// finds it claiming the group: a leader that stepped down (refusing the
// call) and won the election that followed leads the group again.
func (r *Router) relearn(ctx context.Context, gen uint64, g uint32, m mode, tried *nodeConn) (*nodeConn, error) {
	refused := time.Now()
	deadline := refused.Add(r.cfg.LeaderWait)
	if d, ok := ctx.Deadline(); ok && d.Add(-leaderPoll).Before(deadline) {
		// Answer "no known leader" before the caller gives up.
		deadline = d.Add(-leaderPoll)
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	choose := func() *nodeConn {
		v := r.view.Load()
		if v == nil {
			return nil
		}
		avoid := tried
		if c := v.claimedAfter(g, refused); tried != nil && c != 0 && c == tried.id.Load() {
			avoid = nil
		}
		return r.pick(v, g, m, avoid)
	}
	// The wait ends at its deadline or at the caller's, whichever comes
	// first (a late wakeup on a busy host may pass both): the answer is
	// then "no known leader", with its retry hint, unless the caller
	// went away. The cluster is asked at least once.
	for first := true; first || wctx.Err() == nil; first = false {
		_ = r.refreshAfter(wctx, gen)
		if nc := choose(); nc != nil {
			return nc, nil
		}
		if m == modeAnyRead {
			break
		}
		gen = r.gen.Load()
		t := time.NewTimer(leaderPoll)
		select {
		case <-t.C:
		case <-wctx.Done():
			t.Stop()
		}
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if nc := choose(); nc != nil {
		return nc, nil
	}
	r.m.noLeader.Add(1)
	return nil, r.unavailable("no known leader for group %d", g)
}

// settle turns the error of the last attempt into the error returned: a
// NOT_LEADER after the retry becomes Unavailable with a retry hint, so the
// client backs off while the cluster elects.
func (r *Router) settle(g uint32, nc *nodeConn, err error) error {
	kind, _ := classify(err)
	switch kind {
	case failNotLeader:
		r.m.notLeader.Add(1)
		if v := r.view.Load(); v != nil && int(g) < len(v.leaders) {
			v.leaders[g].CompareAndSwap(nc.id.Load(), 0)
		}
		r.requestRefresh()
		r.m.noLeader.Add(1)
		return r.unavailable("no stable leader for group %d", g)
	case failTransport:
		r.m.transportFailures.Add(1)
		nc.up.Store(false)
		r.requestRefresh()
		if notSent(err) {
			// Nothing happened anywhere: ask the client to come back.
			return r.unavailable("node %d unreachable: %v", nc.id.Load(), status.Convert(err).Message())
		}
	}
	return err
}

// maxAttempts bounds the attempts of one call that keeps meeting
// NOT_LEADER: a refusal proposed nothing, so following the hinted leader
// is always safe, and a leadership that moves twice in a row (the
// balancer's handoff right after an election) still ends at its leader
// instead of in a 503. Any other failure is retried at most once.
const maxAttempts = 3

// do runs f on the right node for the group of ref (group 0 when ref is
// nil), retrying once, or up to maxAttempts times after NOT_LEADER.
func do[T any](ctx context.Context, r *Router, ref *streamv1.StreamRef, m mode, f func(*nodeConn) (T, error)) (T, error) {
	var zero T
	v, err := r.currentView(ctx)
	if err != nil {
		return zero, err
	}
	if v.single != nil {
		return f(v.single)
	}
	g := placementGroup(v, ref)
	nc, err := r.first(ctx, v, r.gen.Load(), g, m)
	if err != nil {
		return zero, err
	}
	for attempt := 1; ; attempt++ {
		// A refresh that completes after this point may know better than
		// the view this attempt was routed by.
		gen := r.gen.Load()
		resp, err := f(nc)
		if err == nil {
			nc.markUp()
			return resp, nil
		}
		if attempt > 1 {
			if kind, _ := classify(err); kind != failNotLeader || attempt >= maxAttempts {
				return zero, r.settle(g, nc, err)
			}
		}
		retry, err := r.next(ctx, gen, g, m, nc, err)
		if retry == nil {
			return zero, err
		}
		r.m.retries.Add(1)
		nc = retry
	}
}

// placementGroup returns the group of ref in v (group 0 for nil).
func placementGroup(v *view, ref *streamv1.StreamRef) uint32 {
	if ref == nil {
		return 0
	}
	return groupOf(ref.GetBucket(), ref.GetStream(), v.groupCount)
}
