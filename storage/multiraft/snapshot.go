package multiraft

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/storage/wal"
)

// A group's snapshot is taken in three steps, so that no shard worker
// waits on a disk for it (one snapshot used to stall every group of its
// shard for a file write, two fsyncs and a synced journal flush):
//
//  1. the shard worker captures the state machine at its applied index
//     (StateMachine.CaptureSnapshot: cheap, no I/O) and hands the capture
//     to the snapshot worker, at most one per group at a time;
//  2. the snapshot worker (one per host) encodes the capture and writes
//     the snapshot file durably (raftlog.SnapshotStore.Save), then reports
//     back through the shard's mailbox;
//  3. the shard worker records the snapshot marker in its journal (it
//     rides with the next write), compacts the group's in-memory log, and
//     remembers that the group's older snapshot files may go. They are
//     removed only after a synced flush made the marker durable (onTick),
//     and never while a snapshot of the group is in flight, so recovery
//     always finds the file its latest durable marker names. Journal
//     segments are purged only after a synced flush too (wal.Journal.Purge).
//
// A failed encoding is logged and skipped (the group keeps its last
// snapshot); a failed file write stops the node like a failed journal
// write.

// snapshotJob is a captured snapshot on its way to the snapshot worker.
type snapshotJob struct {
	g      *group
	index  uint64
	term   uint64
	cs     *pb.ConfState
	encode func(buf []byte) ([]byte, error)
}

// snapshotDone is the snapshot worker's report of a job.
type snapshotDone struct {
	index uint64
	term  uint64
	cs    *pb.ConfState
	bytes int
	took  time.Duration
	// encodeErr: the state machine could not encode (not fatal).
	encodeErr error
	// err: the file could not be written (fatal).
	err error
}

// snapshotBufferKeep is the largest encoding buffer the snapshot worker
// keeps for the next snapshot. A node of many idle streams snapshots its
// groups one after another, each a few megabytes: at a million streams
// allocating each encoding anew was a tenth of the node's allocations. A
// group holding much unflushed data has a larger snapshot, whose buffer
// is not worth keeping in memory between snapshots.
const snapshotBufferKeep = 8 << 20

// snapshotWorker encodes and writes captured snapshots until the shard
// workers are gone (the channel closes). Once ctx ends it drops what is
// left: the node is stopping and its groups keep their last snapshot.
func (h *Host) snapshotWorker(ctx context.Context) {
	var buf []byte
	for job := range h.snapshots {
		if ctx.Err() != nil {
			continue
		}
		done := &snapshotDone{index: job.index, term: job.term, cs: job.cs}
		start := time.Now()
		data, err := job.encode(buf)
		if err != nil {
			done.encodeErr = err
		} else {
			snap := &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{Index: new(job.index), Term: new(job.term), ConfState: job.cs}}
			if err := h.snaps.Save(job.g.id, snap); err != nil {
				done.err = fmt.Errorf("multiraft: group %d: %w", job.g.id, err)
			}
			done.bytes = len(data)
		}
		// The file write keeps nothing of data: its buffer serves the next
		// encoding.
		if buf = nil; cap(data) <= snapshotBufferKeep {
			buf = data[:0]
		}
		done.took = time.Since(start)
		// A stopping shard refuses the report; the file is harmless.
		_ = job.g.shard.enqueue(op{kind: opSnapshotDone, g: job.g, snap: done})
	}
}

// startSnapshot captures g at its applied index and hands the capture to
// the snapshot worker, unless one is in flight or g has a snapshot there.
func (s *shard) startSnapshot(g *group) error {
	if g.snapshotting || g.applied <= g.snapIndex {
		return nil
	}
	index := g.applied
	term, err := g.st.Term(index)
	if err != nil {
		return fmt.Errorf("multiraft: group %d: snapshot term at %d: %w", g.id, index, err)
	}
	start := time.Now()
	encode := g.sm.CaptureSnapshot()
	s.stats.snapshotCaptureNs.Add(uint64(time.Since(start)))
	g.snapshotting = true
	g.sinceSnapEntries, g.sinceSnapBytes = 0, 0
	s.h.snapshots <- snapshotJob{g: g, index: index, term: term, cs: proto.CloneOf(g.cs), encode: encode}
	return nil
}

// snapshotDone installs a written snapshot (step 3 above). It returns a
// fatal error when the file could not be written.
func (s *shard) snapshotDone(g *group, d *snapshotDone) error {
	g.snapshotting = false
	s.stats.snapshotNs.Add(uint64(d.took))
	switch {
	case d.err != nil:
		g.finishSnapshotWaiters(0, d.err)
		return d.err
	case d.encodeErr != nil:
		g.logger.Error("state machine snapshot failed", "index", d.index, "err", d.encodeErr)
		g.finishSnapshotWaiters(0, fmt.Errorf("%w: group %d: %v", ErrSnapshotFailed, g.id, d.encodeErr))
		return nil
	case d.index > g.snapIndex:
		// Otherwise a snapshot from the leader, installed meanwhile, covers
		// it; its file goes with the next retention.
		if err := g.st.Compact(d.index, d.cs); err != nil {
			return fmt.Errorf("multiraft: %w", err)
		}
		s.journal.SetSnapshot(g.id, wal.SnapshotMarker{Index: d.index, Term: d.term, ConfState: d.cs})
		g.snapIndex = d.index
		s.stats.snapshots.Add(1)
		s.stats.snapshotBytes.Add(uint64(d.bytes))
		g.logger.Debug("took snapshot", "index", d.index, "term", d.term, "bytes", d.bytes)
	}
	s.retainLater(g)
	g.updateStatus()
	return s.serveSnapshotWaiters(g)
}

// requestSnapshot is an operator's request (Host.Snapshot): it completes
// once g holds a snapshot of everything it had applied when asked.
func (s *shard) requestSnapshot(g *group, req *logRequest) error {
	req.want = g.applied
	if g.snapIndex >= req.want {
		req.finish(g.snapIndex, nil)
		return nil
	}
	g.snapWaiters = append(g.snapWaiters, req)
	return s.startSnapshot(g)
}

// serveSnapshotWaiters answers the requests g's snapshot now satisfies and
// starts another snapshot for those it does not (they asked after the one
// in flight was captured).
func (s *shard) serveSnapshotWaiters(g *group) error {
	kept := g.snapWaiters[:0]
	for _, req := range g.snapWaiters {
		if g.snapIndex >= req.want {
			req.finish(g.snapIndex, nil)
		} else {
			kept = append(kept, req)
		}
	}
	clear(g.snapWaiters[len(kept):])
	g.snapWaiters = kept
	if len(kept) > 0 {
		return s.startSnapshot(g)
	}
	return nil
}

func (g *group) finishSnapshotWaiters(index uint64, err error) {
	for _, req := range g.snapWaiters {
		req.finish(index, err)
	}
	g.snapWaiters = nil
}

// retainLater marks g's older snapshot files for removal once a synced
// flush made its latest marker durable.
func (s *shard) retainLater(g *group) {
	if !g.retainPending {
		g.retainPending = true
		s.retain = append(s.retain, g)
	}
}

// retainSnapshots removes the older snapshot files of the groups whose
// latest marker is durable now: it makes the journal durable first. A
// group with a snapshot in flight waits for the next round (its file may
// be being written).
func (s *shard) retainSnapshots() error {
	if len(s.retain) == 0 {
		return nil
	}
	if err := s.journal.Flush(true); err != nil {
		return fmt.Errorf("multiraft: shard %d: %w", s.id, err)
	}
	kept := s.retain[:0]
	for _, g := range s.retain {
		if g.snapshotting {
			kept = append(kept, g)
			continue
		}
		g.retainPending = false
		if err := s.h.snaps.Retain(g.id, g.st.SnapshotTerm(), g.st.SnapshotIndex()); err != nil {
			g.logger.Warn("cannot remove old snapshots", "err", err)
		}
	}
	clear(s.retain[len(kept):])
	s.retain = kept
	return nil
}
