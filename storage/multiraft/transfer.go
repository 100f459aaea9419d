package multiraft

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
)

// While a leader hands its leadership over (an operator's transfer, the
// balancer, a drain), and once it stepped down before its worker noticed,
// raft refuses every proposal: before, a client write
// that arrived then failed with ErrProposalDropped (503), although the
// group was healthy and a leader was only milliseconds away. The worker
// holds such proposals instead, and once the transfer is over proposes
// them again (it still leads: the transfer was aborted) or answers
// NotLeaderError naming the new leader, which callers follow (the gateway
// retries there). Nothing held was appended, so either answer is exact.

// maxHeldProposals bounds the proposals one group holds.
const maxHeldProposals = 4096

// holdDuringTransfer keeps p, which raft refused, when the refusal is a
// leadership transfer in progress, or one that has just completed (raft
// stepped down on a message the worker handled earlier in the same batch,
// before this replica's leadership flag caught up); false otherwise (the
// caller answers ErrProposalDropped).
func (g *group) holdDuringTransfer(p *proposal) bool {
	if len(g.held) >= maxHeldProposals {
		return false
	}
	if bs := g.rn.BasicStatus(); bs.LeadTransferee == 0 && bs.RaftState == raft.StateLeader {
		return false
	}
	if len(g.held) == 0 {
		g.heldSince = time.Now()
		g.shard.holding = append(g.shard.holding, g)
	}
	g.held = append(g.held, p)
	return true
}

// failHeld fails the held proposals (the host stops, the group halts or
// takes a recovery plan); a lost leadership answers them in releaseHeld.
func (g *group) failHeld(err error) {
	for _, p := range g.held {
		p.finish(nil, err)
	}
	g.held = nil
}

// releaseHeld answers or proposes again the proposals of the groups whose
// transfer is over. A group that lost its leadership waits until it knows
// the new leader, at most two election timeouts, so that its answer names
// one. It reports whether it proposed anything.
func (s *shard) releaseHeld() bool {
	if len(s.holding) == 0 {
		return false
	}
	cfg := s.h.cfg
	patience := 2 * time.Duration(cfg.ElectionTicks) * cfg.TickInterval
	proposed := false
	kept := s.holding[:0]
	for _, g := range s.holding {
		switch {
		case len(g.held) == 0:
			continue // failed meanwhile (failHeld)
		case g.isLeader && g.rn.BasicStatus().LeadTransferee != 0,
			!g.isLeader && g.leader == 0 && time.Since(g.heldSince) < patience:
			kept = append(kept, g)
			continue
		}
		held := g.held
		g.held = nil
		for _, p := range held {
			if !g.isLeader {
				p.finish(nil, &NotLeaderError{LeaderID: g.leader})
				continue
			}
			if err := g.rn.Propose(p.data); err != nil {
				p.finish(nil, fmt.Errorf("%w: %v", ErrProposalDropped, err))
				continue
			}
			g.pending[p.id] = p
			proposed = true
		}
	}
	clear(s.holding[len(kept):])
	s.holding = kept
	return proposed
}
