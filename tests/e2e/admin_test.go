package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// The seed's "Admin endpoints" examples, exactly as written there (lines
// 49-76 of the operations page). The test adapts only what must differ on
// its cluster: the host and port (each node's admin listener), the group
// ids (42 → a group of the 16 the test cluster has, chosen for who leads
// it) and node ids (the learner 4 → node 4 of the test cluster, prepared
// but not started; the transfer target 2 → a voter that does not lead the
// group). The recovery-plan examples (POST .../recovery/accept-unsynced-loss)
// are left out: that endpoint is not part of this issue.
const (
	seedPinIncarnation = `process_incarnation=$(curl --fail http://127.0.0.1:4438/__ursula/metrics | jq -er .process_incarnation)`
	seedFlushCold      = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST http://127.0.0.1:4438/__ursula/flush-cold/demo/hello`
	seedSnapshot       = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST http://127.0.0.1:4438/__ursula/raft/42/snapshot`
	seedPurge          = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST "http://127.0.0.1:4438/__ursula/raft/42/purge?upto=1000"`
	seedAddLearner     = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST "http://127.0.0.1:4438/__ursula/raft/42/learners/4?addr=http://node-4:4439&blocking=false"`
	seedTransfer       = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST http://127.0.0.1:4438/__ursula/raft/42/leader/transfer/2`
	seedMembership     = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST "http://127.0.0.1:4438/__ursula/raft/42/membership?voters=1,2,3"`
	seedDrainOn        = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X POST http://127.0.0.1:4438/__ursula/leadership-shed/maintenance`
	seedDrainOff       = `curl --fail -H "x-ursula-process-incarnation: ${process_incarnation}" -X DELETE http://127.0.0.1:4438/__ursula/leadership-shed/maintenance`
)

// TestAdminEndpoints runs the seed's admin examples against a 3-node
// cluster (ursula-node processes behind ursula-gateway, a shared fs cold
// store) with the real curl when it is on PATH, and checks each answer's
// status and documented JSON fields:
//
//   - pinning process_incarnation from GET /__ursula/metrics;
//   - flush-cold of demo/hello on its group's leader (all of it cold
//     after), of a Durable Streams stream whose name holds slashes, and on
//     a follower (409 NOT_LEADER naming the leader);
//   - a Raft snapshot (at least the applied index read before) and a log
//     purge through min(1000, that snapshot);
//   - adding learner 4 without blocking (then in the group's learners), and
//     an addr that is not a configured peer's cluster_url (400, no change);
//   - a leader transfer (the target then leads; 409 with leader_id on a
//     follower, 400 NOT_A_VOTER for a non-voter);
//   - replacing the voter set with the same voters (committed index; 409 on
//     a follower, 400 without voters);
//   - maintenance drain on and off (the documented shed state);
//   - 428 without the incarnation header and 412 with the incarnation of a
//     node before its restart, neither changing anything.
func TestAdminEndpoints(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Gateway: true})
	ctx := t.Context()
	cli := newAdminCurl(t)

	// The data the flush-cold examples name.
	hc := c.Client().HTTP
	gw := c.GatewayURL()
	if resp := mustDo(ctx, t, hc, http.MethodPut, gw+"/demo", nil, nil); resp.Status != http.StatusCreated {
		t.Fatalf("PUT /demo: want 201, got %v", resp)
	}
	text := http.Header{"Content-Type": {"text/plain"}}
	if resp := mustDo(ctx, t, hc, http.MethodPut, gw+"/demo/hello", text, nil); resp.Status != http.StatusCreated {
		t.Fatalf("PUT /demo/hello: want 201, got %v", resp)
	}
	if resp := mustDo(ctx, t, hc, http.MethodPost, gw+"/demo/hello", text, []byte("hello, world")); resp.Status/100 != 2 {
		t.Fatalf("POST /demo/hello: got %v", resp)
	}
	const dsName = "admin/with/slashes"
	if resp, err := c.Client().Create(ctx, dsName, "text/plain", []byte("durable")); err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("create %s: %v %v", dsName, resp, err)
	}

	// The balancer spreads leaderships after the start: wait until it is
	// done, so that a group's leader found below is still its leader when
	// the call reaches it.
	if err := c.WaitBalanced(ctx); err != nil {
		t.Fatal(err)
	}
	// Each call is local to one node: pin every node's incarnation once.
	incs := map[uint64]string{}
	for _, n := range c.Nodes {
		incs[n.ID] = cli.pin(ctx, t, n)
	}
	run := func(t *testing.T, seed string, n *Node, inc string, adapt ...string) adminAnswer {
		t.Helper()
		return cli.run(ctx, t, adaptSeed(seed, n, adapt...), inc)
	}
	leader := func(t *testing.T, g uint32) *Node {
		t.Helper()
		n, err := c.Leader(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// follower is a voter of g other than its leader l.
	follower := func(l *Node) *Node {
		for _, n := range c.Nodes {
			if n.ID != l.ID {
				return n
			}
		}
		return nil
	}
	groupPath := func(g uint32) string { return fmt.Sprintf("/raft/%d/", g) }

	t.Run("flush-cold", func(t *testing.T) {
		g := stream.GroupOf("demo", "hello", c.GroupCount())
		l := leader(t, g)
		a := run(t, seedFlushCold, l, incs[l.ID])
		a.want(t, http.StatusOK, map[string]any{"bucket": "demo", "stream": "hello", "next_offset": OffsetAt(uint64(len("hello, world")))})
		if a.Body["cold_offset"] != a.Body["next_offset"] {
			t.Errorf("flush-cold left hot bytes: %s", a.Raw)
		}
		f := follower(l)
		a = run(t, withBody(seedFlushCold), f, incs[f.ID])
		a.want(t, http.StatusConflict, map[string]any{"code": "NOT_LEADER", "leader_id": float64(l.ID)})

		gd := c.GroupOf(dsName)
		ld := leader(t, gd)
		a = run(t, seedFlushCold, ld, incs[ld.ID], "/flush-cold/demo/hello", "/flush-cold/"+DSBucket+"/"+dsName)
		a.want(t, http.StatusOK, map[string]any{"bucket": DSBucket, "stream": dsName, "next_offset": OffsetAt(uint64(len("durable")))})
	})

	t.Run("snapshot and purge", func(t *testing.T) {
		g := uint32(5)
		n := c.Nodes[0]
		m, err := n.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		applied := float64(m.Group(g).AppliedIndex)
		a := run(t, seedSnapshot, n, incs[n.ID], "/raft/42/", groupPath(g))
		a.want(t, http.StatusOK, map[string]any{"raft_group_id": float64(g)})
		snap, _ := a.Body["snapshot_index"].(float64)
		if snap < applied || snap == 0 {
			t.Fatalf("snapshot_index %v, want at least the applied index %v read before: %s", a.Body["snapshot_index"], applied, a.Raw)
		}
		a = run(t, seedPurge, n, incs[n.ID], "/raft/42/", groupPath(g))
		a.want(t, http.StatusOK, map[string]any{"raft_group_id": float64(g), "purged_through": min(1000, snap)})
	})

	t.Run("learners", func(t *testing.T) {
		g := uint32(6)
		l := leader(t, g)
		// Node 4 of the test cluster: prepared (addresses, configuration)
		// but not started; the voters do not list it, so it stays a
		// learner the reconciler leaves alone.
		n4 := c.AddNode(4, nil)
		addr := "addr=http://" + n4.Config.ClusterListen + "&"
		a := run(t, seedAddLearner, l, incs[l.ID], "/raft/42/", groupPath(g), "addr=http://node-4:4439&", addr)
		a.want(t, http.StatusOK, map[string]any{"raft_group_id": float64(g), "learner": float64(4)})
		waitMetrics(ctx, t, l, fmt.Sprintf("learner 4 in group %d", g), func(m *Metrics) bool {
			return slices.Contains(m.Group(g).Learners, 4)
		})
		// A configured peer at another address is refused before anything
		// changes (it would be demoted otherwise).
		other := follower(l)
		a = run(t, withBody(seedAddLearner), l, incs[l.ID], "/raft/42/", groupPath(g),
			"learners/4?addr=http://node-4:4439", fmt.Sprintf("learners/%d?addr=http://127.0.0.1:1", other.ID))
		a.want(t, http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT"})
		if m, err := l.Metrics(ctx); err != nil || !slices.Contains(m.Group(g).Voters, other.ID) {
			t.Errorf("node %d is no longer a voter of group %d after a refused request (%v)", other.ID, g, err)
		}
	})

	t.Run("leader transfer", func(t *testing.T) {
		g := uint32(7)
		l := leader(t, g)
		to := follower(l)
		a := run(t, withBody(seedTransfer), to, incs[to.ID], "/raft/42/", groupPath(g), "transfer/2", fmt.Sprintf("transfer/%d", to.ID))
		a.want(t, http.StatusConflict, map[string]any{"code": "NOT_LEADER", "leader_id": float64(l.ID)})
		a = run(t, withBody(seedTransfer), l, incs[l.ID], "/raft/42/", groupPath(g), "transfer/2", "transfer/9")
		a.want(t, http.StatusBadRequest, map[string]any{"code": "NOT_A_VOTER"})
		a = run(t, seedTransfer, l, incs[l.ID], "/raft/42/", groupPath(g), "transfer/2", fmt.Sprintf("transfer/%d", to.ID))
		a.want(t, http.StatusOK, map[string]any{"raft_group_id": float64(g), "transfer_to": float64(to.ID)})
		waitMetrics(ctx, t, to, fmt.Sprintf("node %d leading group %d", to.ID, g), func(m *Metrics) bool {
			return m.Group(g).LeaderID == to.ID
		})
	})

	t.Run("membership", func(t *testing.T) {
		g := uint32(8)
		l := leader(t, g)
		f := follower(l)
		a := run(t, withBody(seedMembership), f, incs[f.ID], "/raft/42/", groupPath(g))
		a.want(t, http.StatusConflict, map[string]any{"code": "NOT_LEADER", "leader_id": float64(l.ID)})
		a = run(t, withBody(seedMembership), l, incs[l.ID], "/raft/42/", groupPath(g), "?voters=1,2,3", "?voters=")
		a.want(t, http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT"})
		a = run(t, seedMembership, l, incs[l.ID], "/raft/42/", groupPath(g))
		a.want(t, http.StatusOK, map[string]any{"raft_group_id": float64(g), "voters": []any{float64(1), float64(2), float64(3)}})
		if ci, _ := a.Body["committed_index"].(float64); ci == 0 {
			t.Errorf("committed_index %v, want the commit index of the voter set: %s", a.Body["committed_index"], a.Raw)
		}
	})

	drained := map[string]any{"bits": float64(1), "state": "maintenance-drain", "should_accept_transfer": false,
		"should_campaign": false, "should_shed_current_leaders": true}
	normal := map[string]any{"bits": float64(0), "state": "normal", "should_accept_transfer": true,
		"should_campaign": true, "should_shed_current_leaders": false}
	t.Run("maintenance drain", func(t *testing.T) {
		n := c.Nodes[2]
		a := run(t, seedDrainOn, n, incs[n.ID])
		a.want(t, http.StatusOK, drained)
		a.want(t, http.StatusOK, map[string]any{"cluster_id": c.ID, "node_id": float64(n.ID)})
		a = run(t, seedDrainOff, n, incs[n.ID])
		a.want(t, http.StatusOK, normal)
	})

	t.Run("incarnation required", func(t *testing.T) {
		n := c.Nodes[0]
		for _, seed := range []string{seedSnapshot, seedDrainOn} {
			noHeader := strings.Replace(withBody(seed), `-H "x-ursula-process-incarnation: ${process_incarnation}" `, "", 1)
			a := run(t, noHeader, n, incs[n.ID], "/raft/42/", groupPath(5))
			a.want(t, http.StatusPreconditionRequired, map[string]any{"code": "INCARNATION_REQUIRED"})
		}
		cli.wantShed(ctx, t, n, normal)
	})

	t.Run("stale incarnation after a restart", func(t *testing.T) {
		n := c.Nodes[1]
		old := incs[n.ID]
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		now := cli.pin(ctx, t, n)
		if now == old {
			t.Fatalf("the restarted node kept its incarnation %q", old)
		}
		for _, seed := range []string{seedDrainOn, seedSnapshot} {
			a := run(t, withBody(seed), n, old, "/raft/42/", groupPath(5))
			a.want(t, http.StatusPreconditionFailed, map[string]any{"code": "INCARNATION_MISMATCH", "process_incarnation": now})
		}
		cli.wantShed(ctx, t, n, normal)
		a := run(t, seedDrainOff, n, now)
		a.want(t, http.StatusOK, normal)
	})
}

// adaptSeed points a seed example at node n's admin listener and applies
// the replacements (old, new pairs). A mutation (an example with -X) gets
// the node's admin token as well: Ursula requires it on every admin
// mutation, and the seed's examples predate that.
func adaptSeed(seed string, n *Node, adapt ...string) string {
	pairs := append([]string{"127.0.0.1:4438", n.Config.AdminListen}, adapt...)
	cmd := strings.NewReplacer(pairs...).Replace(seed)
	if strings.Contains(cmd, " -X ") {
		for _, prefix := range []string{"curl --fail-with-body ", "curl --fail "} {
			if strings.HasPrefix(cmd, prefix) {
				cmd = prefix + `-H "Authorization: ` + n.AdminAuth(n.tb) + `" ` + strings.TrimPrefix(cmd, prefix)
				break
			}
		}
	}
	return cmd
}

// withBody turns a seed example's --fail into --fail-with-body, for the
// checks of error answers (their JSON body).
func withBody(seed string) string {
	return strings.Replace(seed, "curl --fail ", "curl --fail-with-body ", 1)
}

// adminAnswer is one admin answer.
type adminAnswer struct {
	Cmd    string
	Status int
	Raw    string
	Body   map[string]any
}

// want checks the status and the given top-level JSON fields.
func (a adminAnswer) want(t *testing.T, status int, fields map[string]any) {
	t.Helper()
	if a.Status != status {
		t.Fatalf("%s\nanswered %d %s, want %d", a.Cmd, a.Status, a.Raw, status)
	}
	for k, v := range fields {
		got, ok := a.Body[k]
		if !ok || fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("%s\nanswered %s: %s = %v, want %v", a.Cmd, a.Raw, k, got, v)
		}
	}
}

// adminCurl runs the examples with the curl binary found on PATH, or,
// when there is none, sends the identical requests with net/http.
type adminCurl struct {
	curl string // "" → net/http
	hc   *http.Client
}

func newAdminCurl(t *testing.T) *adminCurl {
	t.Helper()
	a := &adminCurl{hc: &http.Client{Timeout: time.Minute}}
	if p, err := exec.LookPath("curl"); err == nil {
		a.curl = p
	} else {
		t.Logf("curl is not on PATH: sending the examples' requests with net/http instead")
	}
	return a
}

// pin runs the seed's first example on node n: GET /__ursula/metrics and
// .process_incarnation. curl fetches the document; the field is read here
// with jq's -e semantics (absent, null or empty fails) instead of piping
// to jq, which the test does not require.
func (a *adminCurl) pin(ctx context.Context, t *testing.T, n *Node) string {
	t.Helper()
	cmd := strings.TrimSuffix(strings.TrimPrefix(adaptSeed(seedPinIncarnation, n), "process_incarnation=$("), " | jq -er .process_incarnation)")
	ans := a.run(ctx, t, cmd, "")
	inc, _ := ans.Body["process_incarnation"].(string)
	if ans.Status != http.StatusOK || inc == "" {
		t.Fatalf("%s answered %d without process_incarnation: %s", cmd, ans.Status, ans.Raw)
	}
	return inc
}

// wantShed checks a node's GET /__ursula/leadership-shed.
func (a *adminCurl) wantShed(ctx context.Context, t *testing.T, n *Node, fields map[string]any) {
	t.Helper()
	ans := a.run(ctx, t, "curl --fail http://"+n.Config.AdminListen+"/__ursula/leadership-shed", "")
	ans.want(t, http.StatusOK, fields)
}

// run executes one curl command line (words split as the shell would,
// ${process_incarnation} set to inc). curl gets -sS and a -w that prints
// the status after the body; both only make the answer readable.
func (a *adminCurl) run(ctx context.Context, t *testing.T, cmdline, inc string) adminAnswer {
	t.Helper()
	words := shellWords(strings.ReplaceAll(cmdline, "${process_incarnation}", inc))
	if len(words) == 0 || words[0] != "curl" {
		t.Fatalf("not a curl command: %s", cmdline)
	}
	ans := adminAnswer{Cmd: cmdline}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out []byte
	if a.curl != "" {
		cmd := exec.CommandContext(ctx, a.curl, append(words[1:], "-sS", "-w", "\n%{http_code}")...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		var ee *exec.ExitError
		// 22: --fail and an HTTP error status.
		if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 22) {
			t.Fatalf("%s: %v: %s", cmdline, err, stderr.String())
		}
		i := bytes.LastIndexByte(out, '\n')
		if i < 0 {
			t.Fatalf("%s: no status in %q", cmdline, out)
		}
		ans.Status, _ = strconv.Atoi(string(out[i+1:]))
		out = out[:i]
	} else {
		ans.Status, out = a.send(ctx, t, words[1:])
	}
	ans.Raw = strings.TrimSpace(string(out))
	t.Logf("%s\n  → %d %s", cmdline, ans.Status, clip([]byte(ans.Raw)))
	if ans.Raw != "" {
		if err := json.Unmarshal(out, &ans.Body); err != nil {
			ans.Body = map[string]any{"_not_json": ans.Raw}
		}
	}
	return ans
}

// send is curl's request with net/http: -X method, -H headers, the URL;
// with --fail an error status discards the body, as curl does.
func (a *adminCurl) send(ctx context.Context, t *testing.T, args []string) (int, []byte) {
	t.Helper()
	method, url, header, fail := http.MethodGet, "", http.Header{}, false
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-X":
			i++
			method = args[i]
		case "-H":
			i++
			k, v, _ := strings.Cut(args[i], ":")
			header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		case "--fail":
			fail = true
		case "--fail-with-body":
		default:
			url = args[i]
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := a.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if fail && resp.StatusCode >= 400 {
		b = nil
	}
	return resp.StatusCode, b
}

// shellWords splits a command line into words the way the shell does for
// the examples: blanks separate words, double quotes group.
func shellWords(s string) []string {
	var (
		words []string
		cur   strings.Builder
		in    bool
		open  bool // a word has started
	)
	for _, r := range s {
		switch {
		case r == '"':
			in, open = !in, true
		case r == ' ' && !in:
			if open {
				words = append(words, cur.String())
				cur.Reset()
				open = false
			}
		default:
			cur.WriteRune(r)
			open = true
		}
	}
	if open {
		words = append(words, cur.String())
	}
	return words
}

// waitMetrics polls node n's metrics until cond holds.
func waitMetrics(ctx context.Context, t *testing.T, n *Node, what string, cond func(*Metrics) bool) {
	t.Helper()
	var err error
	if !await.Until(await.DefaultTimeout, func() bool {
		var m *Metrics
		m, err = n.Metrics(ctx)
		return err == nil && cond(m)
	}) {
		t.Fatalf("timed out waiting for %s on node %d (last error %v)", what, n.ID, err)
	}
}
