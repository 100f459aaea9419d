// Fail-stop tests. The issue: `ursula` used to keep running when its node
// failed, answering 503 to every request forever while its process looked
// alive to a supervisor (systemd, Kubernetes), which therefore never
// restarted it. Every binary now runs its roles (memlimit, storage, node,
// coldgc, subscriptions, gateway, upstream) under one supervisor
// (services/platform/lifecycle): the first role that fails stops the
// process with exit status 1, logging `msg="a role failed: stopping the
// process" role=<name> err=<cause>`.
//
// These tests prove it on the real binaries, for the failures an operator
// meets:
//
//   - TestFailStopPortTaken: a listener that cannot be bound (the port is
//     taken) ends the process within a few seconds, whatever the binary
//     and whichever of its listeners it is, and the log names the role and
//     the cause;
//   - TestFailStopColdStoreBroken: a cold store that cannot be used (its
//     directory is a regular file, or its root holds someone else's
//     objects) ends the process before it ever reports ready;
//   - TestFailStopDataDirUnwritable: a data directory that becomes unusable
//     under load (a snapshot file or WAL segment can no longer be created)
//     ends the process, the storage role named as the one that failed, and
//     nothing it acknowledged before is lost: on the repaired directory
//     every acknowledged append reads back once, in order. Both
//     deployments: the all-in-one binary, and ursula-node behind
//     ursula-gateway (where the node exits and the gateway stays up).

package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/tests/await"
)

// portExitBound bounds how long a process whose port is taken may run. The
// issue asks that it exit "within a few seconds"; it exits within
// milliseconds when it works, and 10 s leaves room for a busy machine.
const portExitBound = 10 * time.Second

// Log messages of the supervisor (services/platform/lifecycle and
// services/app).
const (
	msgRoleFailed = `msg="a role failed: stopping the process"`
	msgStopped    = `msg="ursula stopped with an error"`
	msgNodeReady  = `msg="node ready"`
)

// TestFailStopPortTaken: a listener is already bound (by this test, kept
// open) at one of a process's listen addresses. The process must exit with
// a non-zero status within portExitBound, its log naming the role whose
// listener failed and "address already in use".
func TestFailStopPortTaken(t *testing.T) {
	cases := []struct {
		name string
		// role is the role that owns the listener.
		role string
		// prepare returns the process (not started) with taken as one of
		// its listen addresses.
		prepare func(t *testing.T, taken string) *Server
	}{
		{"ursula/server.listen", "node", func(t *testing.T, taken string) *Server {
			return prepareAllInOne(t, "server.listen", taken)
		}},
		{"ursula/gateway.listen", "gateway", func(t *testing.T, taken string) *Server {
			return prepareAllInOne(t, "gateway.listen", taken)
		}},
		{"ursula/server.admin_listen", "node", func(t *testing.T, taken string) *Server {
			return prepareAllInOne(t, "server.admin_listen", taken)
		}},
		{"ursula-node/server.listen", "node", func(t *testing.T, taken string) *Server {
			return prepareServer(t, Options{
				Binary:      binaryPath(t, "ursula-node"),
				DataDir:     filepath.Join(t.TempDir(), "data"),
				ListenFlags: []string{"server.admin_listen", "server.cluster_listen"},
				Addrs:       map[string]string{"server.listen": taken},
				ReadyFlag:   "server.listen",
				Args:        []string{"-server.listen=" + taken},
			})
		}},
		{"ursula-node/server.cluster_listen/3-node", "node", func(t *testing.T, taken string) *Server {
			// Node 1 of a 3-node configuration: its own cluster listener
			// (server.cluster_listen, and its [[raft.peers]] entry) is the
			// taken address. The other nodes are never started.
			c := NewCluster(t, ClusterOptions{GroupCount: 4})
			n := c.Nodes[0]
			err := n.Reconfigure(func(cfg *NodeConfig) {
				cfg.ClusterListen = taken
				for i := range cfg.Peers {
					if cfg.Peers[i].ID == cfg.NodeID {
						cfg.Peers[i].ClusterURL = taken
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			return n.Server
		}},
		{"ursula-gateway/gateway.listen", "gateway", func(t *testing.T, taken string) *Server {
			// The upstream node is a free port nobody listens on: the
			// gateway need not reach it to fail.
			up, err := freeport.Addrs(1)
			if err != nil {
				t.Fatal(err)
			}
			return prepareServer(t, Options{
				Binary:      binaryPath(t, "ursula-gateway"),
				ListenFlags: []string{},
				Addrs:       map[string]string{"gateway.listen": taken},
				Args:        []string{"-gateway.listen=" + taken, "-upstream.nodes=" + up[0]},
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			taken := l.Addr().String()

			s := tc.prepare(t, taken)
			start := time.Now()
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			log := waitFailStop(t, s, portExitBound)
			t.Logf("%s exited after %v (%v)", filepath.Base(s.Bin), time.Since(start).Round(time.Millisecond), s.ExitErr())

			line := logLine(log, msgRoleFailed)
			if line == "" {
				t.Fatalf("the log has no %s line", msgRoleFailed)
			}
			for _, want := range []string{"role=" + tc.role + " ", taken, "address already in use"} {
				if !strings.Contains(line, want) {
					t.Errorf("the failed role's line does not contain %q: %s", want, line)
				}
			}
			if line := logLine(log, msgStopped); !strings.Contains(line, `err="`+tc.role+": ") {
				t.Errorf("the last error does not name the %s role: %q", tc.role, line)
			}
		})
	}
}

// TestFailStopColdStoreBroken: a process whose cold store cannot be used
// exits non-zero with an error naming the cold store, and never reports
// ready: -cold.dir is a regular file, or a directory holding an object of
// someone else and no URSULA_FORMAT_EPOCH marker (the process must refuse
// a root that is not Ursula's rather than write into it).
func TestFailStopColdStoreBroken(t *testing.T) {
	regularFile := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "cold")
		if err := os.WriteFile(p, []byte("not a directory\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreignRoot := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "cold")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "someone-else.txt"), []byte("not Ursula's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name    string
		bin     string
		coldDir func(t *testing.T) string
		// cause is a part of the error naming what is wrong.
		cause string
	}{
		{"ursula/regular-file", "ursula", regularFile, "not a directory"},
		{"ursula/foreign-root", "ursula", foreignRoot, "URSULA_FORMAT_EPOCH"},
		{"ursula-node/foreign-root", "ursula-node", foreignRoot, "URSULA_FORMAT_EPOCH"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			coldDir := tc.coldDir(t)
			opts := Options{
				Binary:  binaryPath(t, tc.bin),
				DataDir: filepath.Join(t.TempDir(), "data"),
				Args:    []string{"-storage.cold.backend=fs", "-storage.cold.root=" + coldDir},
			}
			if tc.bin == "ursula-node" {
				opts.ListenFlags = []string{"server.listen", "server.admin_listen", "server.cluster_listen"}
				opts.ReadyFlag = "server.listen"
			}
			s := prepareServer(t, opts)
			start := time.Now()
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			// WaitReady returns nil only on a 200 from /__ursula/ready, and
			// an error as soon as the process exits without one.
			ctx, cancel := context.WithTimeout(t.Context(), await.DefaultTimeout)
			defer cancel()
			if err := s.WaitReady(ctx); err == nil {
				t.Fatalf("%s reported ready with a broken cold store", filepath.Base(s.Bin))
			}
			log := waitFailStop(t, s, await.DefaultTimeout)
			t.Logf("%s exited after %v (%v)", filepath.Base(s.Bin), time.Since(start).Round(time.Millisecond), s.ExitErr())

			line := logLine(log, msgStopped)
			for _, want := range []string{"cold store", tc.cause} {
				if !strings.Contains(line, want) {
					t.Errorf("the last error does not contain %q: %q", want, line)
				}
			}
			if line := logLine(log, msgNodeReady); line != "" {
				t.Errorf("the node reported ready: %s", line)
			}
		})
	}
}

// TestFailStopDataDirUnwritable: a node with small snapshot thresholds
// (a group snapshot every 8 entries or 4 KiB) takes appends from one
// writer. Once 50 are acknowledged, its data directory is made unusable:
// the tests run as root, which ignores permission bits, so the directory
// is renamed away and a regular file put at its path. The files the node
// has open keep working (they moved with the directory), but every file it
// must create from then on (a snapshot, a new WAL segment) fails. The
// writer keeps appending.
//
// The process must exit non-zero, its log naming the storage role as the
// one that failed. The directory is then put back, the process started
// again on it, and the stream read from offset -1: every append
// acknowledged (2xx) before the exit is there once, in the order it was
// sent; an append whose answer was not a 2xx may be there (once, in order)
// or not, and nothing else is.
//
// In the split deployment the node fails and exits; the gateway in front
// of it stays up (it answers 503 meanwhile) and serves the node again
// once it is back.
func TestFailStopDataDirUnwritable(t *testing.T) {
	for _, split := range []bool{false, true} {
		name := "all-in-one"
		if split {
			name = "split"
		}
		t.Run(name, func(t *testing.T) {
			runDataDirUnwritable(t, split)
		})
	}
}

// failStopAcks is how many appends are acknowledged before the data
// directory is made unusable.
const failStopAcks = 50

func runDataDirUnwritable(t *testing.T, split bool) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	// The cold store lives outside the data directory, so that only the
	// data directory breaks.
	args := []string{
		"-raft.snapshot_entries=8", "-raft.snapshot_bytes=4096",
		"-storage.cold.backend=fs", "-storage.cold.root=" + filepath.Join(dir, "cold"),
	}
	var victim, gw *Server
	if split {
		nodeTok, gwTok := SplitTokens(t)
		victim = StartServer(t, Options{
			Binary:      binaryPath(t, "ursula-node"),
			WorkDir:     filepath.Join(dir, "node"),
			DataDir:     dataDir,
			ListenFlags: []string{"server.listen", "server.admin_listen", "server.cluster_listen"},
			ReadyFlag:   "server.listen",
			Args:        append(args, nodeTok...),
		})
		gw = StartServer(t, Options{
			Binary:      binaryPath(t, "ursula-gateway"),
			WorkDir:     filepath.Join(dir, "gateway"),
			ListenFlags: []string{"gateway.listen"},
			Args:        append([]string{"-upstream.nodes=" + victim.Addrs["server.listen"]}, gwTok...),
		})
	} else {
		victim = StartServer(t, Options{DataDir: dataDir, Args: args})
		gw = victim
	}
	c := NewClient(gw.URL())
	ctx := t.Context()
	stream := fmt.Sprintf("failstop-datadir-%08x", rand.Uint32())
	resp, err := c.Create(ctx, stream, "application/octet-stream", nil)
	if err != nil {
		t.Fatalf("create %s: %v", stream, err)
	}
	if resp.Status != http.StatusCreated {
		t.Fatalf("create %s: want 201, got %v", stream, resp)
	}

	w := &failStopWriter{c: c, stream: stream}
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx) })
	defer func() {
		stopWriter()
		wg.Wait()
	}()

	await.True(t, fmt.Sprintf("%d appends acknowledged", failStopAcks), func() bool {
		return w.acks.Load() >= failStopAcks
	})
	moved := dataDir + ".moved"
	if err := os.Rename(dataDir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dataDir, []byte("the data directory was here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := time.Now()
	ackedBefore := w.acks.Load()

	// await.DefaultTimeout, not a shorter bound: the failure surfaces at
	// the group's next snapshot, a few appends later, and the process
	// exits promptly once it does.
	log := waitFailStop(t, victim, await.DefaultTimeout)
	stopWriter()
	wg.Wait()
	acked, unknown := w.result()
	t.Logf("%s exited %v after the data directory was moved (%v); %d appends acknowledged before the move, %d in all, %d without a 2xx answer",
		filepath.Base(victim.Bin), time.Since(broken).Round(time.Millisecond), victim.ExitErr(), ackedBefore, len(acked), len(unknown))

	line := logLine(log, msgRoleFailed)
	if !strings.Contains(line, "role=storage ") {
		t.Fatalf("the storage role is not the one that failed: %q", line)
	}
	t.Logf("failure logged: %s", line)
	if line := logLine(log, msgStopped); !strings.Contains(line, `err="storage: `) {
		t.Errorf("the last error does not name the storage role: %q", line)
	}
	if split && !gw.Running() {
		t.Fatalf("the gateway exited with its node (%v); it should stay up and answer 503", gw.ExitErr())
	}

	if err := os.Remove(dataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, dataDir); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, await.DefaultTimeout)
	defer cancel()
	if err := victim.Restart(rctx); err != nil {
		t.Fatalf("restart on the repaired data directory: %v", err)
	}
	if err := gw.WaitReady(rctx); err != nil {
		t.Fatalf("gateway: %v", err)
	}

	data, tail, err := c.ReadAll(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	checkFailStopStream(t, data, acked, unknown)
	t.Logf("read back %d bytes (tail %s): every one of %d acknowledged appends once, in order", len(data), tail, len(acked))
}

// failStopWriter appends numbered records to one stream, one request at a
// time, until its context ends, and records which were acknowledged.
type failStopWriter struct {
	c      *Client
	stream string
	acks   atomic.Int64

	mu      sync.Mutex
	acked   []uint64 // seqs answered 2xx, in the order sent
	unknown []uint64 // seqs answered otherwise, or not at all
}

// failStopRecord is the body of append seq: fixed width, so that the
// stream parses back into its appends.
func failStopRecord(seq uint64) string { return fmt.Sprintf("append %08d\n", seq) }

func (w *failStopWriter) run(ctx context.Context) {
	for seq := uint64(0); ctx.Err() == nil; seq++ {
		resp, err := w.c.Append(ctx, w.stream, "application/octet-stream", []byte(failStopRecord(seq)), nil)
		ok := err == nil && resp.Status >= 200 && resp.Status < 300
		w.mu.Lock()
		if ok {
			w.acked = append(w.acked, seq)
		} else {
			w.unknown = append(w.unknown, seq)
		}
		w.mu.Unlock()
		if ok {
			w.acks.Add(1)
			continue
		}
		// Pacing, not synchronization: once the node is gone every
		// request fails at once, and the test stops the writer as soon as
		// it sees the process exit.
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (w *failStopWriter) result() (acked, unknown []uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]uint64(nil), w.acked...), append([]uint64(nil), w.unknown...)
}

// checkFailStopStream checks that data is a sequence of records in
// increasing seq order, holding every acknowledged seq and otherwise only
// seqs whose append had no 2xx answer.
func checkFailStopStream(t *testing.T, data []byte, acked, unknown []uint64) {
	t.Helper()
	isUnknown := make(map[uint64]bool, len(unknown))
	for _, s := range unknown {
		isUnknown[s] = true
	}
	want := acked // the acknowledged seqs still to be found, in order
	var prev int64 = -1
	extra := 0
	text := string(data)
	for i, rec := 0, 0; i < len(text); rec++ {
		end := strings.IndexByte(text[i:], '\n')
		if end < 0 || !strings.HasPrefix(text[i:], "append ") {
			t.Fatalf("byte %d: not a record: %q", i, clipString(text[i:]))
		}
		line := text[i : i+end]
		i += end + 1
		seq, err := strconv.ParseUint(strings.TrimPrefix(line, "append "), 10, 64)
		if err != nil || line != strings.TrimSuffix(failStopRecord(seq), "\n") {
			t.Fatalf("record %d: not a record: %q", rec, line)
		}
		if int64(seq) <= prev {
			t.Fatalf("record %d: append %d after append %d: out of order or twice", rec, seq, prev)
		}
		prev = int64(seq)
		switch {
		case len(want) > 0 && seq == want[0]:
			want = want[1:]
		case len(want) > 0 && seq > want[0]:
			t.Fatalf("record %d: append %d, but acknowledged append %d is missing", rec, seq, want[0])
		case isUnknown[seq]:
			extra++ // answered without a 2xx, yet persisted: allowed
		default:
			t.Fatalf("record %d: append %d was never sent", rec, seq)
		}
	}
	if len(want) > 0 {
		t.Fatalf("%d acknowledged appends are missing, the first %d (the stream ends after append %d)", len(want), want[0], prev)
	}
	if extra > 0 {
		t.Logf("%d appends answered without a 2xx are in the stream too (allowed: their outcome was unknown)", extra)
	}
}

func clipString(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// binaryPath is Binary for a test.
func binaryPath(t *testing.T, name string) string {
	t.Helper()
	p, err := Binary(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// prepareServer is NewServer for a test, in the test's temporary
// directory unless opts names one: the process is killed at cleanup if it
// still runs, and its log printed if the test failed.
func prepareServer(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.WorkDir == "" {
		opts.WorkDir = t.TempDir()
	}
	s, err := NewServer(opts)
	if err != nil {
		t.Fatalf("prepare server: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", s.LogPath, s.LogTail(200))
		}
	})
	return s
}

// TestMemoryAbortCap: past runtime.node_memory_abort_cap_size the process
// exits at once with abort()'s status (134), its log naming the setting,
// as an OOM kill would end it but saying why; started again on the same
// data without the cap, it recovers and serves. A cap of 1 MiB is below
// what any Go process holds, so the first check aborts.
func TestMemoryAbortCap(t *testing.T) {
	const capFlag = "-runtime.node_memory_abort_cap_size=1048576"
	s := prepareServer(t, Options{Binary: binaryPath(t, "ursula"), Args: []string{capFlag}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	log := waitFailStop(t, s, portExitBound)
	var exit *exec.ExitError
	if !errors.As(s.ExitErr(), &exit) || exit.ExitCode() != 134 {
		t.Errorf("exit %v, want status 134 (abort)", s.ExitErr())
	}
	if line := logLine(log, "runtime.node_memory_abort_cap_size"); !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "cap_bytes=1048576") {
		t.Errorf("no error line naming the setting and the cap: %q", line)
	}

	s.opts.Args = slices.DeleteFunc(s.opts.Args, func(a string) bool { return a == capFlag })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("not ready again on the same data without the cap: %v", err)
	}
}

// prepareAllInOne prepares bin/ursula with listener flag at taken and every
// other listener at a free port.
func prepareAllInOne(t *testing.T, flag, taken string) *Server {
	t.Helper()
	bin := binaryPath(t, "ursula")
	flags, err := DefinedFlags(bin, DefaultListenFlags...)
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, f := range flags {
		if f != flag {
			others = append(others, f)
		}
	}
	return prepareServer(t, Options{
		Binary:      bin,
		DataDir:     filepath.Join(t.TempDir(), "data"),
		ListenFlags: others,
		Addrs:       map[string]string{flag: taken},
		Args:        []string{"-" + flag + "=" + taken},
	})
}

// waitFailStop waits up to bound for the started process s to exit, fails
// t unless it exited by itself with a non-zero status, and returns its
// log.
func waitFailStop(t *testing.T, s *Server, bound time.Duration) string {
	t.Helper()
	if !await.Until(bound, func() bool { return !s.Running() }) {
		t.Fatalf("%s (pid %d) still runs %v after the failure; last lines of its log:\n%s",
			filepath.Base(s.Bin), s.PID(), bound, s.LogTail(60))
	}
	var exit *exec.ExitError
	switch err := s.ExitErr(); {
	case err == nil:
		t.Errorf("%s exited with status 0 after a failure", filepath.Base(s.Bin))
	case !errors.As(err, &exit) || !exit.Exited():
		t.Errorf("%s did not exit by itself: %v", filepath.Base(s.Bin), err)
	}
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// logLine returns the last line of log that contains msg, "" if none.
func logLine(log, msg string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], msg) {
			return lines[i]
		}
	}
	return ""
}
