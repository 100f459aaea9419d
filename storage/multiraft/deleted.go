package multiraft

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// The deleted-data bound (Config.DeletedDataMaxAge, "the bound"): once a
// replica applies an entry that removes streams from its group, their
// records leave its current snapshot, its in-memory log and its journal's
// files within the bound. The snapshot driver (drive, on each shard
// worker, at most once per Config.DriveInterval) enforces it in two steps:
//
//  1. A group that owes a removal takes a snapshot a quarter of the bound
//     after the replica applied it (at once for a removal it applied again
//     while replaying its log at startup: it may have applied it before
//     the restart). Removed bytes also count toward the group's next
//     snapshot, so a large removal is snapshotted sooner. The snapshot
//     compacts the in-memory log; older snapshot files go once its marker
//     is durable (retainSnapshots).
//  2. Journal segments that have held purged entries (entries at or below
//     their group's snapshot) for a quarter of the bound are freed: the
//     active one is sealed if it is among them, the groups whose live
//     entries keep them get their whole live log copied into the newest
//     segment (wal.Journal.RewriteEntries), an eighth of a segment per
//     pass at most, and the segments are deleted (wal.Journal.Purge). A
//     group that keeps more than a quarter of a segment there (lagging) is
//     snapshotted instead when it applied entries since its snapshot.
//
// A removal is reported by the state machine (Remover) after each applied
// batch. A group's erasure is done once a snapshot covers its newest
// removal, its older snapshot files are gone and no segment holds its
// entries at or below that snapshot.

// Remover is implemented by state machines that remove data: the host
// asks after each applied batch what it removed since the last call.
type Remover interface {
	// TakeRemoved returns the number of removals applied since the last
	// call and the bytes they removed.
	TakeRemoved() (removals int, bytes uint64)
}

// Erasure states of DeletedData.
const (
	// ErasureOwed: the replica applied a removal no snapshot covers yet.
	ErasureOwed = "owed"
	// ErasureReplayed: as owed, for a removal the replica applied again
	// while replaying its log at startup; it is due at once.
	ErasureReplayed = "replayed"
	// ErasurePurging: a snapshot covers the removal; older snapshot files
	// or journal segments still hold its entries.
	ErasurePurging = "purging"
)

// erasure is the deleted data one group's replica still holds (shard
// worker only).
type erasure struct {
	// since is when the replica first applied a removal not yet erased.
	since time.Time
	// index is the newest removal's log index: a snapshot at or above it
	// covers every removal counted here.
	index uint64
	bytes uint64
	// replayed: applied again while replaying the log at startup.
	replayed bool
	// purgeIndex is the snapshot that covers the removals, 0 until taken.
	purgeIndex uint64
}

// DeletedData is one group's deleted data this replica still holds.
type DeletedData struct {
	Group      uint32 `json:"group"`
	State      string `json:"state"`
	Bytes      uint64 `json:"bytes"`
	AgeMs      int64  `json:"age_ms"`
	PurgeIndex uint64 `json:"purge_index"`
	// Since is when the replica applied the oldest removal not yet erased.
	Since time.Time `json:"-"`
}

// ErasureStats are the host's deleted-data gauges.
type ErasureStats struct {
	// Enforced is false when the snapshot driver does not run
	// (DriveInterval < 0): nothing enforces the bound and the gauges stay 0.
	Enforced bool
	// MaxAge is the bound.
	MaxAge time.Duration
	// Groups lists every group that still holds deleted data.
	Groups []DeletedData
	// OldestAgeMs is the age of the oldest removal not yet erased, and
	// OverdueGroups the groups whose removals are older than the bound.
	OldestAgeMs   int64
	OverdueGroups int
	// LaggingGroups are the groups whose live log in segments due to be
	// freed is over a quarter of a segment, as the latest pass that found
	// any did, within the last quarter of the bound (a pass lasts
	// milliseconds: the gauge holds long enough for a scrape to see it).
	LaggingGroups int
	// DriverPasses counts the driver's passes over every shard.
	DriverPasses uint64
}

// erasureView is a shard's view of its erasures, published by the driver
// for metrics.
type erasureView struct {
	mu        sync.Mutex
	groups    []DeletedData
	lagging   int
	laggingAt time.Time
	passes    uint64
}

// Erasure returns the deleted-data gauges, ages as of now.
func (h *Host) Erasure() ErasureStats {
	st := ErasureStats{Enforced: h.cfg.DriveInterval > 0, MaxAge: h.cfg.DeletedDataMaxAge}
	if !st.Enforced {
		return st
	}
	now := h.cfg.Now()
	for _, s := range h.shards {
		s.erasures.mu.Lock()
		for _, d := range s.erasures.groups {
			d.AgeMs = now.Sub(d.Since).Milliseconds()
			st.Groups = append(st.Groups, d)
			st.OldestAgeMs = max(st.OldestAgeMs, d.AgeMs)
			if now.Sub(d.Since) > h.cfg.DeletedDataMaxAge {
				st.OverdueGroups++
			}
		}
		st.LaggingGroups += s.erasures.lagging
		st.DriverPasses += s.erasures.passes
		s.erasures.mu.Unlock()
	}
	slices.SortFunc(st.Groups, func(a, b DeletedData) int { return int(a.Group) - int(b.Group) })
	return st
}

// noteRemovals records what g's state machine removed in the entry it
// just applied at index (the log replayed through replayThrough at
// startup).
func (g *group) noteRemovals(index uint64) {
	if g.remover == nil {
		return
	}
	n, bytes := g.remover.TakeRemoved()
	if n == 0 {
		return
	}
	// Removed bytes leave the next snapshot smaller: they count toward it.
	g.sinceSnapBytes += bytes
	replayed := index <= g.replayThrough
	if g.owed == nil {
		g.owed = &erasure{since: g.shard.h.cfg.Now()}
	}
	e := g.owed
	e.index = index
	e.bytes += bytes
	e.replayed = e.replayed || replayed
	e.purgeIndex = 0 // a snapshot must cover the new removal too
	// Readers (a purge's report) see the removal at once, not at the
	// driver's next pass.
	g.shard.publishErasures()
}

// drive is the snapshot driver's pass over the shard (see the top of this
// file). It runs on the shard worker.
func (s *shard) drive(now time.Time) error {
	cfg := s.h.cfg
	quarter := cfg.DeletedDataMaxAge / 4
	for _, g := range s.groups {
		e := g.owed
		if e == nil {
			continue
		}
		if e.purgeIndex == 0 && g.snapIndex >= e.index {
			e.purgeIndex = g.snapIndex
		}
		if e.purgeIndex == 0 {
			if (e.replayed || now.Sub(e.since) >= quarter) && !g.snapshotting && g.halted == nil {
				g.logger.Debug("snapshotting a group that owes a removal", "removal_index", e.index, "bytes", e.bytes)
				if err := s.startSnapshot(g); err != nil {
					return err
				}
			}
			continue
		}
		if !g.retainPending && !s.journal.HoldsThrough(g.id, e.purgeIndex) {
			g.logger.Debug("deleted data erased", "purge_index", e.purgeIndex, "bytes", e.bytes, "took", now.Sub(e.since))
			g.owed = nil
		}
	}
	lagging, err := s.freeSegments(now.Add(-quarter))
	if err != nil {
		return err
	}
	s.erasures.mu.Lock()
	if v := &s.erasures; lagging > 0 || now.Sub(v.laggingAt) >= quarter {
		v.lagging, v.laggingAt = lagging, now
	}
	s.erasures.passes++
	s.erasures.mu.Unlock()
	s.publishErasures()
	return nil
}

// freeSegments frees the journal segments that have held purged entries
// since before cutoff (step 2 at the top of this file) and returns the
// lagging groups it found.
func (s *shard) freeSegments(cutoff time.Time) (int, error) {
	through, ok := s.journal.DueThrough(cutoff)
	if !ok {
		return 0, nil
	}
	if err := s.journal.SealThrough(through); err != nil {
		return 0, fmt.Errorf("multiraft: shard %d: %w", s.id, err)
	}
	segBytes := uint64(s.h.cfg.SegmentBytes)
	budget, copied := segBytes/8, uint64(0)
	lagging := 0
	for _, id := range s.journal.LiveThrough(through) {
		g := s.h.groups[id]
		ents, size := g.st.LiveEntries()
		if size > segBytes/4 {
			lagging++
			// A halted group stays as it is: its live log is copied.
			if g.applied > g.snapIndex && g.halted == nil {
				if !g.snapshotting {
					g.logger.Debug("snapshotting a group whose live log keeps old wal segments", "live_bytes", size)
					if err := s.startSnapshot(g); err != nil {
						return lagging, err
					}
				}
				continue
			}
		}
		if copied > 0 && copied+size > budget {
			continue // the next pass copies it
		}
		copied += uint64(s.journal.RewriteEntries(id, ents))
	}
	return lagging, s.purge()
}

// publishErasures publishes the shard's erasures for metrics.
func (s *shard) publishErasures() {
	var out []DeletedData
	for _, g := range s.groups {
		e := g.owed
		if e == nil {
			continue
		}
		d := DeletedData{Group: g.id, State: ErasureOwed, Bytes: e.bytes, PurgeIndex: e.purgeIndex, Since: e.since}
		switch {
		case e.purgeIndex != 0:
			d.State = ErasurePurging
		case e.replayed:
			d.State = ErasureReplayed
		}
		out = append(out, d)
	}
	s.erasures.mu.Lock()
	s.erasures.groups = out
	s.erasures.mu.Unlock()
}
