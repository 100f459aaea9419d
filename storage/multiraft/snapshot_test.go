package multiraft

import (
	"sync"
	"testing"

	"github.com/ursula/ursula/tests/await"
)

// TestOneCapturePerPass: groups that come due for a snapshot in the same
// pass of the shard worker are captured in different passes, so that the
// worker serves its other work (heartbeats above all) between two
// captures, each of which encodes a whole group.
func TestOneCapturePerPass(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	cfg.GroupCount, cfg.ShardCount = 4, 1
	cfg.SnapshotEntries = 1 // every applied entry makes its group due
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	s := n.h.shards[0]
	var mu sync.Mutex
	passes := map[uint64]int{} // the worker's pass: captures in it
	for g := range uint32(cfg.GroupCount) {
		n.sms[g].setCapture(func() {
			mu.Lock()
			passes[s.stats.readyBatches.Load()]++
			mu.Unlock()
		})
	}
	// Every group proposes at once, round after round, once no group is
	// snapshotting: most passes apply entries of several due groups.
	ctx := t.Context()
	for range 30 {
		await.True(t, "no snapshot in flight", func() bool {
			for g := range uint32(cfg.GroupCount) {
				busy := false
				if err := n.h.do(ctx, g, func(g *group) error { busy = g.snapshotting; return nil }); err != nil {
					t.Fatal(err)
				}
				if busy {
					return false
				}
			}
			return true
		})
		var wg sync.WaitGroup
		for g := range uint32(cfg.GroupCount) {
			wg.Go(func() {
				if _, err := n.h.Propose(ctx, g, u64(1)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	captures := 0
	for pass, c := range passes {
		if c > 1 {
			t.Fatalf("pass %d captured %d groups, want at most one", pass, c)
		}
		captures += c
	}
	if captures < 10 {
		t.Fatalf("%d captures in 120 proposals with a snapshot due after each: the test did not load the worker", captures)
	}
}
