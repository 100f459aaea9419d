package cluster

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Opening recovery gates (multiraft/gate.go holds them). For every gated
// group the node asks the group's leader for a fresh read index
// (ForwardService.ReadIndex, the read barrier of read.go: a quorum
// heartbeat round proves that it leads now) together with the last index
// of its log, waits until its replica applied both, and opens the gate: it
// then holds every entry committed before this start. The last index
// matters because the leader still counts the entries this replica
// acknowledged before its crash, lost or not, towards commitment: a
// replica that lost some never applies through them, so it stays gated
// (and asks to be rebuilt) instead of voting without them. A replica
// whose leader showed that it lost acknowledged entries asks to be rebuilt
// first (RequestRebuild with its last index), since the leader never sends
// again what it believes the replica holds. A gated group that neither
// opens nor applies anything for gateStallAfter reports itself stalled.

// Gate timing.
const (
	// gateStallAfter is how long a gated group may go without a barrier
	// and without applying anything before it reports itself stalled.
	gateStallAfter = 30 * time.Second
	// gateBarrierWait bounds one wait for the barrier to apply.
	gateBarrierWait = 3 * time.Second
	// maxGateOpeners bounds the groups worked on at once.
	maxGateOpeners = 8
)

// GateState is a gated group's state, as the metrics name it.
type GateState string

// Gate states.
const (
	GateAwaitingBarrier GateState = "awaiting_barrier"
	GateStalled         GateState = "stalled"
)

// gateWatch is what the opener knows of one gated group.
type gateWatch struct {
	applied  uint64
	progress time.Time // the last apply (or the gate's start)
	stalled  bool
	busy     bool
	// planTerm is the term of the recovery plan the replica held when last
	// seen: taking a plan starts a new 30 s before the group counts as
	// stalled (a wedged plan).
	planTerm uint64
}

// gates tracks the gated groups' openers.
type gates struct {
	mu      sync.Mutex
	watches map[uint32]*gateWatch
	sem     chan struct{}
	// wg holds the running openers; the leadership loop waits for them
	// when it ends.
	wg sync.WaitGroup
}

// openGates starts an opener for every gated group that has none running,
// and updates the stall state; it runs on each leadership tick.
func (c *Cluster) openGates(ctx context.Context) {
	gated := c.host.Gated()
	now := c.now()
	c.gates.mu.Lock()
	defer c.gates.mu.Unlock()
	if c.gates.watches == nil {
		c.gates.watches = map[uint32]*gateWatch{}
		c.gates.sem = make(chan struct{}, maxGateOpeners)
	}
	for g := range c.gates.watches {
		if !slices.Contains(gated, g) {
			delete(c.gates.watches, g)
		}
	}
	for _, g := range gated {
		w := c.gates.watches[g]
		st := c.host.Status(g)
		if w == nil {
			w = &gateWatch{applied: st.Applied, progress: now}
			c.gates.watches[g] = w
		}
		if p := st.Recovery; p != nil && p.Term != w.planTerm {
			w.planTerm, w.progress, w.stalled = p.Term, now, false
		}
		if st.Applied != w.applied {
			w.applied, w.progress = st.Applied, now
			if w.stalled {
				w.stalled = false
				c.logger.Info("the gated group applies entries again", "group_id", g)
			}
		}
		if !w.stalled && now.Sub(w.progress) >= gateStallAfter {
			w.stalled = true
			c.logger.Error("recovery gate stalled: no leader barrier and nothing applied; writes acknowledged after the last fsync may be gone; see Recovering after a host crash (ursulactl recover-group)",
				"group_id", g, "since", w.progress, "last_index", st.LastIndex, "term", st.Term)
		}
		if w.busy || st.LeaderID == 0 || st.LeaderID == c.cfg.NodeID {
			continue
		}
		select {
		case c.gates.sem <- struct{}{}:
		default:
			continue // enough openers at work; the next tick starts this one
		}
		w.busy = true
		c.gates.wg.Add(1)
		go func() {
			defer c.gates.wg.Done()
			defer func() {
				<-c.gates.sem
				c.gates.mu.Lock()
				w.busy = false
				c.gates.mu.Unlock()
			}()
			c.tryOpenGate(ctx, g, st.LeaderID)
		}()
	}
}

// tryOpenGate makes one attempt at opening group g's gate through leader.
func (c *Cluster) tryOpenGate(ctx context.Context, g uint32, leader uint64) {
	ctx, cancel := context.WithTimeout(ctx, gateBarrierWait+2*time.Second)
	defer cancel()
	st := c.host.Status(g)
	if st.LostEntries {
		if _, err := c.net.RequestRebuild(ctx, leader, g, c.cfg.NodeID, st.LastIndex); err != nil {
			c.logger.Debug("rebuild request of a gated replica failed", "group_id", g, "leader", leader, "err", err)
		}
	}
	index, last, err := c.remoteReadIndex(ctx, leader, g)
	if err != nil {
		c.logger.Debug("recovery gate: the leader's read index failed", "group_id", g, "leader", leader, "err", err)
		return
	}
	barrier := max(index, last)
	wctx, wcancel := context.WithTimeout(ctx, gateBarrierWait)
	defer wcancel()
	if err := c.host.WaitApplied(wctx, g, barrier); err != nil {
		c.logger.Debug("recovery gate: the barrier did not apply in time", "group_id", g, "barrier", barrier, "applied", c.host.Status(g).Applied)
		return
	}
	if err := c.host.OpenGate(ctx, g); err != nil {
		c.logger.Error("recovery gate: could not record the opened gate", "group_id", g, "err", err)
	}
}

// GateStates reports the gated groups and their states.
func (c *Cluster) GateStates() map[uint32]GateState {
	out := map[uint32]GateState{}
	gated := c.host.Gated()
	c.gates.mu.Lock()
	defer c.gates.mu.Unlock()
	for _, g := range gated {
		out[g] = GateAwaitingBarrier
		// A plan taken since the watch last looked restarts its wait.
		if w := c.gates.watches[g]; w != nil && w.stalled {
			if p := c.host.Status(g).Recovery; p == nil || p.Term == w.planTerm {
				out[g] = GateStalled
			}
		}
	}
	return out
}
