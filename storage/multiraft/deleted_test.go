package multiraft

import (
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// TestDriverFreesSegments: once a segment has held purged entries for a
// quarter of the deleted-data bound, the snapshot driver frees it and the
// segments before it. A group whose live log there is over a quarter of a
// segment is reported lagging and snapshotted instead of copied; then no
// segment holds purged entries any more.
func TestDriverFreesSegments(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	cfg.SegmentBytes = 16 << 10
	cfg.SnapshotEntries, cfg.SnapshotBytes = 1<<20, 1<<30 // only the driver and requests snapshot
	cfg.MaxSegments = 1 << 10                             // and not the segment count
	cfg.DeletedDataMaxAge = 4 * time.Second
	cfg.DriveInterval = 20 * time.Millisecond
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	ctx := t.Context()
	// Groups 0 and 2 share shard 0. Group 2 writes a live log of several
	// KiB and never snapshots on its own; group 0 writes a little and is
	// snapshotted, which makes the segments hold purged entries.
	for i := range 600 {
		if _, err := n.h.Propose(ctx, 2, u64(uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if _, err := n.h.Propose(ctx, 0, u64(uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.h.Snapshot(ctx, 0, time.Second); err != nil {
		t.Fatal(err)
	}
	if n.h.Status(2).SnapshotIndex != 0 {
		t.Fatal("group 2 took a snapshot on its own: the test needs it not to")
	}
	wal := func() (dirty, segments uint64) {
		st := n.h.ShardStats()[0].WAL
		return st.DirtySegments, st.Segments
	}
	if dirty, _ := wal(); dirty == 0 {
		t.Fatal("no segment holds purged entries after group 0's snapshot")
	}
	lagging := 0
	await.True(t, "the driver to free every segment holding purged entries", func() bool {
		lagging = max(lagging, n.h.Erasure().LaggingGroups)
		dirty, _ := wal()
		return dirty == 0 && n.h.Status(2).SnapshotIndex > 0
	})
	if lagging == 0 {
		t.Error("group 2's live log kept the segments but was never reported lagging")
	}
	if _, segments := wal(); segments > 2 {
		t.Errorf("%d segments left after the driver freed them", segments)
	}
	// Everything applied comes back after a restart from what is left.
	sum0, count0 := n.sms[0].state()
	sum2, count2 := n.sms[2].state()
	n.stop(t)
	n = startNode(t, cfg, nil)
	waitReady(t, n.h)
	if s, c := n.sms[0].state(); s != sum0 || c != count0 {
		t.Errorf("group 0 after a restart: sum %d count %d, want %d %d", s, c, sum0, count0)
	}
	if s, c := n.sms[2].state(); s != sum2 || c != count2 {
		t.Errorf("group 2 after a restart: sum %d count %d, want %d %d", s, c, sum2, count2)
	}
}
