package multiraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"go.etcd.io/raft/v3"
)

// Linearizable reads use Raft's ReadIndex (raft.ReadOnlySafe): the leader
// notes its commit index, and a heartbeat round answered by a quorum
// proves that no other leader could have committed anything newer when
// the read arrived; the read is then served once the state machine has
// applied that index. No clock is trusted, unlike a leader lease, so a
// leader cut off from its quorum answers nothing until it steps down.
//
// Readers of one group share rounds: at most one raft ReadIndex request
// per group is in flight, and it answers every reader that had arrived
// before it was issued. Readers arriving while it is in flight queue for
// the next round, which starts as soon as the current one ends. Raft
// drops a request silently when its node loses leadership or its term
// changes, so the worker ends the rounds itself then: readers fail with
// *NotLeaderError once the node no longer leads, and a round lost to a
// new term of the same leader is issued again. A group whose only voter
// is this node answers at once: no other node can lead it.

// ErrTooManyReads is returned when MaxReadWaiters readers of a group
// already wait for a read index; the caller may retry.
var ErrTooManyReads = errors.New("multiraft: too many reads waiting for a read index")

// readWaiter is one ReadIndex caller.
type readWaiter struct {
	// abandoned is set when the caller stopped waiting (its context
	// ended); the worker then drops it before the next round.
	abandoned atomic.Bool
	done      chan readResult // buffered: the worker never blocks on it
}

type readResult struct {
	index uint64
	err   error
}

func (w *readWaiter) finish(index uint64, err error) { w.done <- readResult{index: index, err: err} }

func (w *readWaiter) gone() bool { return w.abandoned.Load() }

// readRound is a raft ReadIndex request in flight; id is its request
// context, unique per group.
type readRound struct {
	id      uint64
	term    uint64
	waiters []*readWaiter
}

// groupReads is a group's read state; the shard worker owns it.
type groupReads struct {
	queued   []*readWaiter
	inflight *readRound
	lastID   uint64
}

// ReadIndex returns a read index of the group: once this node's replica
// has applied it (WaitApplied), its state reflects every write
// acknowledged before ReadIndex was called. Only the group's leader
// answers: other nodes, and a leader that loses its leadership before a
// quorum confirmed it, fail with *NotLeaderError. It also fails with
// ErrTooManyReads, ErrStopped or ctx's error; a leader cut off from its
// quorum answers only when it steps down (CheckQuorum), so ctx bounds
// the wait.
func (h *Host) ReadIndex(ctx context.Context, groupID uint32) (uint64, error) {
	if int(groupID) >= len(h.groups) {
		return 0, fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	w := &readWaiter{done: make(chan readResult, 1)}
	if err := g.shard.enqueue(op{kind: opReadIndex, g: g, read: w}); err != nil {
		return 0, err
	}
	select {
	case r := <-w.done:
		return r.index, r.err
	case <-ctx.Done():
		w.abandoned.Store(true)
		return 0, ctx.Err()
	}
}

// addRead queues a reader for the group's next round (on the worker).
func (g *group) addRead(w *readWaiter) {
	g.shard.stats.readIndexReads.Add(1)
	if !g.isLeader {
		w.finish(0, &NotLeaderError{LeaderID: g.leader})
		return
	}
	if voters := g.cs.GetVoters(); len(g.cs.GetVotersOutgoing()) == 0 {
		switch self := g.shard.h.cfg.NodeID; {
		case !slices.Contains(voters, self):
			// Removed from the voters, raft keeps it leading until it steps
			// down, and would answer for a group of one other voter without
			// asking that voter.
			w.finish(0, &NotLeaderError{})
			return
		case len(voters) == 1:
			// The only voter needs no round: no other node can lead. Raft
			// would answer its commit index too, but only with the next
			// Ready, after that Ready's writes (and fsync). leaderSince
			// covers what the journal's commit index may not after a
			// restart.
			w.finish(max(g.rn.BasicStatus().GetCommit(), g.leaderSince), nil)
			return
		}
	}
	r := &g.reads
	if len(r.queued) >= g.shard.h.cfg.MaxReadWaiters {
		r.queued = slices.DeleteFunc(r.queued, (*readWaiter).gone)
		if len(r.queued) >= g.shard.h.cfg.MaxReadWaiters {
			w.finish(0, ErrTooManyReads)
			return
		}
	}
	r.queued = append(r.queued, w)
}

// startReadRound issues a raft ReadIndex request for the queued readers
// unless one is in flight (on the worker, between two Ready cycles).
func (g *group) startReadRound() {
	r := &g.reads
	if r.inflight != nil || len(r.queued) == 0 {
		return
	}
	if !g.isLeader {
		g.failReads(&NotLeaderError{LeaderID: g.leader})
		return
	}
	r.queued = slices.DeleteFunc(r.queued, (*readWaiter).gone)
	if len(r.queued) == 0 {
		return
	}
	r.lastID++
	r.inflight = &readRound{id: r.lastID, term: g.rn.BasicStatus().GetTerm(), waiters: r.queued}
	r.queued = nil
	g.shard.stats.readIndexRounds.Add(1)
	g.rn.ReadIndex(binary.LittleEndian.AppendUint64(nil, r.inflight.id))
}

// readsAfterReady ends the round a Ready answered, or that raft dropped
// because leadership or the term changed (after the Ready was applied and
// advanced, so that g.isLeader and g.leaderSince are current).
func (g *group) readsAfterReady(rd *raft.Ready) {
	r := &g.reads
	if !g.isLeader {
		if r.inflight != nil || len(r.queued) > 0 {
			g.failReads(&NotLeaderError{LeaderID: g.leader})
		}
		return
	}
	if r.inflight != nil && rd.HardState != nil && rd.HardState.GetTerm() != r.inflight.term {
		// Still the leader, in a new term: raft forgot the request. Its
		// readers arrived before the next round, so they may share it.
		r.queued = append(r.inflight.waiters, r.queued...)
		r.inflight = nil
		return
	}
	for _, rs := range rd.ReadStates {
		if r.inflight == nil || len(rs.RequestCtx) != 8 || binary.LittleEndian.Uint64(rs.RequestCtx) != r.inflight.id {
			continue // an older round's answer
		}
		// Raft answers a leader whose new term's first entry has not
		// committed yet only once it has (leaderSince is then covered);
		// the max keeps that true whatever raft does.
		index := max(rs.Index, g.leaderSince)
		for _, w := range r.inflight.waiters {
			w.finish(index, nil)
		}
		r.inflight = nil
	}
}

// failReads fails every reader of the group, in flight or queued.
func (g *group) failReads(err error) {
	r := &g.reads
	if r.inflight != nil {
		for _, w := range r.inflight.waiters {
			w.finish(0, err)
		}
		r.inflight = nil
	}
	for _, w := range r.queued {
		w.finish(0, err)
	}
	r.queued = nil
}
