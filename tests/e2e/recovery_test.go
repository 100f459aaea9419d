package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/ops/ursulactl"
	"github.com/ursula/ursula/tests/await"
)

// TestRecoverGroupAfterMajorityPowerLoss: every node of a three-node
// cluster is stopped with SIGKILL and the tail of each node's active
// journal segments is cut, as a lost page cache would (fsync "never"). The
// nodes come back with every group gated; nobody can elect a leader, so
// every gate reports its group stalled (readiness recovery_stalled). Then
// ursulactl recover-group diagnoses, plans and applies a plan per group:
// a stale proof writes nothing (exit 3), the reviewed one completes, the
// same proof again writes nothing; the audit trail holds the apply; every
// stream serves again under a new Stream-Incarnation that names the old
// one, holding a prefix of what was acknowledged.
func TestRecoverGroupAfterMajorityPowerLoss(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 2, Gateway: true})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := c.Client()
	streams := []string{"recover/a", "recover/b", "recover/c", "recover/d"}
	want, before := fillStreams(ctx, t, client, streams, 40)

	for _, n := range c.Nodes {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		cutJournalTails(t, n.Config.DataDir)
	}
	for _, n := range c.Nodes {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		waitReason(ctx, t, n, "recovery_stalled")
	}

	manifest := writeCtlManifest(t, c)
	// Group 1 is recovered with the seed's own curl/jq script, group 0 with
	// ursulactl recover-group.
	runSeedScript(ctx, t, c, 1)
	for g := range 1 {
		group := fmt.Sprint(g)
		runCtl(t, manifest, ursulactl.Env{}, "recover-group", "diagnose", "--group", group).want(t, 0, "")
		plan := runCtl(t, manifest, ursulactl.Env{}, "recover-group", "plan", "--group", group)
		plan.want(t, 0, "")
		proof := planProof(t, plan.stdout)
		if !strings.Contains(plan.stdout, "consequences:") || strings.Index(plan.stdout, "consequences:") > strings.Index(plan.stdout, "bindings") {
			t.Errorf("the plan does not print its consequences first:\n%s", plan.stdout)
		}
		stale := strings.Repeat("0", 64)
		runCtl(t, manifest, ursulactl.Env{}, "--yes", "recover-group", "apply", "--group", group, "--expect-proof", stale,
			"--actor", "e2e", "--reason", "stale proof").want(t, ursulactl.ExitProofMismatch, "nothing was written")
		for _, n := range c.Nodes {
			if m, err := n.Metrics(ctx); err == nil && m.Group(uint32(g)) != nil && m.Group(uint32(g)).Recovery != nil {
				t.Fatalf("node %d holds a plan after a refused apply", n.ID)
			}
		}
		runCtl(t, manifest, ursulactl.Env{}, "--actor", "e2e", "--reason", "majority power loss drill",
			"--yes", "recover-group", "apply", "--group", group, "--expect-proof", proof).want(t, 0, "")
		again := runCtl(t, manifest, ursulactl.Env{}, "--actor", "e2e", "--reason", "again",
			"--yes", "recover-group", "apply", "--group", group, "--expect-proof", proof)
		again.want(t, 0, "")
		if !strings.Contains(again.stdout, "already completed") {
			t.Errorf("the same proof again did not report the completed operation:\n%s", again.stdout)
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx); err != nil {
			t.Fatalf("node %d not ready after the recovery: %v", n.ID, err)
		}
	}
	audited := false
	for _, n := range c.Nodes {
		r := runCtlLog(t, manifest, ursulactl.Env{}, false, "audit", "--node", fmt.Sprint(n.ID))
		if strings.Contains(r.stdout, "accept-unsynced-loss") && strings.Contains(r.stdout, `"actor":"e2e"`) && strings.Contains(r.stdout, "majority power loss drill") {
			audited = true
		}
	}
	if !audited {
		t.Error("no node's audit trail records the apply with its actor and reason")
	}

	lost := 0
	for _, s := range streams {
		resp, err := client.Do(ctx, http.MethodHead, s, nil, nil, nil)
		if err != nil || resp.Status != 200 {
			t.Fatalf("HEAD %s after the recovery: %v %v", s, resp, err)
		}
		inc, prev := resp.Header.Get("Stream-Incarnation"), resp.Header.Get("Stream-Previous-Incarnation")
		if inc == before[s] || prev != before[s] || resp.Header.Get("Stream-Inherited-Offset") == "" {
			t.Errorf("%s: incarnation %q (before %q), previous %q, inherited %q", s, inc, before[s], prev, resp.Header.Get("Stream-Inherited-Offset"))
		}
		got, _, err := client.ReadAll(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(want[s], got) {
			t.Fatalf("%s: the new history is not a prefix of what was acknowledged:\n got %q", s, got)
		}
		lost += len(want[s]) - len(got)
		if resp, err := client.Append(ctx, s, "text/plain", []byte("after;"), nil); err != nil || resp.Status != 204 && resp.Status != 200 {
			t.Errorf("append to %s after the recovery: %v %v", s, resp, err)
		}
	}
	t.Logf("the plans kept a prefix of every stream; %d acknowledged bytes were in no surviving log", lost)
}

// cutJournalTails cuts the last quarter of the newest segment of every
// journal shard in dataDir (the part a lost page cache would take), never
// below what the node synced.
func cutJournalTails(t *testing.T, dataDir string) {
	t.Helper()
	if _, err := CutJournalTail(dataDir, 0.25, func(room int64) int64 { return room }); err != nil {
		t.Fatal(err)
	}
}

// TestEveryNodeKilledOnItsHost: every node of a three-node cluster
// (fsync "never") is stopped with SIGKILL while the host keeps running, so
// the page cache keeps every write ("a process crash loses nothing"). The
// nodes come back ready without any operator step: no group gated or
// stalled, no wal_recovery, every stream under its incarnation with every
// acknowledged byte, and appends go on.
func TestEveryNodeKilledOnItsHost(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 2, Gateway: true})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client := c.Client()
	streams := []string{"killed/a", "killed/b", "killed/c", "killed/d"}
	want, before := fillStreams(ctx, t, client, streams, 40)
	for _, n := range c.Nodes {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx); err != nil {
			t.Fatalf("node %d not ready after its process was killed: %v", n.ID, err)
		}
		m, err := n.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.WALRecovery {
			t.Errorf("node %d reports wal_recovery after a crash of its process alone", n.ID)
		}
	}
	for _, s := range streams {
		// Ready nodes do not mean a gateway that has found every group's
		// new leader: until it has, a 503 (retry later) is the right
		// answer, and anything else is not.
		var resp *Response
		var err error
		await.True(t, "HEAD "+s+" answered 200 after the restart", func() bool {
			resp, err = client.Do(ctx, http.MethodHead, s, nil, nil, nil)
			if err == nil && resp.Status == http.StatusServiceUnavailable {
				return false
			}
			return true
		})
		if err != nil || resp.Status != 200 {
			t.Fatalf("HEAD %s after the restart: %v %v", s, resp, err)
		}
		if inc := resp.Header.Get("Stream-Incarnation"); inc != before[s] {
			t.Errorf("%s: incarnation %q after the restart, want %q", s, inc, before[s])
		}
		got, _, err := client.ReadAll(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[s]) {
			t.Fatalf("%s after the restart:\n got %q\nwant %q", s, got, want[s])
		}
		if resp, err := client.Append(ctx, s, "text/plain", []byte("after;"), nil); err != nil || resp.Status != 204 && resp.Status != 200 {
			t.Errorf("append to %s after the restart: %v %v", s, resp, err)
		}
	}
}

// fillStreams creates streams and appends rounds numbered bodies to each,
// returning what each acknowledged and its Stream-Incarnation.
func fillStreams(ctx context.Context, t *testing.T, client *Client, streams []string, rounds int) (want map[string][]byte, incarnation map[string]string) {
	t.Helper()
	want, incarnation = map[string][]byte{}, map[string]string{}
	for _, s := range streams {
		if resp, err := client.Create(ctx, s, "text/plain", nil); err != nil || resp.Status != 201 {
			t.Fatalf("create %s: %v %v", s, resp, err)
		}
	}
	for i := range rounds {
		for _, s := range streams {
			body := fmt.Appendf(nil, "%s-%03d;", s, i)
			if resp, err := client.Append(ctx, s, "text/plain", body, nil); err != nil || resp.Status != 204 && resp.Status != 200 {
				t.Fatalf("append: %v %v", resp, err)
			}
			want[s] = append(want[s], body...)
		}
	}
	for _, s := range streams {
		resp, err := client.Do(ctx, http.MethodHead, s, nil, nil, nil)
		if err != nil || resp.Status != 200 {
			t.Fatalf("HEAD %s: %v %v", s, resp, err)
		}
		incarnation[s] = resp.Header.Get("Stream-Incarnation")
	}
	return want, incarnation
}

// waitReason waits until n's readiness answers reason.
func waitReason(ctx context.Context, t *testing.T, n *Node, reason string) {
	t.Helper()
	last := ""
	for {
		if r, err := n.Readiness(ctx); err == nil {
			if r.Reason == reason {
				return
			}
			last = r.Reason
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %d readiness: %q, want %q", n.ID, last, reason)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// planProof is the proof on a plan's last line.
func planProof(t *testing.T, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "proof ") {
		t.Fatalf("the plan's last line is not its proof: %q", last)
	}
	return strings.TrimPrefix(last, "proof ")
}

// runSeedScript runs the seed's by-hand recovery of group g
// (testdata/seed_recovery.sh) against the cluster's admin planes, with jq
// from bin/gojq (make test-e2e builds it) or the system's jq.
func runSeedScript(ctx context.Context, t *testing.T, c *Cluster, g int) {
	t.Helper()
	jq := filepath.Join(os.Getenv(EnvBinDir), "gojq")
	if _, err := os.Stat(jq); err != nil {
		if jq, err = exec.LookPath("jq"); err != nil {
			t.Fatalf("no jq: build bin/gojq (make test-e2e does) or install jq")
		}
	}
	tools := t.TempDir()
	if err := os.Symlink(jq, filepath.Join(tools, "jq")); err != nil {
		t.Fatal(err)
	}
	var admins, tokens []string
	for _, n := range c.Nodes {
		admins = append(admins, "http://"+n.Config.AdminListen)
		tokens = append(tokens, n.AdminTokenFile())
	}
	script, err := filepath.Abs(filepath.Join("testdata", "seed_recovery.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(), "PATH="+tools+":"+os.Getenv("PATH"), "GROUP="+fmt.Sprint(g),
		"ADMINS="+strings.Join(admins, " "), "TOKENS="+strings.Join(tokens, " "), "WORKDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("the seed's script for group %d: %v\n%s", g, err, out)
	// The script stops at the first refusal; a replica that already follows
	// the plan's leader (elected by the replicas that took the plan) refuses
	// with follows_leader and rejoins through it, as the seed says.
	if err != nil && !strings.Contains(string(out), `"reason":"follows_leader"`) {
		t.Fatalf("the seed's recovery script failed for group %d", g)
	}
	if !strings.Contains(string(out), `"outcome":"leads"`) {
		t.Fatalf("the seed's script did not make a plan's leader for group %d", g)
	}
}

// TestRecoverGroupAfterTwoOfThreeLosePower: two voters of three are
// stopped with SIGKILL and lose the tails of their journals; the third
// kept everything but cannot be elected without a gated vote, so every
// group stalls on the two. ursulactl recover-group applies a plan per
// group; the survivor, which takes no gate, votes the plan's leader in
// before its own step (it then follows it, an expected result, not a
// divergence), and nothing acknowledged is lost.
func TestRecoverGroupAfterTwoOfThreeLosePower(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := c.Client()
	streams := []string{"two/a", "two/b", "two/c", "two/d", "two/e", "two/f"}
	want, _ := fillStreams(ctx, t, client, streams, 30)
	lost := c.Nodes[1:]
	for _, n := range lost {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
		cutJournalTails(t, n.Config.DataDir)
	}
	for _, n := range lost {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range lost {
		waitReason(ctx, t, n, "recovery_stalled")
	}
	manifest := writeCtlManifest(t, c)
	for g := range c.GroupCount() {
		group := fmt.Sprint(g)
		plan := runCtlLog(t, manifest, ursulactl.Env{}, false, "recover-group", "plan", "--group", group)
		plan.want(t, 0, "")
		runCtl(t, manifest, ursulactl.Env{}, "--actor", "e2e", "--reason", "two of three lost power",
			"--yes", "recover-group", "apply", "--group", group, "--expect-proof", planProof(t, plan.stdout)).want(t, 0, "")
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx); err != nil {
			t.Fatalf("node %d not ready after the recovery: %v", n.ID, err)
		}
	}
	// The survivor held every acknowledged write and led every plan's
	// point: nothing is lost.
	for _, s := range streams {
		got, _, err := client.ReadAll(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[s]) {
			t.Errorf("%s after the recovery:\n got %q\nwant %q", s, got, want[s])
		}
	}
}
