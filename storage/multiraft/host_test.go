package multiraft

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/wal"
	"github.com/ursula/ursula/tests/await"
)

func TestProposeApplyRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := baseConfig(dir)
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)

	const perGroup = 200
	var wg sync.WaitGroup
	for g := range uint32(cfg.GroupCount) {
		for w := range 4 {
			wg.Go(func() {
				for i := range perGroup / 4 {
					if _, err := n.h.Propose(context.Background(), g, u64(uint64(w*1000+i+1))); err != nil {
						t.Errorf("Propose(group %d): %v", g, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	want := map[uint32][2]uint64{}
	for g, c := range n.sms {
		sum, count := c.state()
		if count != perGroup {
			t.Fatalf("group %d applied %d entries, want %d", g, count, perGroup)
		}
		want[g] = [2]uint64{sum, count}
	}
	n.stop(t)

	n2 := startNode(t, cfg, nil)
	waitReady(t, n2.h)
	for g, w := range want {
		await.True(t, fmt.Sprintf("group %d to replay to %v", g, w), func() bool {
			sum, count := n2.sms[g].state()
			return sum == w[0] && count == w[1]
		})
	}
	v, err := n2.h.Propose(context.Background(), 0, u64(5))
	if err != nil {
		t.Fatalf("Propose after restart: %v", err)
	}
	if v.(uint64) != want[0][0]+5 {
		t.Fatalf("result %v, want %d", v, want[0][0]+5)
	}
}

func TestSnapshotPurgeBoundsLog(t *testing.T) {
	dir := t.TempDir()
	cfg := baseConfig(dir)
	cfg.GroupCount, cfg.ShardCount = 3, 1
	cfg.SegmentBytes = 16 << 10
	cfg.SnapshotEntries = 100
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)

	payload := make([]byte, 100)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 250 {
				p := append(u64(uint64(w*1000+i)), payload...)
				if _, err := n.h.Propose(context.Background(), 0, p); err != nil {
					t.Errorf("Propose: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Group 1 and 2 are idle: their bootstrap entries must not pin the
	// first segment forever.
	logDir := wal.LogDir(dir)
	await.True(t, "wal purge", func() bool { return dirSize(t, logDir) < 6*cfg.SegmentBytes })
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "group-0000", "*.snap"))
	if len(snaps) > 2 {
		t.Fatalf("%d snapshot files kept, want at most 2", len(snaps))
	}
	sum, count := n.sms[0].state()
	if count != 2000 {
		t.Fatalf("applied %d, want 2000", count)
	}
	n.stop(t)

	n2 := startNode(t, cfg, nil)
	waitReady(t, n2.h)
	await.True(t, "restored state", func() bool {
		s, c := n2.sms[0].state()
		return s == sum && c == count
	})
	if st := n2.h.Status(0); st.Applied < 2000 || !st.IsLeader || st.LeaderID != 1 {
		t.Fatalf("status after restart: %+v", st)
	}
}

// blockingSM blocks in Apply on a payload of 0xff until released.
type blockingSM struct {
	counter
	entered chan struct{}
	release chan struct{}
}

func (b *blockingSM) Apply(index uint64, data []byte) (any, error) {
	if len(data) == 1 && data[0] == 0xff {
		b.entered <- struct{}{}
		<-b.release
		return nil, nil
	}
	return b.counter.Apply(index, data)
}

func TestFsyncAlwaysOncePerBatch(t *testing.T) {
	cfs := &countingFS{}
	cfg := baseConfig(t.TempDir())
	cfg.GroupCount, cfg.ShardCount = 2, 1
	cfg.Fsync = FsyncAlways
	cfg.FS = cfs
	cfg.TickInterval = time.Hour // no tick-driven writes during the test
	sm := &blockingSM{entered: make(chan struct{}), release: make(chan struct{})}
	h, err := New(cfg, func(g uint32) StateMachine {
		if g == 0 {
			return sm
		}
		return &counter{}
	}, nil, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitReady(t, h)

	// Park the worker inside Apply, queue proposals for both groups, then
	// let it go: all of them must share one write and one fsync.
	go func() { _, _ = h.Propose(context.Background(), 0, []byte{0xff}) }()
	<-sm.entered
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := h.Propose(context.Background(), uint32(i%2), u64(1)); err != nil {
				t.Errorf("Propose: %v", err)
			}
		})
	}
	s := h.shards[0]
	await.True(t, "queued proposals", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.inbox) == n
	})
	w0, s0 := cfs.writes.Load(), cfs.syncs.Load()
	sm.release <- struct{}{}
	wg.Wait()
	if got := cfs.syncs.Load() - s0; got != 1 {
		t.Fatalf("%d fsyncs for one batch of %d proposals, want 1", got, n)
	}
	if got := cfs.writes.Load() - w0; got != 1 {
		t.Fatalf("%d writes for one batch of %d proposals, want 1", got, n)
	}
	if err := h.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func TestProposeErrors(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	tests := []struct {
		name  string
		group uint32
		data  []byte
		want  error
	}{
		{"unknown group", 99, u64(1), ErrUnknownGroup},
		{"empty", 0, nil, ErrEmptyProposal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := n.h.Propose(context.Background(), tt.group, tt.data); !errors.Is(err, tt.want) {
				t.Fatalf("Propose = %v, want %v", err, tt.want)
			}
		})
	}
	n.stop(t)
	if _, err := n.h.Propose(context.Background(), 0, u64(1)); !errors.Is(err, ErrStopped) {
		t.Fatalf("Propose after stop = %v, want ErrStopped", err)
	}
	if err := n.h.Sync(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Sync after stop = %v, want ErrStopped", err)
	}
}

func TestProposeEncoded(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	errEncode := errors.New("encode failed")
	tests := []struct {
		name    string
		group   uint32
		hint    int
		encode  func(dst []byte) ([]byte, error)
		wantErr error
		wantSum uint64
	}{
		{"appends to dst", 1, 8, func(dst []byte) ([]byte, error) { return append(dst, u64(5)...), nil }, nil, 5},
		{"beyond the size hint", 1, 0, func(dst []byte) ([]byte, error) { return append(dst, u64(7)...), nil }, nil, 12},
		{"encode error proposes nothing", 1, 8, func([]byte) ([]byte, error) { return nil, errEncode }, errEncode, 0},
		{"nothing encoded", 1, 8, func(dst []byte) ([]byte, error) { return dst, nil }, ErrEmptyProposal, 0},
		{"unknown group", 99, 8, func(dst []byte) ([]byte, error) { return append(dst, u64(1)...), nil }, ErrUnknownGroup, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := n.h.ProposeEncoded(t.Context(), tt.group, tt.hint, tt.encode)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ProposeEncoded = %v, want %v", err, tt.wantErr)
			}
			if err == nil && v.(uint64) != tt.wantSum {
				t.Fatalf("applied sum %d, want %d", v, tt.wantSum)
			}
		})
	}
	if sum, count := n.sms[1].state(); sum != 12 || count != 2 {
		t.Fatalf("group 1 applied sum %d over %d entries, want 12 over 2 (failed encodings propose nothing)", sum, count)
	}
}

func TestTopologyMismatchRefuses(t *testing.T) {
	dir := t.TempDir()
	cfg := baseConfig(dir)
	n := newNode(t, cfg, nil)
	if err := n.h.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ShardCount = 3
	if _, err := New(cfg, func(uint32) StateMachine { return &counter{} }, nil, nil); !errors.Is(err, wal.ErrTopologyMismatch) {
		t.Fatalf("New = %v, want ErrTopologyMismatch", err)
	}
}

func TestFsyncFailureStopsNode(t *testing.T) {
	cfs := &countingFS{}
	cfg := baseConfig(t.TempDir())
	cfg.Fsync = FsyncAlways
	cfg.FS = cfs
	h, err := New(cfg, func(uint32) StateMachine { return &counter{} }, nil, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(context.Background()) }()
	waitReady(t, h)
	cfs.failSync.Store(true)
	if _, err := h.Propose(context.Background(), 0, u64(1)); !errors.Is(err, ErrStopped) {
		t.Fatalf("Propose during a failed fsync = %v, want ErrStopped", err)
	}
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "injected fsync failure") {
		t.Fatalf("Run = %v, want the fsync failure", err)
	}
	// The failed journal may have lost writes the page cache was to
	// keep: the next start on this boot must not take it for a crash of
	// the process alone.
	if got := wal.ReadRunning(wal.OSFS{}, wal.LogDir(cfg.Dir)); got != "" {
		t.Fatalf("running record after a journal failure names boot %q, want none", got)
	}
}

// TestNoTickNeeded runs with ticks effectively disabled: a single voter must
// elect itself, commit and apply, and do so again after a restart, without
// waiting for any tick.
func TestNoTickNeeded(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	cfg.TickInterval = time.Hour
	cfg.SnapshotEntries = 3
	for round := range 3 {
		n := startNode(t, cfg, nil)
		waitReady(t, n.h)
		for g := range uint32(cfg.GroupCount) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			v, err := n.h.Propose(ctx, g, u64(1))
			cancel()
			if err != nil {
				t.Fatalf("round %d group %d: Propose: %v", round, g, err)
			}
			if v.(uint64) != uint64(round+1) {
				t.Fatalf("round %d group %d: sum %v, want %d", round, g, v, round+1)
			}
		}
		n.stop(t)
	}
}

// TestUnappliableEntryStopsTheNode: an entry the state machine cannot
// apply (a newer release's command) stops the node instead of being
// skipped, and stops it again at every restart: the applied index never
// moves past it.
func TestUnappliableEntryStopsTheNode(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	n := newNode(t, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.h.Run(ctx) }()
	waitReady(t, n.h)
	if _, err := n.h.Propose(ctx, 1, u64(7)); err != nil {
		t.Fatal(err)
	}
	applied := n.h.Status(1).Applied
	if _, err := n.h.Propose(ctx, 1, unknownEntry); !errors.Is(err, ErrStopped) {
		t.Fatalf("Propose of an unappliable entry = %v, want ErrStopped", err)
	}
	if err := <-done; !errors.Is(err, ErrApply) || !errors.Is(err, errUnknownEntry) {
		t.Fatalf("Run = %v, want ErrApply wrapping the state machine's error", err)
	}
	if sum, _ := n.sms[1].state(); sum != 7 {
		t.Fatalf("sum %d after the refused entry, want 7", sum)
	}

	again := newNode(t, cfg, nil)
	if got := again.h.Status(1).Applied; got > applied {
		t.Fatalf("restart recovered applied index %d, past %d before the refused entry", got, applied)
	}
	if err := again.h.Run(context.Background()); !errors.Is(err, ErrApply) {
		t.Fatalf("Run after a restart = %v, want ErrApply again", err)
	}
}

// TestWaitApplied: waiters are released by the apply that reaches their
// index, not by polling; ctx and a stop end a wait.
func TestWaitApplied(t *testing.T) {
	n := startNode(t, baseConfig(t.TempDir()), nil)
	waitReady(t, n.h)
	ctx := t.Context()
	// A new leader's own entry may still be on its way when the group is
	// ready: wait until the group has applied all it holds, so that the
	// next index is the proposal's below and nothing else's.
	await.True(t, "group 2 to apply all it holds", func() bool {
		st := n.h.Status(2)
		return st.IsLeader && st.Applied == st.LastIndex && st.Commit == st.LastIndex
	})
	next := n.h.Status(2).Applied + 1
	released := make(chan error, 1)
	go func() { released <- n.h.WaitApplied(ctx, 2, next) }()
	select {
	case err := <-released:
		t.Fatalf("WaitApplied returned %v before index %d was applied", err, next)
	default:
	}
	if _, err := n.h.Propose(ctx, 2, u64(1)); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("WaitApplied = %v", err)
	}
	if err := n.h.WaitApplied(ctx, 2, 1); err != nil {
		t.Fatalf("WaitApplied of an applied index = %v", err)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := n.h.WaitApplied(short, 2, 1<<40); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitApplied with a cancelled ctx = %v", err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- n.h.WaitApplied(ctx, 2, 1<<40) }()
	n.stop(t)
	if err := <-stopped; !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitApplied across a stop = %v, want ErrStopped", err)
	}
}

// slowSnapshotSM encodes its snapshots only when released: a shard worker
// that waited for a snapshot would stop applying.
type slowSnapshotSM struct {
	counter
	encoding chan struct{}
	release  chan struct{}
}

func (s *slowSnapshotSM) CaptureSnapshot() func([]byte) ([]byte, error) {
	encode := s.counter.CaptureSnapshot()
	return func(buf []byte) ([]byte, error) {
		s.encoding <- struct{}{}
		<-s.release
		return encode(buf)
	}
}

// TestSnapshotOffTheShardWorker: while one group's snapshot is being
// encoded and written, every group of its shard, that one included, keeps
// applying; the snapshot then installs, and an operator's request waits
// for it.
func TestSnapshotOffTheShardWorker(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	cfg.GroupCount, cfg.ShardCount = 2, 1
	cfg.SnapshotEntries = 1 << 30
	slow := &slowSnapshotSM{encoding: make(chan struct{}), release: make(chan struct{})}
	h, err := New(cfg, func(g uint32) StateMachine {
		if g == 0 {
			return slow
		}
		return &counter{}
	}, nil, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitReady(t, h)
	if _, err := h.Propose(ctx, 0, u64(1)); err != nil {
		t.Fatal(err)
	}
	snapped := make(chan uint64, 1)
	go func() {
		index, err := h.Snapshot(ctx, 0, time.Minute)
		if err != nil {
			t.Errorf("Snapshot: %v", err)
		}
		snapped <- index
	}()
	<-slow.encoding // the snapshot worker holds the capture
	for g := range uint32(2) {
		for range 10 {
			if _, err := h.Propose(ctx, g, u64(1)); err != nil {
				t.Fatalf("group %d while a snapshot is written: %v", g, err)
			}
		}
	}
	select {
	case index := <-snapped:
		t.Fatalf("Snapshot answered %d before the snapshot was written", index)
	default:
	}
	close(slow.release)
	index := <-snapped
	if st := h.Status(0); index == 0 || st.SnapshotIndex != index || st.Applied <= index {
		t.Fatalf("snapshot index %d, status %+v", index, st)
	}
}
