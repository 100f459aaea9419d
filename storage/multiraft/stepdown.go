package multiraft

import (
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// A leader that steps down keeps the proposals it had appended but not yet
// applied, instead of failing them at once with ErrOutcomeUnknown (a 503
// that a client may not retry blindly). When the leadership moved
// gracefully (the balancer, a drain, an operator's transfer), raft handed
// it only to a voter holding every entry of the old leader's log, so those
// entries commit in the new term and apply here as on every replica: the
// proposer gets its result as if nothing had happened.
//
// An orphaned proposal is settled exactly by the log. Raft never moves an
// entry to another index, so once this replica applied the index where the
// proposal was appended and the entry there was not the proposal's, it was
// not applied anywhere and never will be: the proposer gets NotLeaderError,
// which callers may retry at the leader. That holds as well when the
// entry was replaced before the step-down was seen (an election won by
// another replica): the index is recorded as the entry leaves this node.
// What the log cannot settle in orphanPatience (the group lost its quorum,
// a snapshot replaced the log, an entry replaced before it ever left this
// node) ends with ErrOutcomeUnknown, as before.

// indexPending records the log index of g's pending proposals among ents.
// The shard worker calls it with every Ready's entries while g has pending
// proposals, before persisting them: a proposal's index is known from the
// moment it can leave this node, even when a new leader's entries replace
// it before the step-down is seen (an election under load), which a look
// at the log after the step-down could no longer tell.
func (g *group) indexPending(ents []*pb.Entry) {
	if len(g.pending) == 0 {
		return
	}
	self := g.shard.h.cfg.NodeID
	for _, e := range ents {
		data := e.GetData()
		if e.GetType() != pb.EntryNormal || len(data) <= headerSize || data[0] != 1 ||
			binary.LittleEndian.Uint64(data[1:]) != self {
			continue
		}
		if p := g.pending[binary.LittleEndian.Uint64(data[9:])]; p != nil {
			p.index = e.GetIndex()
		}
	}
}

// orphan keeps g's pending proposals after it stepped down, rd being the
// step-down's Ready, and queues g on the shard's orphan sweep. A proposal
// appended and replaced within one Ready is in none of the Readies'
// entries, but may be in the messages that carried it to the followers.
func (g *group) orphan(rd *raft.Ready) {
	if len(g.pending) == 0 {
		return
	}
	for _, m := range rd.Messages {
		if m.GetType() == pb.MessageType_MsgApp {
			g.indexPending(m.GetEntries())
		}
	}
	for _, p := range g.pending {
		if !p.orphaned {
			p.orphaned = true
			g.orphans = append(g.orphans, p)
		}
	}
	g.orphanedSince = g.shard.h.cfg.Now()
	if !g.orphanQueued {
		g.orphanQueued = true
		g.shard.orphaned = append(g.shard.orphaned, g)
	}
}

// orphanPatience is how long an orphaned proposal may wait for the log to
// settle it: two election timeouts, time for a new leader to be elected
// and to commit its first entry.
func (s *shard) orphanPatience() time.Duration {
	return 2 * time.Duration(s.h.cfg.ElectionTicks) * s.h.cfg.TickInterval
}

// settleOrphans answers the orphaned proposals the log settled, and those
// that waited longer than orphanPatience.
func (s *shard) settleOrphans() {
	if len(s.orphaned) == 0 {
		return
	}
	now, patience := s.h.cfg.Now(), s.orphanPatience()
	kept := s.orphaned[:0]
	for _, g := range s.orphaned {
		if g.settleOrphans(now, patience) {
			kept = append(kept, g)
		} else {
			g.orphanQueued = false
		}
	}
	clear(s.orphaned[len(kept):])
	s.orphaned = kept
}

// settleOrphans settles g's orphaned proposals and reports whether some
// are still waiting.
func (g *group) settleOrphans(now time.Time, patience time.Duration) bool {
	expired := now.Sub(g.orphanedSince) >= patience
	kept := g.orphans[:0]
	for _, p := range g.orphans {
		if g.pending[p.id] != p {
			continue // applied (answered), or failed meanwhile
		}
		switch {
		case p.index != 0 && p.index <= g.applied && p.index > g.restoredThrough:
			// The entry applied at p.index was another one.
			delete(g.pending, p.id)
			p.finish(nil, &NotLeaderError{LeaderID: g.leader})
		case expired || p.index != 0 && p.index <= g.restoredThrough:
			// Still in doubt, or covered by a snapshot from the leader
			// (it may hold the entry's effect).
			delete(g.pending, p.id)
			p.finish(nil, ErrOutcomeUnknown)
		default:
			kept = append(kept, p)
		}
	}
	clear(g.orphans[len(kept):])
	g.orphans = kept
	return len(kept) > 0
}
