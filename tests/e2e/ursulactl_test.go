package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"github.com/ursula/ursula/ops/ursulactl"
	"github.com/ursula/ursula/tests/await"
)

// Tests of ursulactl (ops/ursulactl) against spawned clusters. Each verb
// runs in process through ursulactl.Run, as the binary would, so that the
// tests can restart nodes from ursulactl's hooks; TestUrsulactl/binary runs
// bin/ursulactl itself.

// ctlWait bounds ursulactl's waits in these tests.
const ctlWait = 2 * time.Minute

// writeCtlManifest writes the cluster's ursulactl manifest.
func writeCtlManifest(t testing.TB, c *Cluster) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "cluster_id = %q\n", c.ID)
	scheme := "http"
	if ca := c.Nodes[0].Config.ClientTLS.CAFile; ca != "" {
		fmt.Fprintf(&b, "ca_file = %q\n", ca)
		scheme = "https"
	}
	b.WriteString("\n")
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "[[nodes]]\nid = %d\nname = \"node%d\"\nclient_url = \"%s://%s\"\nadmin_url = \"http://%s\"\nadmin_token_file = %q\n\n",
			n.ID, n.ID, scheme, n.Config.Listen, n.Config.AdminListen, n.AdminTokenFile())
	}
	path := filepath.Join(c.Dir, "manifest.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// ctlResult is one ursulactl run.
type ctlResult struct {
	code           int
	stdout, stderr string
}

// runCtl runs ursulactl in process with the manifest and returns its exit
// code and output.
func runCtl(t testing.TB, manifest string, env ursulactl.Env, args ...string) ctlResult {
	t.Helper()
	return runCtlLog(t, manifest, env, true, args...)
}

// runCtlLog is runCtl; with verbose false it logs the output only on a
// failure.
func runCtlLog(t testing.TB, manifest string, env ursulactl.Env, verbose bool, args ...string) ctlResult {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	full := append([]string{"--manifest", manifest, "--timeout", ctlWait.String()}, args...)
	start := time.Now()
	code := ursulactl.Run(t.Context(), full, env)
	if verbose || code != 0 {
		t.Logf("ursulactl %s: exit %d after %v\n%s%s", strings.Join(args, " "), code, time.Since(start).Round(time.Millisecond), out.String(), errb.String())
	}
	return ctlResult{code: code, stdout: out.String(), stderr: errb.String()}
}

// want checks the exit code and, for a failure, the one-line error.
func (r ctlResult) want(t testing.TB, code int, errContains string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	if code == 0 {
		return
	}
	// Progress lines may come first; the error is the last line.
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if !strings.HasSuffix(r.stderr, "\n") || !strings.HasPrefix(lines[len(lines)-1], "ursulactl: error: ") || strings.Count(r.stderr, "ursulactl: error: ") != 1 {
		t.Errorf("stderr does not end in one 'ursulactl: error: ' line: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, errContains) {
		t.Errorf("stderr %q does not mention %q", r.stderr, errContains)
	}
}

// ctlStatus runs status --json and decodes it.
func ctlStatus(t testing.TB, manifest string) *ursulactl.ClusterStatus {
	t.Helper()
	r := runCtlLog(t, manifest, ursulactl.Env{}, false, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json: exit %d: %s", r.code, r.stderr)
	}
	var st ursulactl.ClusterStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v", err)
	}
	return &st
}

func nodeStatus(t testing.TB, st *ursulactl.ClusterStatus, id uint64) ursulactl.NodeStatus {
	t.Helper()
	for _, n := range st.Nodes {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("status has no node %d", id)
	return ursulactl.NodeStatus{}
}

// waitSpread waits until every node leads at least one group (with
// balanced: no node more than its share, as the balancer leaves them).
func waitSpread(t testing.TB, manifest string, balanced bool) {
	t.Helper()
	var st *ursulactl.ClusterStatus
	if !await.Until(await.DefaultTimeout, func() bool {
		st = ctlStatus(t, manifest)
		ok := len(st.GroupsWithoutLeader) == 0
		share := (st.GroupCount + len(st.Nodes) - 1) / len(st.Nodes)
		for _, n := range st.Nodes {
			ok = ok && n.Leaderships > 0 && (!balanced || n.Leaderships <= share)
		}
		return ok
	}) {
		t.Fatalf("leaderships not spread after %v: %v, groups without a leader %v", await.DefaultTimeout, st.Leaderships, st.GroupsWithoutLeader)
	}
	t.Logf("leaderships spread: %v", st.Leaderships)
}

// TestUrsulactl runs every ursulactl verb against a 3-node cluster, the
// refusals of its safety checks included: a node restarted between the
// pinning of its incarnation and the mutation (412, exit 2), an
// unreachable node (shown as such by status, a problem for
// verify-cluster, and a reason for drain to refuse).
func TestUrsulactl(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, Gateway: true})
	m := writeCtlManifest(t, c)
	ctx := t.Context()
	none := ursulactl.Env{}
	// The balancer moves leaderships after the start; while one moves, a
	// node briefly knows no leader of its group (readiness
	// raft_replica_unready), which the status checks below would see.
	if err := c.WaitBalanced(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("status", func(t *testing.T) {
		st := ctlStatus(t, m)
		total := 0
		for _, n := range c.Nodes {
			ns := nodeStatus(t, st, n.ID)
			met, err := n.Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !ns.Reachable || !ns.Ready || ns.ClusterID != c.ID || ns.ProcessIncarnation != met.ProcessIncarnation || ns.ShedState != "normal" {
				t.Errorf("node %d: status %+v (incarnation %s)", n.ID, ns, met.ProcessIncarnation)
			}
			total += ns.Leaderships
		}
		if st.GroupCount != c.GroupCount() || total != c.GroupCount() || len(st.GroupsWithoutLeader) != 0 {
			t.Errorf("status: %d groups, %d leaderships, without a leader %v", st.GroupCount, total, st.GroupsWithoutLeader)
		}
		r := runCtl(t, m, none, "status")
		r.want(t, 0, "")
		for _, want := range []string{"NODE", "READY", "INCARNATION", "leadership spread over 16 groups", "groups without a leader: none"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("status table does not show %q", want)
			}
		}
	})

	t.Run("verify-cluster and wait-ready", func(t *testing.T) {
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
		r := runCtl(t, m, none, "verify-cluster")
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, "cluster healthy: 3 nodes") {
			t.Errorf("verify-cluster said %q", r.stdout)
		}
	})

	t.Run("drain, wait, undrain", func(t *testing.T) {
		r := runCtl(t, m, none, "drain", "--node", "1")
		r.want(t, 0, "")
		st := ctlStatus(t, m)
		if ns := nodeStatus(t, st, 1); ns.Leaderships != 0 || ns.ShedState != "maintenance-drain" {
			t.Errorf("after drain: node 1 leads %d groups, shed state %q", ns.Leaderships, ns.ShedState)
		}
		// Drained, it takes no leadership back (a negative check over a
		// window: a busy machine only makes it weaker, never fail).
		time.Sleep(2500 * time.Millisecond)
		if ns := nodeStatus(t, ctlStatus(t, m), 1); ns.Leaderships != 0 {
			t.Errorf("drained node 1 leads %d groups again", ns.Leaderships)
		}
		runCtl(t, m, none, "wait", "--node", "1").want(t, 0, "")
		runCtl(t, m, none, "undrain", "--node", "1").want(t, 0, "")
		if ns := nodeStatus(t, ctlStatus(t, m), 1); ns.ShedState != "normal" {
			t.Errorf("after undrain: shed state %q", ns.ShedState)
		}
		waitSpread(t, m, false)
	})

	// The leadership verbs below name a group's leader read just before:
	// let the balancer finish first, so that it does not move the group
	// in between.
	t.Run("transfer", func(t *testing.T) {
		waitSpread(t, m, true)
		leaders, _, err := c.GroupLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		from := leaders[0]
		to := from%3 + 1
		r := runCtl(t, m, none, "transfer", "--node", fmt.Sprint(from), "--group", "0", "--to", fmt.Sprint(to))
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, fmt.Sprintf("group 0: leadership moved from node %d", from)) {
			t.Errorf("transfer said %q", r.stdout)
		}
		leaders, _, err = c.GroupLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		follower := leaders[0]%3 + 1
		runCtl(t, m, none, "transfer", "--node", fmt.Sprint(follower), "--group", "0", "--to", fmt.Sprint(leaders[0])).
			want(t, ursulactl.ExitAborted, fmt.Sprintf("node %d does not lead group 0", follower))
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
	})

	t.Run("membership", func(t *testing.T) {
		waitSpread(t, m, true)
		leader, err := c.Leader(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		r := runCtl(t, m, none, "membership", "--node", fmt.Sprint(leader.ID), "--group", "1", "--voters", "1,2,3")
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, "committed_index") {
			t.Errorf("membership said %q", r.stdout)
		}
		follower := leader.ID%3 + 1
		runCtl(t, m, none, "membership", "--node", fmt.Sprint(follower), "--group", "1", "--voters", "1,2,3").
			want(t, ursulactl.ExitAborted, "does not lead group 1")
		runCtl(t, m, none, "membership", "--node", fmt.Sprint(leader.ID), "--group", "1", "--voters", "1,2,3,4").
			want(t, ursulactl.ExitAborted, "voter 4 is not in the manifest")
	})

	t.Run("snapshot and purge-log", func(t *testing.T) {
		r := runCtl(t, m, none, "snapshot", "--node", "2", "--group", "3")
		r.want(t, 0, "")
		var snap struct {
			Index uint64 `json:"snapshot_index"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &snap); err != nil {
			t.Fatalf("snapshot answer %q: %v", r.stdout, err)
		}
		r = runCtl(t, m, none, "purge-log", "--yes", "--node", "2", "--group", "3", "--upto", fmt.Sprint(snap.Index))
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, "purged_through") {
			t.Errorf("purge-log said %q", r.stdout)
		}
		runCtl(t, m, none, "snapshot", "--node", "2", "--group", "99").want(t, ursulactl.ExitError, "reports no group 99")
	})

	t.Run("flush-cold", func(t *testing.T) {
		waitSpread(t, m, true)
		client := c.Client()
		const stream = "ctl-flush"
		if resp, err := client.Create(ctx, stream, "text/plain", []byte("hot bytes")); err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("create: %v %v", resp, err)
		}
		leader, err := c.Leader(ctx, c.GroupOf(stream))
		if err != nil {
			t.Fatal(err)
		}
		r := runCtl(t, m, none, "flush-cold", "--node", fmt.Sprint(leader.ID), "--bucket", DSBucket, "--stream", stream)
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, "cold_offset") {
			t.Errorf("flush-cold said %q", r.stdout)
		}
		follower := leader.ID%3 + 1
		runCtl(t, m, none, "flush-cold", "--node", fmt.Sprint(follower), "--bucket", DSBucket, "--stream", stream).
			want(t, ursulactl.ExitError, "does not lead the stream's group")
	})

	t.Run("purge-bucket", func(t *testing.T) {
		gw := c.GatewayURL()
		for _, step := range []struct{ method, path, body string }{
			{"PUT", "/tenant-ctl", ""},
			{"PUT", "/tenant-ctl/events", ""},
			{"POST", "/tenant-ctl/events", "one two three"},
		} {
			req, _ := http.NewRequestWithContext(ctx, step.method, gw+step.path, strings.NewReader(step.body))
			req.Header.Set("Content-Type", "text/plain")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode >= 300 {
				t.Fatalf("%s %s: %s", step.method, step.path, resp.Status)
			}
		}
		r := runCtl(t, m, none, "purge-bucket", "--yes", "--node", "2", "--bucket", "tenant-ctl")
		r.want(t, 0, "")
		var rep ursulactl.PurgeReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || !rep.Complete() || rep.RemovedStreams != 1 {
			t.Errorf("purge report %q (%v)", r.stdout, err)
		}
		resp, err := http.Get(gw + "/tenant-ctl/events?offset=-1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("read of a purged stream: %s", resp.Status)
		}
	})

	t.Run("412: the node restarts between pinning and the mutation", func(t *testing.T) {
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
		var restarted atomic.Bool
		hooks := ursulactl.Hooks{Pinned: func(ctx context.Context, id uint64) error {
			if id != 2 || restarted.Swap(true) {
				return nil
			}
			n := c.Node(2)
			t.Logf("hook: restarting node 2 (SIGTERM, start) after ursulactl pinned its incarnation")
			if err := n.Terminate(60 * time.Second); err != nil {
				return err
			}
			return n.Restart(ctx)
		}}
		r := runCtl(t, m, ursulactl.Env{Hooks: hooks}, "drain", "--node", "2")
		r.want(t, ursulactl.ExitAborted, "node 2 answered 412")
		if !restarted.Load() {
			t.Fatal("the hook did not run")
		}
		// The mark was refused: the new process is not draining.
		if ns := nodeStatus(t, ctlStatus(t, m), 2); ns.ShedState != "normal" {
			t.Errorf("node 2 shed state %q after a refused drain", ns.ShedState)
		}
		runCtl(t, m, none, "wait", "--node", "2").want(t, 0, "")
		// Undrain and the thin verbs stop the same way.
		restarted.Store(false)
		runCtl(t, m, ursulactl.Env{Hooks: hooks}, "undrain", "--node", "2").want(t, ursulactl.ExitAborted, "node 2 answered 412")
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
	})

	t.Run("unreachable node", func(t *testing.T) {
		n3 := c.Node(3)
		if err := n3.Kill(); err != nil {
			t.Fatal(err)
		}
		st := ctlStatus(t, m)
		if ns := nodeStatus(t, st, 3); ns.Reachable || ns.Error == "" || ns.Ready {
			t.Errorf("killed node 3: status %+v", ns)
		}
		r := runCtl(t, m, none, "status")
		r.want(t, 0, "")
		if !strings.Contains(r.stdout, "unreachable") {
			t.Errorf("status table does not show node 3 unreachable:\n%s", r.stdout)
		}
		r = runCtl(t, m, none, "verify-cluster")
		r.want(t, ursulactl.ExitError, "verify-cluster")
		if !strings.Contains(r.stdout, "problem: node 3: unreachable") {
			t.Errorf("verify-cluster does not list node 3: %q", r.stdout)
		}
		runCtl(t, m, none, "drain", "--node", "1").want(t, ursulactl.ExitAborted, "node 3 is not ready (unreachable")
		runCtl(t, m, none, "wait", "--node", "3", "--timeout", "1s").want(t, ursulactl.ExitError, "wait node 3: not back")
		if err := n3.Start(); err != nil {
			t.Fatal(err)
		}
		runCtl(t, m, none, "wait", "--node", "3").want(t, 0, "")
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
	})

	t.Run("audit", func(t *testing.T) {
		runCtl(t, m, none, "--actor", "carol", "--reason", "audit check", "drain", "--node", "3").want(t, 0, "")
		runCtl(t, m, none, "--actor", "carol", "undrain", "--node", "3").want(t, 0, "")
		r := runCtl(t, m, none, "audit", "--node", "3", "--limit", "50")
		r.want(t, 0, "")
		type record struct {
			Operation, Actor, Reason, Auth string
			Status                         int
			ActorVerified                  bool `json:"actor_verified"`
		}
		var recs []record
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var rec record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("audit line %q: %v", line, err)
			}
			recs = append(recs, rec)
		}
		// The drain's mark, its handoffs (leader transfers) and the
		// undrain, in that order, all by carol; the undrain last.
		i := slices.IndexFunc(recs, func(r record) bool { return r.Operation == "POST /__ursula/leadership-shed/maintenance" })
		if i < 0 {
			t.Fatalf("no drain record in\n%s", r.stdout)
		}
		drain, last := recs[i], recs[len(recs)-1]
		if drain.Actor != "carol" || drain.Reason != "audit check" || drain.Auth != "token" || drain.Status != 200 || drain.ActorVerified {
			t.Errorf("drain record %+v", drain)
		}
		if last.Operation != "DELETE /__ursula/leadership-shed/maintenance" || last.Actor != "carol" || last.Status != 200 {
			t.Errorf("last record %+v, want the undrain", last)
		}
	})

	t.Run("a maintenance drain survives a restart", func(t *testing.T) {
		n := c.Node(2)
		runCtl(t, m, none, "drain", "--node", "2").want(t, 0, "")
		if err := n.Terminate(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 10 * time.Second}
		shed := func() string {
			var st struct {
				State string `json:"state"`
			}
			if _, err := getJSON(ctx, hc, "http://"+n.Config.AdminListen+"/__ursula/leadership-shed", &st); err != nil {
				t.Fatal(err)
			}
			return st.State
		}
		if got := shed(); got != "maintenance-drain" {
			t.Fatalf("after a restart node 2's shed state is %q, want maintenance-drain", got)
		}
		// A transfer to the drained node is refused by the leader.
		leaders, _, err := c.GroupLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leader := c.Node(leaders[0])
		met, err := leader.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := mustDo(ctx, t, hc, http.MethodPost, "http://"+leader.Config.AdminListen+"/__ursula/raft/0/leader/transfer/2",
			http.Header{"Authorization": {leader.AdminAuth(t)}, "X-Ursula-Process-Incarnation": {met.ProcessIncarnation}}, nil)
		if r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "TRANSFER_TARGET_NOT_ELIGIBLE") {
			t.Fatalf("a transfer to the drained node: %v, want 409 TRANSFER_TARGET_NOT_ELIGIBLE", r)
		}
		runCtl(t, m, none, "undrain", "--node", "2").want(t, 0, "")
		if got := shed(); got != "normal" {
			t.Fatalf("after undrain node 2's shed state is %q", got)
		}
		runCtl(t, m, none, "wait-ready").want(t, 0, "")
	})

	t.Run("binary", func(t *testing.T) {
		bin := ursulactlBinary(t)
		run := func(args ...string) (int, string, string) {
			cmd := exec.CommandContext(ctx, bin, args...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return code, out.String(), errb.String()
		}
		if code, out, _ := run("--help"); code != 0 || !strings.Contains(out, "2  aborted by a safety check") {
			t.Errorf("--help: exit %d:\n%s", code, out)
		}
		if code, out, errs := run("--manifest", m, "verify-cluster"); code != 0 {
			t.Errorf("verify-cluster: exit %d\n%s%s", code, out, errs)
		}
		code, _, errs := run("--manifest", m, "drain", "--node", "9")
		if code != 1 || errs != "ursulactl: error: node 9 is not in the manifest (nodes [1 2 3])\n" {
			t.Errorf("drain --node 9: exit %d, stderr %q", code, errs)
		}
	})
}

// ursulactlBinary returns bin/ursulactl ($URSULA_BIN_DIR), or builds it.
func ursulactlBinary(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvBinDir); d != "" {
		p, err := filepath.Abs(filepath.Join(d, "ursulactl"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ursulactl from $%s: %v (run make build)", EnvBinDir, err)
		}
		return p
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ursulactl")
	cmd := exec.Command("go", "build", "-o", out, "./ops/cmd/ursulactl")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./ops/cmd/ursulactl: %v\n%s", err, b)
	}
	return out
}

// Rolling restart workload.
const (
	rollWriters   = 6
	rollReaders   = 3
	rollRecord    = 12 // bytes per append: "wN-SSSSSSSS;"
	rollAppendMax = 90 * time.Second
	// rollSteady is how many appends each writer gets acknowledged before
	// the rollout, and again after it, at least.
	rollSteady = 25
)

// startWriters runs every writer until the returned function (which
// waits for them, and may be called more than once) stops them.
func startWriters(ctx context.Context, client *Client, writers []*rollWriter) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range writers {
		wg.Go(func() { w.run(ctx, client, i, stop) })
	}
	return sync.OnceFunc(func() { close(stop); wg.Wait() })
}

// rollWriter appends records to its own stream as one idempotent producer.
type rollWriter struct {
	stream string
	acked  int // appends acknowledged (200 or 204), in seq order
	ok200  int
	dup204 int
	retry  int // 503 answers retried
	// nextPos holds, for each 200, the seq and the byte position
	// Stream-Next-Offset named.
	nextPos map[int]uint64
	err     error
	// progress is acked and stopped is set when run returns, for reading
	// while the writer runs.
	progress atomic.Int64
	stopped  atomic.Bool
}

func rollRecordOf(w, seq int) []byte { return fmt.Appendf(nil, "w%d-%08d;", w, seq) }

// run appends until stop is closed, each append retried with the same
// producer tuple while the gateway answers 503 with Retry-After. Anything
// else is a failure and ends the writer.
func (w *rollWriter) run(ctx context.Context, client *Client, idx int, stop <-chan struct{}) {
	defer w.stopped.Store(true)
	w.nextPos = map[int]uint64{}
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		body := rollRecordOf(idx, seq)
		p := &Producer{ID: "roll-" + w.stream, Epoch: 0, Seq: uint64(seq)}
		deadline := time.Now().Add(rollAppendMax)
		retried := false
		for {
			resp, err := client.Append(ctx, w.stream, "text/plain", body, p)
			if err != nil {
				w.err = fmt.Errorf("append seq %d: %w", seq, err)
				return
			}
			if resp.Status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
				w.retry++
				retried = true
				if time.Now().After(deadline) {
					w.err = fmt.Errorf("append seq %d: still 503 after %v", seq, rollAppendMax)
					return
				}
				secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
				time.Sleep(min(time.Duration(max(secs, 0))*time.Second, 500*time.Millisecond) + 50*time.Millisecond)
				continue
			}
			switch {
			case resp.Status == http.StatusOK:
				off, err := ParseOffset(resp.NextOffset())
				if err != nil {
					w.err = fmt.Errorf("append seq %d: %w", seq, err)
					return
				}
				w.nextPos[seq] = off.Pos
				w.ok200++
			case resp.Status == http.StatusNoContent && retried:
				w.dup204++
			default:
				w.err = fmt.Errorf("append seq %d (retried %t): non-retriable answer %v", seq, retried, resp)
				return
			}
			w.acked++
			w.progress.Store(int64(w.acked))
			break
		}
		time.Sleep(10 * time.Millisecond) // pacing, not synchronization
	}
}

// loadCounts returns how many appends each writer has had acknowledged
// so far.
func loadCounts(writers []*rollWriter) []int64 {
	n := make([]int64, len(writers))
	for i, w := range writers {
		n[i] = w.progress.Load()
	}
	return n
}

// waitLoad waits until every writer has had n more appends acknowledged
// than from[i] (or stopped on an error): load flows, whatever the
// machine's speed.
func waitLoad(t testing.TB, writers []*rollWriter, from []int64, n int64, what string) {
	t.Helper()
	await.True(t, what, func() bool {
		for i, w := range writers {
			if !w.stopped.Load() && w.progress.Load() < from[i]+n {
				return false
			}
		}
		return true
	})
}

// sseReader follows a stream over SSE through the gateway from offset -1,
// reconnecting from the last control event's offset when a connection
// ends, and collects the data.
type sseReader struct {
	stream     string
	mu         sync.Mutex
	got        []byte
	reconnects int
	retries    int
	err        error
}

func (r *sseReader) length() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *sseReader) run(ctx context.Context, base string) {
	hc := &http.Client{} // no timeout: the connection lives until the gateway ends it
	offset := "-1"
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			r.reconnects++
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+StreamRoot+r.stream+"?offset="+offset+"&live=sse", nil)
		if err != nil {
			r.err = err
			return
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				r.err = fmt.Errorf("GET from %s: %w", offset, err)
			}
			return
		}
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
			resp.Body.Close()
			r.retries++
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r.err = fmt.Errorf("GET from %s: %s %q", offset, resp.Status, b)
			return
		}
		next, err := r.consume(resp.Body)
		resp.Body.Close()
		if next != "" {
			offset = next
		}
		if err != nil {
			r.err = err
			return
		}
	}
}

// consume reads one SSE response: data events are appended, each control
// event must name the byte position the data reached. It returns the last
// control event's offset; an error only for a broken order.
func (r *sseReader) consume(body io.Reader) (string, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var event string
	var data []string
	last := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			payload := strings.Join(data, "\n")
			switch event {
			case "data":
				r.mu.Lock()
				r.got = append(r.got, payload...)
				r.mu.Unlock()
			case "control":
				var ctl struct {
					NextOffset string `json:"streamNextOffset"`
				}
				if err := json.Unmarshal([]byte(payload), &ctl); err != nil {
					return last, fmt.Errorf("control event %q: %w", payload, err)
				}
				off, err := ParseOffset(ctl.NextOffset)
				if err != nil {
					return last, err
				}
				if n := r.length(); off.Pos != uint64(n) {
					return last, fmt.Errorf("control event names byte %d, but the data events so far hold %d bytes (a gap or a repeat)", off.Pos, n)
				}
				last = ctl.NextOffset
			}
			event, data = "", nil
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			d := strings.TrimPrefix(line, "data:")
			data = append(data, strings.TrimPrefix(d, " "))
		}
	}
	return last, nil // a dropped connection: reconnect from last
}

// TestUrsulactlRollout restarts every node of a 3-node cluster with
// `ursulactl rollout` (the restart hook: SIGTERM, then start the node
// again, through the harness) while idempotent producers append through
// the gateway and SSE readers follow some of the streams. No client may
// see a non-retriable answer (a 503 with Retry-After is retried with the
// same producer tuple), every acknowledged append must read back exactly
// once at its offset, from the gateway and from every node, the SSE
// readers must have seen every byte in order, and the leaderships must
// spread over every node again afterwards.
func TestUrsulactlRollout(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, Gateway: true})
	m := writeCtlManifest(t, c)
	ctx := t.Context()
	client := c.Client()

	writers := make([]*rollWriter, rollWriters)
	for i := range writers {
		writers[i] = &rollWriter{stream: fmt.Sprintf("roll-%d", i)}
		if resp, err := client.Create(ctx, writers[i].stream, "text/plain", nil); err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("create %s: %v %v", writers[i].stream, resp, err)
		}
	}
	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	readers := make([]*sseReader, rollReaders)
	var rwg sync.WaitGroup
	for i := range readers {
		readers[i] = &sseReader{stream: writers[i].stream}
		rwg.Go(func() { readers[i].run(rctx, c.GatewayURL()) })
	}
	stopWriters := startWriters(ctx, client, writers)
	defer stopWriters()
	// Load before the first drain: a while, and at least rollSteady
	// appends per writer however slow the machine is.
	time.Sleep(2 * time.Second) // pacing, not synchronization
	waitLoad(t, writers, make([]int64, len(writers)), rollSteady, "every writer's appends before the rollout")

	restarts := map[uint64]time.Duration{}
	restart := func(ctx context.Context, n ursulactl.Node) error {
		node := c.Node(n.ID)
		start := time.Now()
		if err := node.Terminate(60 * time.Second); err != nil {
			return err
		}
		restarts[n.ID] = time.Since(start)
		return node.Start()
	}
	start := time.Now()
	r := runCtl(t, m, ursulactl.Env{Restart: restart}, "rollout")
	took := time.Since(start)
	r.want(t, 0, "")
	// Load after the last undrain, likewise.
	rolled := loadCounts(writers)
	time.Sleep(2 * time.Second) // pacing, not synchronization
	waitLoad(t, writers, rolled, rollSteady, "every writer's appends after the rollout")
	stopWriters()
	t.Logf("rollout took %v; SIGTERM to exit per node: %v", took.Round(time.Millisecond), restarts)
	for _, id := range []uint64{1, 2, 3} {
		if !strings.Contains(r.stdout, fmt.Sprintf("rollout: node %d: done", id)) {
			t.Errorf("rollout did not report node %d done", id)
		}
	}

	// Writers: no non-retriable answer; every acknowledged append exactly
	// once at its offset.
	for i, w := range writers {
		if w.err != nil {
			t.Errorf("writer %d (%s): %v", i, w.stream, w.err)
		}
		t.Logf("writer %d: %d appends acknowledged (%d × 200, %d × 204 after a retry), %d answers 503 retried", i, w.acked, w.ok200, w.dup204, w.retry)
	}
	want := make([][]byte, len(writers))
	for i, w := range writers {
		for seq := range w.acked {
			want[i] = append(want[i], rollRecordOf(i, seq)...)
			if pos, ok := w.nextPos[seq]; ok && pos != uint64((seq+1)*rollRecord) {
				t.Errorf("writer %d seq %d: 200 named byte %d, want %d", i, seq, pos, (seq+1)*rollRecord)
			}
		}
		got, _, err := client.ReadAll(ctx, w.stream)
		if err != nil {
			t.Errorf("read %s: %v", w.stream, err)
			continue
		}
		if !bytes.Equal(got, want[i]) {
			t.Errorf("stream %s through the gateway: %d bytes, want %d (the acknowledged appends, each once, in order)", w.stream, len(got), len(want[i]))
		}
	}
	vctx, cancel := context.WithTimeout(ctx, catchUpBudget)
	defer cancel()
	for _, n := range c.Nodes {
		sc, err := n.StreamClient()
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range writers {
			got, _, err := WaitReadRange(vctx, sc, w.stream, 0, uint64(len(want[i])))
			if err != nil {
				t.Errorf("node %d: %v", n.ID, err)
			} else if !bytes.Equal(got, want[i]) {
				t.Errorf("node %d: stream %s differs from the acknowledged appends", n.ID, w.stream)
			}
		}
	}

	// SSE readers: every byte, in order, once the tail reached them (a
	// reader that fails stops short; the checks below report it).
	await.Until(await.DefaultTimeout, func() bool {
		for i, rd := range readers {
			if rd.length() < len(want[i]) {
				return false
			}
		}
		return true
	})
	stopReaders()
	rwg.Wait()
	for i, rd := range readers {
		if rd.err != nil {
			t.Errorf("SSE reader of %s: %v", rd.stream, rd.err)
		}
		if !bytes.Equal(rd.got, want[i]) {
			t.Errorf("SSE reader of %s: saw %d bytes, want %d (every acknowledged append in order)", rd.stream, len(rd.got), len(want[i]))
		}
		t.Logf("SSE reader of %s: %d bytes, %d reconnects, %d 503 retries", rd.stream, len(rd.got), rd.reconnects, rd.retries)
	}

	// Leaderships spread again: the balancer moves them within seconds.
	waitSpread(t, m, false)
	runCtl(t, m, ursulactl.Env{}, "verify-cluster").want(t, 0, "")
}
