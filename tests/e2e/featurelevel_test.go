package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/ops/ursulactl"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// TestFeatureLevelRollingUpgrade mixes two builds of ursula-node in one
// 3-node cluster: A, the current build (feature levels up to the
// release's, base, where a fresh install starts), and B, the same source
// built with -tags featuretest, which knows one level more (next) and its
// test-only command FeatureProbe. It proves the upgrade contract of
// ops/README.md ("Upgrading"):
//
//   - a rolling upgrade A→B and a rolling downgrade B→A work while writes
//     flow through the gateway, because the level stays base and B never
//     proposes the probe (its gate answers 409);
//   - a raise to next is refused, naming the node, while a voter runs A;
//   - once every voter runs B the raise succeeds, and B's probe is then
//     proposed and applied on every replica;
//   - an A node started into the raised cluster refuses the level: it
//     stays up, applies nothing of the raised groups and answers
//     /__ursula/ready 503 feature_level_unsupported naming the level, while
//     the others keep serving; started as B again, it catches up.
func TestFeatureLevelRollingUpgrade(t *testing.T) {
	binB, err := TaggedBinary("ursula-node", "featuretest")
	if err != nil {
		t.Fatal(err)
	}
	const groups = 4
	base, next := stream.ReleaseFeatureLevel, stream.ReleaseFeatureLevel+1
	raiseBody := fmt.Sprintf(`{"level":%d}`, next)
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: groups, Gateway: true})
	binA := c.Nodes[0].Bin
	m := writeCtlManifest(t, c)
	ctx := t.Context()
	client := c.Client()

	writers := make([]*rollWriter, 2)
	for i := range writers {
		writers[i] = &rollWriter{stream: fmt.Sprintf("upgrade-%d", i)}
		if resp, err := client.Create(ctx, writers[i].stream, "text/plain", nil); err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("create %s: %v %v", writers[i].stream, resp, err)
		}
	}
	stopWriters := startWriters(ctx, client, writers)
	defer stopWriters()
	flowing := func(what string) {
		t.Helper()
		waitLoad(t, writers, loadCounts(writers), 10, "appends through the gateway "+what)
	}
	flowing("on build A")

	// roll restarts node n (SIGTERM: its leaderships are handed off) as
	// bin and waits until it is ready and every group has a leader again.
	roll := func(n *Node, bin, name string) {
		t.Helper()
		if err := n.Terminate(60 * time.Second); err != nil {
			t.Fatalf("stop node %d: %v", n.ID, err)
		}
		n.Bin = bin
		if err := n.Start(); err != nil {
			t.Fatalf("start node %d as %s: %v", n.ID, name, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := n.WaitReady(rctx); err != nil {
			t.Fatalf("node %d as %s: %v", n.ID, name, err)
		}
		if err := c.WaitGroupsLed(rctx); err != nil {
			t.Fatalf("after node %d became %s: %v", n.ID, name, err)
		}
		t.Logf("node %d runs build %s", n.ID, name)
	}

	// Rolling upgrade, one node at a time, under load.
	for _, n := range c.Nodes {
		roll(n, binB, "B")
		flowing(fmt.Sprintf("after node %d became B", n.ID))
	}
	for _, n := range c.Nodes {
		if doc := featureLevel(t, n); doc.ClusterLevel != base || doc.MaxLevel != next {
			t.Fatalf("node %d (B) before any raise: %+v, want level %d of max %d", n.ID, doc, base, next)
		}
	}
	// B knows the probe but its gate keeps it off at level base: no node
	// proposes it, every node that leads a group is refused.
	refused := 0
	for _, n := range c.Nodes {
		code, doc := adminPost(t, n, "/__ursula/featuretest/probe", "")
		switch {
		case code == http.StatusConflict && doc["code"] == "FEATURE_LEVEL_UNSUPPORTED":
			refused++
		case code == http.StatusOK && len(doc["probed_groups"].([]any)) == 0:
		default:
			t.Fatalf("probe on node %d at level %d: %d %v, want 409 FEATURE_LEVEL_UNSUPPORTED", n.ID, base, code, doc)
		}
	}
	if refused == 0 {
		t.Fatal("no node refused a probe at the base level (none leads a group?)")
	}
	requireProbes(t, c.Nodes, groups, 0)

	// Rolling downgrade of one node: the level is still base, so B wrote
	// nothing A cannot apply.
	n3 := c.Node(3)
	roll(n3, binA, "A")
	flowing("after node 3 went back to A")

	// A raise while node 3 runs A is refused, naming it; nothing changes.
	r := runCtl(t, m, ursulactl.Env{}, "--yes", "cluster", "enable-feature", "--level", fmt.Sprint(next))
	r.want(t, ursulactl.ExitError, "FEATURE_LEVEL_UNSUPPORTED")
	if !strings.Contains(r.stderr, fmt.Sprintf("node 3 knows levels up to %d", base)) || strings.Contains(r.stderr, "node 1 knows") || strings.Contains(r.stderr, "node 2 knows") {
		t.Fatalf("the refusal does not name node 3 alone: %s", r.stderr)
	}
	code, doc := adminPost(t, c.Node(2), "/__ursula/feature-level", raiseBody)
	if code != http.StatusConflict || doc["code"] != "FEATURE_LEVEL_UNSUPPORTED" || !strings.Contains(fmt.Sprint(doc["nodes"]), "node_id:3") {
		t.Fatalf("raise through node 2 with node 3 on A: %d %v, want 409 naming node 3", code, doc)
	}
	for _, n := range c.Nodes {
		if doc := featureLevel(t, n); doc.ClusterLevel != base {
			t.Fatalf("node %d after a refused raise: level %d", n.ID, doc.ClusterLevel)
		}
	}

	// Every voter on B: the raise succeeds, and every replica applies it.
	roll(n3, binB, "B")
	flowing("after node 3 became B again")
	r = runCtl(t, m, ursulactl.Env{}, "--yes", "cluster", "enable-feature", "--level", fmt.Sprint(next))
	r.want(t, 0, "")
	await.True(t, "every replica at feature level next", func() bool {
		for _, n := range c.Nodes {
			if doc := featureLevel(t, n); doc.ClusterLevel != next {
				return false
			}
		}
		return true
	})
	r = runCtl(t, m, ursulactl.Env{}, "cluster", "feature-level")
	r.want(t, 0, "")
	if !strings.Contains(r.stdout, fmt.Sprintf(`"cluster_level": %d`, next)) {
		t.Fatalf("ursulactl cluster feature-level: %s", r.stdout)
	}
	flowing("after the raise")

	// B now uses the probe: proposed by each group's leader, applied by
	// every replica.
	await.True(t, "a probe applied in every group on every node", func() bool {
		for _, n := range c.Nodes {
			if code, doc := adminPost(t, n, "/__ursula/featuretest/probe", ""); code != http.StatusOK {
				t.Logf("probe on node %d: %d %v", n.ID, code, doc)
			}
		}
		return probesAtLeast(t, c.Nodes, groups, 1)
	})
	stopWriters()
	for i, w := range writers {
		if w.err != nil {
			t.Errorf("writer %d (%s): %v", i, w.stream, w.err)
		}
		t.Logf("writer %d: %d appends acknowledged, %d answers 503 retried", i, w.acked, w.retry)
	}
	for i, w := range writers {
		var want []byte
		for seq := range w.acked {
			want = append(want, rollRecordOf(i, seq)...)
		}
		got, _, err := client.ReadAll(ctx, w.stream)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("stream %s: %d bytes (%v), want the %d acknowledged appends (%d bytes) once each", w.stream, len(got), err, w.acked, len(want))
		}
	}

	// Node 3 started as A into the raised cluster: it refuses level next,
	// stays up and unready, and names the level.
	if err := n3.Terminate(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	n3.Bin = binA
	if err := n3.Start(); err != nil {
		t.Fatal(err)
	}
	var ready readyDoc
	await.True(t, "node 3 (A) unready with feature_level_unsupported", func() bool {
		ready = readiness(t, n3)
		return ready.Reason == "feature_level_unsupported"
	})
	if ready.Status != http.StatusServiceUnavailable || ready.UnsupportedLevel != next || ready.MaxLevel != base || !strings.Contains(ready.Detail, fmt.Sprintf("feature level %d", next)) {
		t.Fatalf("node 3 (A) readiness: %+v, want 503 naming level %d", ready, next)
	}
	if doc := featureLevel(t, n3); doc.MaxLevel != base || len(doc.HaltedGroups) == 0 {
		t.Fatalf("node 3 (A) feature level: %+v, want max %d and halted groups", doc, base)
	}
	// The others keep serving; node 3 is still up (it did not crash-loop)
	// and still says why.
	if resp := appendRetrying(t, client, writers[0].stream, []byte("after-a-refused;")); resp.Status != http.StatusOK {
		t.Fatalf("append with node 3 halted: %v", resp)
	}
	if !n3.Running() {
		t.Fatalf("node 3 (A) exited: %v\n%s", n3.ExitErr(), n3.LogTail(40))
	}
	if again := readiness(t, n3); again.Reason != "feature_level_unsupported" {
		t.Fatalf("node 3 (A) readiness later: %+v", again)
	}
	if !strings.Contains(readFile(n3.LogPath), "stopped applying the group") {
		t.Error("node 3 (A) did not log why it stopped applying")
	}

	// Back on B, node 3 applies what it refused and serves again.
	roll(n3, binB, "B")
	if !probesAtLeast(t, []*Node{n3}, groups, 1) {
		await.True(t, "node 3 (B) applied every probe", func() bool { return probesAtLeast(t, []*Node{n3}, groups, 1) })
	}
}

// featureLevelDoc is GET /__ursula/feature-level.
type featureLevelDoc struct {
	MaxLevel     uint32   `json:"max_level"`
	ClusterLevel uint32   `json:"cluster_level"`
	GroupLevels  []uint32 `json:"group_levels"`
	HaltedGroups []uint32 `json:"halted_groups"`
	RaisableTo   uint32   `json:"raisable_to"`
}

func adminGet(t testing.TB, n *Node, path string, v any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Config.AdminListen+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s on node %d: %v", path, n.ID, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("GET %s on node %d: %d %q", path, n.ID, resp.StatusCode, raw)
	}
	return resp.StatusCode
}

func featureLevel(t testing.TB, n *Node) featureLevelDoc {
	t.Helper()
	var doc featureLevelDoc
	if code := adminGet(t, n, "/__ursula/feature-level", &doc); code != http.StatusOK {
		t.Fatalf("GET feature-level on node %d: %d", n.ID, code)
	}
	return doc
}

// adminPost sends an admin mutation (token, the node's current process
// incarnation) and decodes the answer.
func adminPost(t testing.TB, n *Node, path, body string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	m, err := n.Metrics(ctx)
	if err != nil {
		t.Fatalf("node %d metrics: %v", n.ID, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.Config.AdminListen+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", n.AdminAuth(t))
	req.Header.Set("x-ursula-process-incarnation", m.ProcessIncarnation)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s on node %d: %v", path, n.ID, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("POST %s on node %d: %d %q", path, n.ID, resp.StatusCode, raw)
	}
	return resp.StatusCode, doc
}

// probesAtLeast reports whether every node applied at least min probes
// in every group (GET /__ursula/featuretest/probe, build B only).
func probesAtLeast(t testing.TB, nodes []*Node, groups int, least uint64) bool {
	t.Helper()
	for _, n := range nodes {
		var doc struct {
			Applied []uint64 `json:"applied"`
		}
		if code := adminGet(t, n, "/__ursula/featuretest/probe", &doc); code != http.StatusOK || len(doc.Applied) != groups {
			t.Fatalf("probes on node %d: %d %v", n.ID, code, doc.Applied)
		}
		for _, v := range doc.Applied {
			if v < least {
				return false
			}
		}
	}
	return true
}

// requireProbes fails unless every node applied exactly want probes in
// every group.
func requireProbes(t testing.TB, nodes []*Node, groups int, want uint64) {
	t.Helper()
	if !probesAtLeast(t, nodes, groups, want) || (want == 0 && !probesAtMost(t, nodes, groups, 0)) {
		t.Fatalf("nodes did not apply %d probes in every group", want)
	}
}

func probesAtMost(t testing.TB, nodes []*Node, groups int, most uint64) bool {
	t.Helper()
	for _, n := range nodes {
		var doc struct {
			Applied []uint64 `json:"applied"`
		}
		adminGet(t, n, "/__ursula/featuretest/probe", &doc)
		for _, v := range doc.Applied {
			if v > most {
				return false
			}
		}
	}
	return true
}

// readyDoc is a node's GET /__ursula/ready on its client plane.
type readyDoc struct {
	Status           int    `json:"-"`
	Ready            bool   `json:"ready"`
	Reason           string `json:"reason"`
	UnsupportedLevel uint32 `json:"unsupported_feature_level"`
	MaxLevel         uint32 `json:"max_feature_level"`
	Detail           string `json:"detail"`
}

func readiness(t testing.TB, n *Node) readyDoc {
	t.Helper()
	var doc readyDoc
	resp, err := n.HTTPClient(10 * time.Second).Get(n.URL() + "/__ursula/ready")
	if err != nil {
		return readyDoc{Reason: err.Error()}
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&doc)
	doc.Status = resp.StatusCode
	return doc
}

// appendRetrying appends body, retried (same producer tuple) while the
// answer is not 200 or a duplicate's 204, within the await bound.
func appendRetrying(t testing.TB, client *Client, stream string, body []byte) *Response {
	t.Helper()
	var last *Response
	p := &Producer{ID: "after-" + stream, Epoch: 0, Seq: 0}
	await.True(t, "an append through the gateway", func() bool {
		resp, err := client.Append(t.Context(), stream, "text/plain", body, p)
		if err != nil {
			return false
		}
		last = resp
		if resp.Status == http.StatusNoContent {
			resp.Status = http.StatusOK
		}
		return resp.Status == http.StatusOK
	})
	return last
}
