package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/e2e"
)

// The 3-node cluster the bench starts itself: three ursula-node processes
// and an ursula-gateway in front of them on free loopback ports, started
// by the e2e harness (e2e.StartCluster) as the e2e tests start theirs and
// configured as make run-cluster configures its own (16 groups, 2 cores,
// fsync never, TLS on the cluster and client planes, a shared local cold
// directory). The harness is written for tests; harnessTB stands in for
// the test.

// clusterWorkloads are the workloads run against the cluster.
var clusterWorkloads = map[string]bool{"multi-stream": true, "fan-out": true, "replay": true, "mixed": true}

// errHarnessFatal is what a harness Fatal turns into.
var errHarnessFatal = errors.New("bench: cluster harness failed")

// harnessTB is the testing.TB the e2e cluster harness is given. Only the
// methods the harness calls are implemented; any other panics (the
// embedded interface is nil), which shows at once if the harness starts
// needing more. Fatal ends the calling goroutine, as in a test, so the
// harness must run in a goroutine of its own (see startCluster).
type harnessTB struct {
	testing.TB
	dir  string
	logf func(string, ...any)

	mu       sync.Mutex
	failed   error
	cleanups []func()
}

func (t *harnessTB) Helper()      {}
func (t *harnessTB) Name() string { return "bench-cluster" }
func (t *harnessTB) TempDir() string {
	dir, err := os.MkdirTemp(t.dir, "cluster-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
func (t *harnessTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *harnessTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed != nil
}
func (t *harnessTB) Logf(format string, args ...any) { t.logf("cluster: "+format, args...) }
func (t *harnessTB) Fatal(args ...any)               { t.fail(fmt.Sprint(args...)) }
func (t *harnessTB) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
}

func (t *harnessTB) fail(msg string) {
	t.mu.Lock()
	t.failed = fmt.Errorf("%w: %s", errHarnessFatal, msg)
	t.mu.Unlock()
	runtime.Goexit()
}

// close runs the cleanups in reverse order (the harness kills its
// processes there) and removes the directory.
func (t *harnessTB) close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	os.RemoveAll(t.dir)
}

// benchCluster is a started cluster and how to stop it.
type benchCluster struct {
	*e2e.Cluster
	tb *harnessTB
}

// procs are the cluster's processes: the nodes, then the gateway.
func (bc *benchCluster) procs() []proc {
	var out []proc
	for _, n := range bc.Nodes {
		out = append(out, proc{fmt.Sprintf("node%d", n.ID), n.PID()})
	}
	return append(out, proc{"gateway", bc.Gateway.PID()})
}

func (bc *benchCluster) Close() { bc.tb.close() }

// startCluster starts the three nodes and the gateway, with the node and
// gateway binaries found next to serverBin when they are there (else the
// harness builds them), and waits until every group has a leader and the
// gateway is ready (at most readyTimeout).
func startCluster(serverBin string, readyTimeout time.Duration, logf func(string, ...any)) (*benchCluster, error) {
	if os.Getenv(e2e.EnvBinDir) == "" && serverBin != "" {
		dir := filepath.Dir(serverBin)
		if _, err := os.Stat(filepath.Join(dir, "ursula-node")); err == nil {
			os.Setenv(e2e.EnvBinDir, dir)
		}
	}
	dir, err := os.MkdirTemp("", "ursula-bench-cluster-")
	if err != nil {
		return nil, err
	}
	tb := &harnessTB{dir: dir, logf: logf}
	var cl *e2e.Cluster
	done := make(chan struct{})
	go func() {
		defer close(done)
		cl = e2e.StartCluster(tb, e2e.ClusterOptions{
			Nodes: 3, GroupCount: 16, CoreCount: 2, Fsync: "never", Gateway: true, ReadyTimeout: readyTimeout,
		})
	}()
	<-done
	if tb.failed != nil || cl == nil {
		tb.close()
		if tb.failed == nil {
			tb.failed = errHarnessFatal
		}
		return nil, tb.failed
	}
	return &benchCluster{Cluster: cl, tb: tb}, nil
}

// measureCluster starts the cluster, runs the cluster workloads against
// its gateway and stops it.
func measureCluster(ctx context.Context, c config, serverBin string, workloads []string, logf func(string, ...any)) (*ServerRun, error) {
	var ws []string
	for _, w := range workloads {
		if clusterWorkloads[w] {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil, nil
	}
	logf("cluster: starting 3 nodes and a gateway")
	bc, err := startCluster(serverBin, 120*time.Second, logf)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	defer bc.Close()
	procs := bc.procs()
	sr := &ServerRun{Name: clusterName, Command: fmt.Sprintf("3 × %s, %s (e2e.StartCluster, fsync never)", bc.Nodes[0].Bin, bc.Gateway.Bin+" "+bc.Gateway.URL())}
	b := newBench(bc.GatewayURL(), procs, false, logf)
	runWorkloads(ctx, c, b, sr, ws)
	sr.RSSPeakPerProcessMiB = map[string]float64{}
	for _, p := range procs {
		if v, err := procStatusMiB(p.pid, "VmHWM"); err == nil {
			sr.RSSPeakPerProcessMiB[p.name] = v
			sr.RSSPeakMiB = round3(sr.RSSPeakMiB + v)
		}
	}
	for _, n := range bc.Nodes {
		if !n.Running() {
			sr.addErr(fmt.Sprintf("node%d", n.ID), fmt.Errorf("exited during the run: %v; log tail:\n%s", n.ExitErr(), n.LogTail(30)))
		}
	}
	if !bc.Gateway.Running() {
		sr.addErr("gateway", fmt.Errorf("exited during the run: %v; log tail:\n%s", bc.Gateway.ExitErr(), bc.Gateway.LogTail(30)))
	}
	return sr, ctx.Err()
}

// clusterName is the cluster's server name in the report.
const clusterName = "cluster"
