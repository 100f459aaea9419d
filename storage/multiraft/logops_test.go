package multiraft

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// firstIndex reads the group's first log index on its shard worker.
func firstIndex(tb testing.TB, h *Host, g uint32) uint64 {
	tb.Helper()
	var first uint64
	if err := h.do(tb.Context(), g, func(g *group) error {
		var err error
		first, err = g.st.FirstIndex()
		return err
	}); err != nil {
		tb.Fatalf("first index of group %d: %v", g, err)
	}
	return first
}

func TestSnapshotAndPurgeOnRequest(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	ctx := t.Context()
	for i := range 20 {
		if _, err := n.h.Propose(ctx, 1, u64(uint64(i+1))); err != nil {
			t.Fatalf("Propose: %v", err)
		}
	}
	// Status is published after the proposers are answered: wait until it
	// shows the last proposal applied.
	n.sms[1].mu.Lock()
	last := n.sms[1].last
	n.sms[1].mu.Unlock()
	await.True(t, "the status to show the last proposal", func() bool { return n.h.Status(1).Applied >= last })
	applied := n.h.Status(1).Applied
	if got := n.h.Status(1).SnapshotIndex; got >= applied {
		t.Fatalf("group 1 already has a snapshot at %d (applied %d): raise SnapshotEntries", got, applied)
	}
	if got, err := n.h.PurgeLog(ctx, 1, 1000, time.Second); err != nil || got != 0 {
		t.Fatalf("PurgeLog before any snapshot = %d, %v; want 0 (nothing to purge through)", got, err)
	}

	steps := []struct {
		name string
		run  func() (uint64, error)
		want uint64
	}{
		{"snapshot of everything applied", func() (uint64, error) { return n.h.Snapshot(ctx, 1, time.Second) }, applied},
		{"snapshot again without new entries", func() (uint64, error) { return n.h.Snapshot(ctx, 1, time.Second) }, applied},
		{"purge below the snapshot", func() (uint64, error) { return n.h.PurgeLog(ctx, 1, 3, time.Second) }, 3},
		{"purge bounded by the snapshot", func() (uint64, error) { return n.h.PurgeLog(ctx, 1, 1<<40, time.Second) }, applied},
		{"purge through index 0", func() (uint64, error) { return n.h.PurgeLog(ctx, 2, 0, time.Second) }, 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			got, err := st.run()
			if err != nil || got != st.want {
				t.Fatalf("answer %d, %v; want %d", got, err, st.want)
			}
		})
	}
	if st := n.h.Status(1); st.SnapshotIndex != applied {
		t.Errorf("status snapshot index %d, want %d", st.SnapshotIndex, applied)
	}
	if first := firstIndex(t, n.h, 1); first != applied+1 {
		t.Errorf("first log index %d after the purge, want %d", first, applied+1)
	}
	if _, err := n.h.Snapshot(ctx, uint32(cfg.GroupCount), time.Second); !errors.Is(err, ErrUnknownGroup) {
		t.Errorf("Snapshot of an unknown group: %v, want ErrUnknownGroup", err)
	}

	// The state comes back from the requested snapshot after a restart.
	sum, count := n.sms[1].state()
	n.stop(t)
	n2 := startNode(t, cfg, nil)
	waitReady(t, n2.h)
	if s, c := n2.sms[1].state(); s != sum || c != count {
		t.Fatalf("after restart: sum %d count %d, want %d %d", s, c, sum, count)
	}
	if st := n2.h.Status(1); st.SnapshotIndex != applied {
		t.Errorf("snapshot index after restart %d, want %d", st.SnapshotIndex, applied)
	}
}

// TestLogRequestNotStarted checks that a request the busy shard worker does
// not start within its bound is refused and never runs later.
func TestLogRequestNotStarted(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	cfg.ShardCount = 1
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	ctx := t.Context()
	for i := range 5 {
		if _, err := n.h.Propose(ctx, 0, u64(uint64(i+1))); err != nil {
			t.Fatalf("Propose: %v", err)
		}
	}
	before := n.h.Status(0).SnapshotIndex

	entered, release := make(chan struct{}), make(chan struct{})
	busy := make(chan error, 1)
	go func() {
		busy <- n.h.do(context.Background(), 1, func(*group) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	tests := []struct {
		name string
		run  func() (uint64, error)
	}{
		{"snapshot", func() (uint64, error) { return n.h.Snapshot(ctx, 0, 50*time.Millisecond) }},
		{"purge", func() (uint64, error) { return n.h.PurgeLog(ctx, 0, 100, 50*time.Millisecond) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.run(); !errors.Is(err, ErrNotStarted) {
				t.Fatalf("error %v, want ErrNotStarted", err)
			}
		})
	}
	close(release)
	if err := <-busy; err != nil {
		t.Fatalf("busy op: %v", err)
	}
	// A round trip through the worker: the abandoned requests were seen
	// and dropped by now.
	_ = firstIndex(t, n.h, 0)
	if got := n.h.Status(0).SnapshotIndex; got != before {
		t.Fatalf("an abandoned snapshot request ran: snapshot index %d, was %d", got, before)
	}
	if got, err := n.h.Snapshot(ctx, 0, time.Second); err != nil || got != n.h.Status(0).Applied {
		t.Fatalf("snapshot once the worker is free: %d, %v", got, err)
	}
}
