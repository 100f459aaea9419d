package multiraft

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitHalted waits (on status changes, never a sleep) until group g is
// halted on h.
func waitHalted(tb testing.TB, h *Host, g uint32) GroupStatus {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		changed := h.StatusChanged()
		if st := h.Status(g); st.Halted != nil {
			return st
		}
		select {
		case <-changed:
		case <-ctx.Done():
			tb.Fatalf("group %d not halted: %+v", g, h.Status(g))
		}
	}
}

// TestHaltingEntryHaltsOnlyItsGroup: an entry whose Apply error asks to
// halt the group (HaltGroup) freezes that group on this node, unapplied,
// while the node and its other groups go on; a restart halts it again at
// the same entry instead of applying past it; under either fsync mode.
func TestHaltingEntryHaltsOnlyItsGroup(t *testing.T) {
	for _, fsync := range []string{FsyncNever, FsyncAlways} {
		t.Run(fsync, func(t *testing.T) { testHaltingEntry(t, fsync) })
	}
}

func testHaltingEntry(t *testing.T, fsync string) {
	cfg := baseConfig(t.TempDir())
	cfg.Fsync = fsync
	n := startNode(t, cfg, nil)
	ctx := t.Context()
	waitReady(t, n.h)
	if _, err := n.h.Propose(ctx, 1, u64(7)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.Propose(ctx, 1, haltEntry); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Propose of a halting entry = %v, want ErrOutcomeUnknown", err)
	}
	st := waitHalted(t, n.h, 1)
	var he *haltError
	if !errors.As(st.Halted, &he) || st.IsLeader || st.LeaderID != 0 {
		t.Fatalf("status of the halted group: halted %v, leader %v/%d; want the state machine's error and no leader", st.Halted, st.IsLeader, st.LeaderID)
	}
	if got := n.h.Halted(); len(got) != 1 || got[1] == nil {
		t.Fatalf("Halted() = %v, want group 1 only", got)
	}
	if _, err := n.h.Propose(ctx, 1, u64(1)); !errors.Is(err, ErrGroupHalted) {
		t.Fatalf("Propose to a halted group = %v, want ErrGroupHalted", err)
	}
	if _, err := n.h.ReadIndex(ctx, 1); !errors.Is(err, ErrGroupHalted) {
		t.Fatalf("ReadIndex of a halted group = %v, want ErrGroupHalted", err)
	}
	if _, err := n.h.Propose(ctx, 2, u64(5)); err != nil {
		t.Fatalf("another group after the halt: %v", err)
	}
	select {
	case err := <-n.done:
		t.Fatalf("Run returned %v after a halt; the node must go on", err)
	default:
	}
	if sum, _ := n.sms[1].state(); sum != 7 {
		t.Fatalf("halted group's sum %d, want 7 (nothing applied past the halting entry)", sum)
	}
	applied := n.h.Status(1).Applied

	n.stop(t)
	again := startNode(t, cfg, nil)
	st = waitHalted(t, again.h, 1)
	if !errors.As(st.Halted, &he) || st.Applied != applied {
		t.Fatalf("after a restart: halted %v at applied %d, want the same halt at %d", st.Halted, st.Applied, applied)
	}
	if sum, _ := again.sms[1].state(); sum != 7 {
		t.Fatalf("halted group's sum %d after a restart, want 7", sum)
	}
	if _, err := again.h.Propose(ctx, 2, u64(5)); err != nil {
		t.Fatalf("another group after the restart: %v", err)
	}
}
