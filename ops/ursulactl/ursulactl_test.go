package ursulactl

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ursula/ursula/tests/await"
)

// fastArgs keep the fake-cluster runs short.
var fastArgs = []string{"--poll", "10ms", "--timeout", "10s"}

func cli(manifest string, args ...string) []string {
	return append(append([]string{"--manifest", manifest}, fastArgs...), args...)
}

// checkErrLine checks the error convention: one line, greppable prefix,
// last on stderr (after any progress lines).
func checkErrLine(t *testing.T, stderr, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasSuffix(stderr, "\n") || !strings.HasPrefix(last, "ursulactl: error: ") || strings.Count(stderr, "ursulactl: error: ") != 1 {
		t.Errorf("stderr does not end in one 'ursulactl: error: ' line: %q", stderr)
	}
	if !strings.Contains(stderr, want) {
		t.Errorf("stderr %q does not mention %q", stderr, want)
	}
}

func TestStatus(t *testing.T) {
	c := newFakeCluster(t, 3, 6)
	c.set(func() {
		c.nodes[2].ready, c.nodes[2].reason = false, "groups_not_ready"
		c.nodes[3].down = true
		c.leaders[5] = 0
	})
	m := c.manifest(t, "")
	code, out, _ := runCLI(t, Env{}, cli(m, "status")...)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"unreachable", "groups_not_ready", "inc-1-a", "leadership spread over 6 groups: node 1: 2, node 2: 2, node 3: 0", "groups without a leader: [2,5]"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not show %q", want)
		}
	}

	code, out, _ = runCLI(t, Env{}, cli(m, "status", "--json")...)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var st ClusterStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 3 || !st.Nodes[0].Ready || st.Nodes[0].Leaderships != 2 || st.Nodes[1].Ready ||
		st.Nodes[1].Reason != "groups_not_ready" || st.Nodes[2].Reachable || st.Nodes[2].Error == "" {
		t.Errorf("status --json nodes = %+v", st.Nodes)
	}
	if !slices.Equal(st.GroupsWithoutLeader, []uint32{2, 5}) || st.Leaderships[1] != 2 {
		t.Errorf("status --json = %+v", st)
	}
}

func TestVerifyCluster(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	if code, out, _ := runCLI(t, Env{}, cli(m, "verify-cluster")...); code != 0 || !strings.Contains(out, "cluster healthy") {
		t.Fatalf("healthy cluster: exit %d", code)
	}
	c.set(func() { c.nodes[3].ready = false; c.nodes[3].reason = "recovery_gate_closed"; c.leaders[1] = 0 })
	code, out, errs := runCLI(t, Env{}, cli(m, "verify-cluster")...)
	if code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	for _, want := range []string{"problem: node 3: not ready: recovery_gate_closed", "problem: group 1: no leader"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout does not list %q", want)
		}
	}
	checkErrLine(t, errs, "verify-cluster: 2 problems")
}

func TestWaitReady(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	// Node 2 answers "not ready" to two probes, so the command is seen to
	// wait, then it is ready.
	c.set(func() { c.nodes[2].ready, c.nodes[2].notReady = false, 2 })
	m := c.manifest(t, "")
	if code, _, _ := runCLI(t, Env{}, cli(m, "wait-ready")...); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Never ready: the wait ends with the problem its last complete
	// observation found. The timeout only needs room for one observation
	// on a busy machine; nothing changes during it.
	c.set(func() { c.nodes[2].ready = false })
	code, _, errs := runCLI(t, Env{}, cli(m, "wait-ready", "--timeout", "1s")...)
	if code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	checkErrLine(t, errs, "node 2: not ready")
}

func TestDrainUndrain(t *testing.T) {
	c := newFakeCluster(t, 3, 9)
	m := c.manifest(t, "")
	code, out, _ := runCLI(t, Env{}, cli(m, "drain", "--node", "1")...)
	if code != 0 {
		t.Fatalf("drain: exit %d", code)
	}
	if led := c.led(1); len(led) != 0 {
		t.Errorf("node 1 still leads %v", led)
	}
	// Spread: node 1's three groups went to the two others, 4 and 5.
	if a, b := len(c.led(2)), len(c.led(3)); a+b != 9 || a < 4 || b < 4 {
		t.Errorf("after the drain node 2 leads %d and node 3 %d groups", a, b)
	}
	muts := c.mutationsOf(1)
	if len(muts) == 0 || muts[0] != "POST /__ursula/leadership-shed/maintenance" {
		t.Errorf("mutations of node 1 = %v, want the mark first", muts)
	}
	if !strings.Contains(out, "drained: it leads no group") {
		t.Errorf("drain output = %q", out)
	}
	if code, _, _ := runCLI(t, Env{}, cli(m, "undrain", "--node", "1")...); code != 0 {
		t.Fatalf("undrain: exit %d", code)
	}
	c.set(func() {
		if c.nodes[1].draining {
			t.Errorf("node 1 still draining after undrain")
		}
	})
}

func TestDrainSafety(t *testing.T) {
	t.Run("another node unready", func(t *testing.T) {
		c := newFakeCluster(t, 3, 6)
		c.set(func() { c.nodes[3].ready = false; c.nodes[3].reason = "groups_not_ready" })
		code, _, errs := runCLI(t, Env{}, cli(c.manifest(t, ""), "drain", "--node", "1")...)
		if code != ExitAborted {
			t.Errorf("exit %d, want %d", code, ExitAborted)
		}
		checkErrLine(t, errs, "aborted: node 3 is not ready (groups_not_ready); refusing to drain node 1")
		if muts := c.mutationsOf(1); len(muts) != 0 {
			t.Errorf("mutations sent: %v", muts)
		}
	})
	t.Run("no eligible target", func(t *testing.T) {
		c := newFakeCluster(t, 3, 4)
		c.set(func() { c.nodes[2].draining, c.nodes[3].draining = true, true })
		code, _, errs := runCLI(t, Env{}, cli(c.manifest(t, ""), "drain", "--node", "1")...)
		if code != ExitAborted {
			t.Errorf("exit %d, want %d", code, ExitAborted)
		}
		checkErrLine(t, errs, "no voter may take its leadership from node 1: node 2 is draining (maintenance-drain); node 3 is draining")
	})
	t.Run("restart between pin and mark: 412", func(t *testing.T) {
		c := newFakeCluster(t, 3, 6)
		hooks := Hooks{Pinned: func(_ context.Context, node uint64) error {
			c.restart(node)
			return nil
		}}
		code, _, errs := runCLI(t, Env{Hooks: hooks}, cli(c.manifest(t, ""), "drain", "--node", "1")...)
		if code != ExitAborted {
			t.Errorf("exit %d, want %d", code, ExitAborted)
		}
		checkErrLine(t, errs, "node 1 answered 412")
		if muts := c.mutationsOf(1); len(muts) != 0 {
			t.Errorf("the fake applied %v", muts)
		}
	})
	t.Run("restart during the handoffs", func(t *testing.T) {
		c := newFakeCluster(t, 3, 6)
		c.set(func() { c.stuck = true }) // transfers are accepted, nothing moves
		hooks := Hooks{Pinned: func(context.Context, uint64) error {
			// Restart node 1 once it is marked draining, while the
			// handoffs wait.
			go func() {
				await.Until(await.DefaultTimeout, func() bool { return len(c.mutationsOf(1)) > 0 })
				c.restart(1)
			}()
			return nil
		}}
		code, _, errs := runCLI(t, Env{Hooks: hooks}, cli(c.manifest(t, ""), "drain", "--node", "1")...)
		if code != ExitAborted {
			t.Errorf("exit %d, want %d", code, ExitAborted)
		}
		// Whichever comes first: the next metrics read or the next transfer.
		if !strings.Contains(errs, "node 1 restarted during the operation") && !strings.Contains(errs, "node 1 answered 412") {
			t.Errorf("stderr = %q", errs)
		}
	})
}

func TestIncarnationAnswers(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	c.set(func() {
		c.nodes[2].override["DELETE /__ursula/leadership-shed/maintenance"] = []fake{{status: 428, body: `{"code":"INCARNATION_REQUIRED","message":"x"}`}}
	})
	code, _, errs := runCLI(t, Env{}, cli(m, "undrain", "--node", "2")...)
	if code != ExitAborted {
		t.Errorf("428: exit %d, want %d", code, ExitAborted)
	}
	checkErrLine(t, errs, "428")

	// The header carries the incarnation of the one metrics read.
	if code, _, _ := runCLI(t, Env{}, cli(m, "undrain", "--node", "3")...); code != 0 {
		t.Fatalf("exit %d", code)
	}
	c.set(func() {
		h := c.nodes[3].headers
		if got := h[len(h)-1].Get(IncarnationHeader); got != "inc-3-a" {
			t.Errorf("%s = %q, want inc-3-a", IncarnationHeader, got)
		}
	})
}

func TestAdminToken(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	const tok = "0123456789abcdef0123456789abcdef"
	c.set(func() {
		for _, n := range c.nodes {
			n.token = tok
		}
	})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := c.manifest(t, "")
	code, _, errs := runCLI(t, Env{}, cli(m, "undrain", "--node", "1")...)
	if code != ExitError {
		t.Errorf("without a token: exit %d, want %d", code, ExitError)
	}
	checkErrLine(t, errs, "401")

	withTok := c.manifest(t, "admin_token_file = "+`"`+filepath.Join(dir, "admin.token")+`"`)
	c.set(func() { c.nodes[1].headers = nil })
	if code, _, _ := runCLI(t, Env{}, cli(withTok, "drain", "--node", "1")...); code != 0 {
		t.Fatalf("with the token: exit %d", code)
	}
	c.set(func() {
		for _, h := range c.nodes[1].headers {
			if got := h.Get("Authorization"); got != "Bearer "+tok {
				t.Errorf("Authorization = %q", got)
			}
		}
	})

	missing := c.manifest(t, `admin_token_file = "no-such-file"`)
	code, _, errs = runCLI(t, Env{}, cli(missing, "undrain", "--node", "1")...)
	if code != ExitError {
		t.Errorf("missing token file: exit %d", code)
	}
	checkErrLine(t, errs, "read admin_token_file")
}

func TestThinVerbs(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	complete := `{"bucket":"b","removed_streams":1,"groups_with_streams":[0],"cold_gc_entries_reclaimed":1,"cold_gc_pending_entries":0,"cold_gc_complete":true,"cold_gc_error":null,"bucket_prefix_absent":true}`
	incomplete := `{"bucket":"b","removed_streams":1,"groups_with_streams":[0],"cold_gc_entries_reclaimed":1,"cold_gc_pending_entries":3,"cold_gc_complete":false,"cold_gc_error":null,"bucket_prefix_absent":false}`
	tests := []struct {
		name     string
		args     []string
		override map[string][]fake
		code     int
		mutation string // on node 1
		stderr   string
	}{
		{name: "snapshot", args: []string{"snapshot", "--node", "1", "--group", "2"}, mutation: "POST /__ursula/raft/2/snapshot"},
		{name: "snapshot retried on 503", args: []string{"snapshot", "--node", "1", "--group", "2"},
			override: map[string][]fake{"POST /__ursula/raft/2/snapshot": {{status: 503, header: map[string]string{"Retry-After": "0"}, body: `{"code":"UNAVAILABLE","message":"building"}`}, {status: 503, header: map[string]string{"Retry-After": "1"}, body: `{"code":"UNAVAILABLE","message":"building"}`}, {status: 200, body: `{"snapshot_index":7}`}}},
			mutation: "POST /__ursula/raft/2/snapshot"},
		{name: "snapshot of an unknown group", args: []string{"snapshot", "--node", "1", "--group", "9"}, code: ExitError, stderr: "reports no group 9"},
		{name: "purge-log", args: []string{"purge-log", "--yes", "--node", "1", "--group", "0", "--upto", "1000"}, mutation: "POST /__ursula/raft/0/purge?upto=1000"},
		{name: "transfer", args: []string{"transfer", "--node", "1", "--group", "0", "--to", "2"}, mutation: "POST /__ursula/raft/0/leader/transfer/2"},
		{name: "transfer from a follower", args: []string{"transfer", "--node", "1", "--group", "1", "--to", "3"}, code: ExitAborted, stderr: "node 1 does not lead group 1"},
		{name: "transfer to a non-voter", args: []string{"transfer", "--node", "1", "--group", "3", "--to", "7"}, code: ExitAborted, stderr: "node 7 may not take group 3"},
		{name: "membership", args: []string{"membership", "--node", "1", "--group", "0", "--voters", "1,2,3"}, mutation: "POST /__ursula/raft/0/membership?voters=1,2,3"},
		{name: "membership with a stranger", args: []string{"membership", "--node", "1", "--group", "0", "--voters", "1,2,9"}, code: ExitAborted, stderr: "voter 9 is not in the manifest"},
		{name: "membership on a follower", args: []string{"membership", "--node", "1", "--group", "1", "--voters", "1,2,3"}, code: ExitAborted, stderr: "does not lead group 1"},
		{name: "flush-cold", args: []string{"flush-cold", "--node", "1", "--bucket", "__ds", "--stream", "a/b c"}, mutation: "POST /__ursula/flush-cold/__ds/a/b%20c"},
		{name: "flush-cold on a follower", args: []string{"flush-cold", "--node", "1", "--bucket", "b", "--stream", "s"},
			override: map[string][]fake{"POST /__ursula/flush-cold/b/s": {{status: 409, body: `{"code":"NOT_LEADER","message":"not leader","leader_id":2}`}}},
			code:     ExitError, stderr: "send it to node 2"},
		{name: "purge-bucket complete", args: []string{"purge-bucket", "--yes", "--node", "1", "--bucket", "b"},
			override: map[string][]fake{"DELETE /__ursula/purge/b": {{status: 200, body: complete}}}, mutation: "DELETE /__ursula/purge/b"},
		{name: "purge-bucket incomplete", args: []string{"purge-bucket", "--yes", "--node", "1", "--bucket", "b"},
			override: map[string][]fake{"DELETE /__ursula/purge/b": {{status: 200, body: incomplete}}},
			code:     ExitError, stderr: "does not prove completion (cold_gc_complete is false, cold_gc_pending_entries is 3, bucket_prefix_absent is false)"},
		{name: "missing --node", args: []string{"snapshot", "--group", "1"}, code: ExitError, stderr: `required flag(s) "node" not set`},
		{name: "node not in the manifest", args: []string{"undrain", "--node", "8"}, code: ExitError, stderr: "node 8 is not in the manifest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.set(func() {
				c.leaders = []uint64{1, 2, 3, 1}
				for _, n := range c.nodes {
					n.mutations = nil
					n.override = map[string][]fake{}
				}
				for k, v := range tt.override {
					c.nodes[1].override[k] = v
				}
			})
			code, _, errs := runCLI(t, Env{}, cli(m, tt.args...)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if tt.stderr != "" {
				checkErrLine(t, errs, tt.stderr)
			} else if errs != "" {
				t.Errorf("stderr = %q", errs)
			}
			muts := c.mutationsOf(1)
			if tt.mutation != "" && !slices.Contains(muts, tt.mutation) {
				t.Errorf("mutations of node 1 = %v, want %q", muts, tt.mutation)
			}
			if tt.mutation == "" && len(muts) > 0 && tt.override == nil {
				t.Errorf("mutations of node 1 = %v, want none", muts)
			}
		})
	}
}

func TestWaitNode(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	// Node 2 answers "not ready" to two probes, then it is ready.
	c.set(func() { c.nodes[2].ready, c.nodes[2].notReady = false, 2 })
	code, out, _ := runCLI(t, Env{}, cli(m, "wait", "--node", "2")...)
	if code != 0 || !strings.Contains(out, "node 2: ready, a voter of all 4 groups and caught up") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	c.set(func() { c.nodes[2].down = true })
	code, _, errs := runCLI(t, Env{}, cli(m, "wait", "--node", "2", "--timeout", "100ms")...)
	if code != ExitError {
		t.Errorf("exit %d", code)
	}
	checkErrLine(t, errs, "wait node 2: not back")
}

func TestRollout(t *testing.T) {
	c := newFakeCluster(t, 3, 6)
	m := c.manifest(t, "")
	var restarted []uint64
	restart := func(_ context.Context, n Node) error {
		if len(c.led(n.ID)) != 0 {
			t.Errorf("node %d restarted while it leads %v", n.ID, c.led(n.ID))
		}
		restarted = append(restarted, n.ID)
		c.restart(n.ID)
		return nil
	}
	code, out, _ := runCLI(t, Env{Restart: restart}, cli(m, "rollout")...)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !slices.Equal(restarted, []uint64{1, 2, 3}) {
		t.Errorf("restarted %v", restarted)
	}
	if !strings.Contains(out, "rollout: all 3 nodes restarted") {
		t.Errorf("output %q", out)
	}

	// A restart command that does not restart anything is caught.
	code, _, errs := runCLI(t, Env{Restart: func(context.Context, Node) error { return nil }}, cli(m, "rollout")...)
	if code != ExitError {
		t.Errorf("no-op restart: exit %d", code)
	}
	checkErrLine(t, errs, "node 1 was not restarted")
	c.set(func() { c.nodes[1].draining = false })

	// An unready node stops the rollout before anything changes.
	c.set(func() { c.nodes[3].ready = false })
	code, _, errs = runCLI(t, Env{Restart: restart}, cli(m, "rollout", "--settle", "100ms")...)
	if code != ExitAborted {
		t.Errorf("unready node: exit %d", code)
	}
	checkErrLine(t, errs, "rollout stopped before node 1")
}

func TestCommandRestart(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	f, err := CommandRestart("echo {node} {id} >> "+out, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []Node{{ID: 1, Name: "ursula-0"}, {ID: 2}} {
		if err := f(t.Context(), n); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(out)
	if string(b) != "ursula-0 1\n2 2\n" {
		t.Errorf("commands wrote %q", b)
	}
	fail, _ := CommandRestart("exit 3 # {id}", os.Stderr)
	if err := fail(t.Context(), Node{ID: 1}); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("failing command: %v", err)
	}
	if _, err := CommandRestart("systemctl restart ursula", os.Stderr); err == nil {
		t.Error("a command naming no node was accepted")
	}
}

func TestHelpDocumentsExitCodes(t *testing.T) {
	code, out, _ := runCLI(t, Env{}, "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"Exit codes:", "0  done", "1  other errors", "2  aborted by a safety check", "drain", "rollout", "purge-bucket", "verify-cluster"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
	code, _, errs := runCLI(t, Env{}, "--manifest", filepath.Join(t.TempDir(), "none.toml"), "status")
	if code != ExitError {
		t.Errorf("missing manifest: exit %d", code)
	}
	checkErrLine(t, errs, "read manifest")

	c := newFakeCluster(t, 3, 4)
	code, _, errs = runCLI(t, Env{}, cli(c.manifest(t, ""), "rollout")...)
	if code != ExitError {
		t.Errorf("rollout without --restart-cmd: exit %d", code)
	}
	checkErrLine(t, errs, "rollout needs --restart-cmd")
}

// TestProgressOnTTY: with a terminal on stderr, waits draw a progress bar
// with what they wait for there; the result line goes to stdout.
func TestProgressOnTTY(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	c.set(func() { c.nodes[2].ready, c.nodes[2].reason = false, "groups_not_ready" })
	// Node 2 stays unready until the bar has shown why (bars are redrawn
	// at most every 100 ms), then the wait ends.
	m := c.manifest(t, "")
	tty := true
	var out bytes.Buffer
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(t.Context(), cli(m, "wait-ready"), Env{Stdout: &out, Stderr: &errb, TTY: &tty})
	}()
	await.True(t, "the bar to show node 2 not ready", func() bool {
		return strings.Contains(errb.String(), "node 2: not ready: groups_not_ready")
	})
	c.set(func() { c.nodes[2].ready = true })
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "\r") {
		t.Errorf("no bar drawn on the terminal: %q", errb.String())
	}
	if out.String() != "cluster ready: 3 nodes ready, every group led, every node a caught-up voter of every group\n" {
		t.Errorf("stdout %q: want only the result line", out.String())
	}
}

// syncBuffer is a bytes.Buffer that a command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
