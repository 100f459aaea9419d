package multiraft

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors of the operator's snapshot and log purge requests.
var (
	// ErrNotStarted is returned when the group's shard worker did not get
	// to a request within its start bound; nothing was done, and the
	// request may be sent again.
	ErrNotStarted = errors.New("multiraft: request not started in time")
	// ErrSnapshotFailed is returned when the state machine could not encode
	// a snapshot (the worker logged why); the group keeps its last one.
	ErrSnapshotFailed = errors.New("multiraft: state machine snapshot failed")
)

// Snapshot makes the group hold a snapshot of everything it had applied
// when the request arrived and returns that snapshot's index (at least the
// applied index then; 0 for a group that applied nothing). The group's
// shard worker runs it between two Ready cycles, exactly as its own
// snapshots: file, journal marker (synced), log compaction, journal purge.
//
// The request waits in the worker's mailbox behind whatever the worker is
// doing (another group's snapshot, a batch). When the worker has not
// started it within startWithin (> 0), it is dropped and Snapshot returns
// ErrNotStarted. Once started it runs to the end; Snapshot waits for it
// unless ctx ends first.
func (h *Host) Snapshot(ctx context.Context, groupID uint32, startWithin time.Duration) (uint64, error) {
	return h.logRequest(ctx, opSnapshot, groupID, 0, startWithin)
}

// PurgeLog purges the group's log through upto, at most through its latest
// snapshot, and returns the index it purged through: min(upto, snapshot
// index). The group's log never holds an entry at or below that index
// afterwards, and the journal segments holding only such entries (of this
// group and the others of its shard) are deleted. It runs on the group's
// shard worker with the same start bound as Snapshot, so it never overlaps
// a snapshot of the group.
func (h *Host) PurgeLog(ctx context.Context, groupID uint32, upto uint64, startWithin time.Duration) (uint64, error) {
	return h.logRequest(ctx, opPurgeLog, groupID, upto, startWithin)
}

func (h *Host) logRequest(ctx context.Context, kind opKind, groupID uint32, upto uint64, startWithin time.Duration) (uint64, error) {
	if int(groupID) >= len(h.groups) {
		return 0, fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	req := &logRequest{upto: upto, done: make(chan logResult, 1)}
	if err := g.shard.enqueue(op{kind: kind, g: g, req: req}); err != nil {
		return 0, err
	}
	var timeout <-chan time.Time
	if startWithin > 0 {
		t := time.NewTimer(startWithin)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case r := <-req.done:
			return r.index, r.err
		case <-timeout:
			if req.state.CompareAndSwap(reqPending, reqAbandoned) {
				return 0, fmt.Errorf("%w: group %d: its shard worker is busy", ErrNotStarted, groupID)
			}
			timeout = nil // started: wait for its result
		case <-ctx.Done():
			req.state.CompareAndSwap(reqPending, reqAbandoned)
			return 0, ctx.Err()
		}
	}
}
