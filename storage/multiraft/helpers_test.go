package multiraft

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ursula/ursula/storage/wal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// counter is a toy state machine: every entry adds its u64 payload to sum.
type counter struct {
	mu    sync.Mutex
	sum   uint64
	count uint64
	last  uint64
	// probe, when set, runs first in each Apply of a counted entry, on
	// the shard worker (a test's look at the moment of applying).
	probe func(index uint64, data []byte)
	// capture, when set, runs in each CaptureSnapshot, on the shard
	// worker.
	capture func()
}

// setProbe installs a probe (nil removes it).
func (c *counter) setProbe(probe func(index uint64, data []byte)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probe = probe
}

// setCapture installs a capture hook (nil removes it).
func (c *counter) setCapture(capture func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capture = capture
}

// unknownEntry is an entry the counter cannot apply (as a state machine
// cannot apply a newer release's command).
var unknownEntry = []byte("from a newer release")

var errUnknownEntry = errors.New("counter: entry from a newer release")

// haltEntry is an entry the counter refuses with an error that halts its
// group (as a state machine refuses a feature level it does not know).
var haltEntry = []byte("raises the group past this build")

type haltError struct{ index uint64 }

func (e *haltError) Error() string {
	return fmt.Sprintf("counter: entry %d is past this build", e.index)
}
func (e *haltError) HaltGroup() bool { return true }

func (c *counter) Apply(index uint64, data []byte) (any, error) {
	if bytes.Equal(data, unknownEntry) {
		return nil, errUnknownEntry
	}
	if bytes.Equal(data, haltEntry) {
		return nil, &haltError{index: index}
	}
	c.mu.Lock()
	probe := c.probe
	c.mu.Unlock()
	if probe != nil {
		probe(index, data)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if index <= c.last {
		panic(fmt.Sprintf("apply out of order: %d after %d", index, c.last))
	}
	c.last = index
	c.sum += binary.LittleEndian.Uint64(data)
	c.count++
	return c.sum, nil
}

func (c *counter) CaptureSnapshot() func([]byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.capture != nil {
		c.capture()
	}
	b := binary.LittleEndian.AppendUint64(nil, c.sum)
	b = binary.LittleEndian.AppendUint64(b, c.count)
	b = binary.LittleEndian.AppendUint64(b, c.last)
	return func(buf []byte) ([]byte, error) { return append(buf[:0], b...), nil }
}

func (c *counter) Restore(data []byte) error {
	if len(data) != 24 {
		return errors.New("counter: bad snapshot")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sum = binary.LittleEndian.Uint64(data)
	c.count = binary.LittleEndian.Uint64(data[8:])
	c.last = binary.LittleEndian.Uint64(data[16:])
	return nil
}

func (c *counter) state() (sum, count uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum, c.count
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// testNode is a Host with its counters and its Run goroutine.
type testNode struct {
	h      *Host
	sms    map[uint32]*counter
	cancel context.CancelFunc
	done   chan error
	// powerLost: its file system lost power (nothing more can be written).
	powerLost bool
}

func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	if os.Getenv("MULTIRAFT_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func baseConfig(dir string) Config {
	return Config{
		Dir:          dir,
		NodeID:       1,
		GroupCount:   4,
		ShardCount:   2,
		TickInterval: 10 * time.Millisecond,
	}
}

func startNode(tb testing.TB, cfg Config, tr Transport) *testNode {
	tb.Helper()
	n := newNode(tb, cfg, tr)
	n.run(tb)
	return n
}

func newNode(tb testing.TB, cfg Config, tr Transport) *testNode {
	tb.Helper()
	n := &testNode{sms: map[uint32]*counter{}}
	var mu sync.Mutex
	h, err := New(cfg, func(g uint32) StateMachine {
		mu.Lock()
		defer mu.Unlock()
		c := &counter{}
		n.sms[g] = c
		return c
	}, tr, testLogger(tb))
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	n.h = h
	return n
}

func (n *testNode) run(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.done = make(chan error, 1)
	go func() { n.done <- n.h.Run(ctx) }()
	tb.Cleanup(func() { n.stop(tb) })
}

// stop stops the node gracefully and records the clean shutdown, as the
// engine does after a clean stop (a restart then opens no recovery gate).
func (n *testNode) stop(tb testing.TB) {
	tb.Helper()
	if n.powerLost {
		return
	}
	n.halt(tb)
	if err := n.h.RecordCleanShutdown(); err != nil {
		tb.Errorf("RecordCleanShutdown: %v", err)
	}
}

// halt stops the node without recording a clean shutdown: the next start
// follows a crash.
func (n *testNode) halt(tb testing.TB) {
	tb.Helper()
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.cancel = nil
	if err := <-n.done; err != nil {
		tb.Errorf("Run: %v", err)
	}
}

func waitReady(tb testing.TB, h *Host) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.WaitReady(ctx); err != nil {
		tb.Fatalf("WaitReady: %v", err)
	}
}

// countingFS counts the writes and syncs of WAL segment files.
type countingFS struct {
	wal.OSFS
	writes, syncs atomic.Int64
	failSync      atomic.Bool
}

type countingFile struct {
	wal.File
	fs *countingFS
}

func (c *countingFS) OpenFile(name string, flag int, perm fs.FileMode) (wal.File, error) {
	f, err := c.OSFS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return &countingFile{File: f, fs: c}, nil
}

// WriteAt counts the writes that carry frames, not the zeros written
// ahead of them.
func (f *countingFile) WriteAt(b []byte, off int64) (int, error) {
	if slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		f.fs.writes.Add(1)
	}
	return f.File.WriteAt(b, off)
}

func (f *countingFile) Sync() error {
	if f.fs.failSync.Load() {
		return errors.New("injected fsync failure")
	}
	f.fs.syncs.Add(1)
	return f.File.Sync()
}

func dirSize(tb testing.TB, dir string) int64 {
	tb.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
