package ursulactl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeCluster is a cluster of fake nodes: each serves the client plane
// (metrics, ready) and the admin plane (shed state and the mutations, with
// the incarnation and token rules) over httptest servers, on a shared
// table of group leaders.
type fakeCluster struct {
	t         testing.TB
	clusterID string
	voters    []uint64

	mu      sync.Mutex
	leaders []uint64 // by group
	stuck   bool     // transfers are accepted but nothing moves
	nodes   map[uint64]*fakeNode
}

type fakeNode struct {
	c  *fakeCluster
	id uint64

	// Guarded by c.mu.
	inc       string
	ready     bool
	reason    string
	notReady  int // with ready false: answer this many more probes, then become ready (0: stay unready)
	draining  bool
	down      bool
	token     string            // required bearer token when set
	mutations []string          // "METHOD path?query" of accepted mutations
	headers   []http.Header     // of every admin request
	override  map[string][]fake // answers by "METHOD path", consumed in order

	client, admin *httptest.Server
}

// fake is a canned answer.
type fake struct {
	status int
	header map[string]string
	body   string
}

func newFakeCluster(t testing.TB, nodes, groups int) *fakeCluster {
	t.Helper()
	c := &fakeCluster{t: t, clusterID: "fake", nodes: map[uint64]*fakeNode{}, leaders: make([]uint64, groups)}
	for i := range nodes {
		c.voters = append(c.voters, uint64(i+1))
	}
	for g := range c.leaders {
		c.leaders[g] = c.voters[g%nodes]
	}
	for _, id := range c.voters {
		n := &fakeNode{c: c, id: id, inc: fmt.Sprintf("inc-%d-a", id), ready: true, override: map[string][]fake{}}
		n.client = httptest.NewServer(http.HandlerFunc(n.serveClient))
		n.admin = httptest.NewServer(http.HandlerFunc(n.serveAdmin))
		t.Cleanup(n.client.Close)
		t.Cleanup(n.admin.Close)
		c.nodes[id] = n
	}
	return c
}

// manifest writes the cluster's manifest into a temporary directory.
func (c *fakeCluster) manifest(t testing.TB, extra string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "cluster_id = %q\n%s\n", c.clusterID, extra)
	for _, id := range c.voters {
		n := c.nodes[id]
		fmt.Fprintf(&b, "[[nodes]]\nid = %d\nclient_url = %q\nadmin_url = %q\n\n", id, n.client.URL, n.admin.URL)
	}
	path := filepath.Join(t.TempDir(), "cluster.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func (c *fakeCluster) led(id uint64) []uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint32
	for g, l := range c.leaders {
		if l == id {
			out = append(out, uint32(g))
		}
	}
	return out
}

// restart gives node id a new incarnation, as a process restart would.
func (c *fakeCluster) restart(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	n.inc += "'"
	n.draining = false
}

func (c *fakeCluster) set(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
}

func writeFakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (n *fakeNode) serveClient(w http.ResponseWriter, r *http.Request) {
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.down {
		hj, _ := w.(http.Hijacker)
		conn, _, _ := hj.Hijack()
		conn.Close()
		return
	}
	if r.Header.Get("Authorization") != "" {
		c.t.Errorf("node %d: a client-plane request carries Authorization", n.id)
	}
	switch r.URL.Path {
	case "/__ursula/metrics":
		var groups []any
		for g, l := range c.leaders {
			groups = append(groups, map[string]any{
				"raft_group_id": g, "leader_id": l, "term": 3, "commit_index": 100, "applied_index": 100,
				"voters": c.voters, "learners": []uint64{},
			})
		}
		shed := "normal"
		if n.draining {
			shed = "maintenance-drain"
		}
		writeFakeJSON(w, 200, map[string]any{
			"node_id": n.id, "cluster_id": c.clusterID, "process_incarnation": n.inc,
			"leadership_shed_state": shed, "raft_groups": groups,
		})
	case "/__ursula/ready":
		status := 200
		if !n.ready {
			status = 503
		}
		writeFakeJSON(w, status, map[string]any{"ready": n.ready, "reason": n.reason, "cluster_id": c.clusterID, "process_incarnation": n.inc})
		if !n.ready && n.notReady > 0 {
			n.notReady--
			n.ready = n.notReady == 0
		}
	default:
		http.NotFound(w, r)
	}
}

func (n *fakeNode) serveAdmin(w http.ResponseWriter, r *http.Request) {
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	n.headers = append(n.headers, r.Header.Clone())
	if n.token != "" && r.Header.Get("Authorization") != "Bearer "+n.token {
		writeFakeJSON(w, 401, map[string]any{"code": "UNAUTHENTICATED", "message": "bearer token required"})
		return
	}
	key := r.Method + " " + r.URL.Path
	if fs := n.override[key]; len(fs) > 0 {
		f := fs[0]
		n.override[key] = fs[1:]
		for k, v := range f.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		_, _ = w.Write([]byte(f.body))
		if f.status < 300 {
			n.mutations = append(n.mutations, r.Method+" "+r.URL.RequestURI())
		}
		return
	}
	shed := func() {
		state, accept := "normal", true
		if n.draining {
			state, accept = "maintenance-drain", false
		}
		writeFakeJSON(w, 200, map[string]any{"cluster_id": c.clusterID, "node_id": n.id, "state": state,
			"should_accept_transfer": accept, "should_campaign": accept})
	}
	if r.Method == http.MethodGet && r.URL.Path == "/__ursula/leadership-shed" {
		shed()
		return
	}
	switch got := r.Header.Get(IncarnationHeader); {
	case got == "":
		writeFakeJSON(w, 428, map[string]any{"code": "INCARNATION_REQUIRED", "message": "required"})
		return
	case got != n.inc:
		writeFakeJSON(w, 412, map[string]any{"code": "INCARNATION_MISMATCH", "message": "restarted", "process_incarnation": n.inc})
		return
	}
	n.mutations = append(n.mutations, r.Method+" "+r.URL.RequestURI())
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.URL.Path == "/__ursula/leadership-shed/maintenance":
		n.draining = r.Method == http.MethodPost
		shed()
	case len(parts) == 6 && parts[1] == "raft" && parts[3] == "leader" && parts[4] == "transfer":
		g, _ := strconv.Atoi(parts[2])
		to, _ := strconv.ParseUint(parts[5], 10, 64)
		switch {
		case c.leaders[g] != n.id:
			writeFakeJSON(w, 409, map[string]any{"code": "NOT_LEADER", "message": "not leader", "leader_id": c.leaders[g]})
		case !slices.Contains(c.voters, to):
			writeFakeJSON(w, 400, map[string]any{"code": "NOT_A_VOTER", "message": "not a voter"})
		default:
			if t := c.nodes[to]; !t.draining && !t.down && !c.stuck {
				c.leaders[g] = to
			}
			writeFakeJSON(w, 200, map[string]any{"raft_group_id": g, "transfer_to": to})
		}
	default:
		writeFakeJSON(w, 200, map[string]any{"ok": true})
	}
}

// mutationsOf returns node id's accepted mutations.
func (c *fakeCluster) mutationsOf(id uint64) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes[id].mutations)
}

// runCLI runs ursulactl in process and returns its exit code, stdout and
// stderr.
func runCLI(t testing.TB, env Env, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	code := Run(context.Background(), args, env)
	t.Logf("ursulactl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}
