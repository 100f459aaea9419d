package ursulactl

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// planReplica is one fake replica of group 0 for recover-group: its
// metrics and its answer to the plan.
type planReplica struct {
	id          uint64
	leader      uint64
	term        uint64
	last        uint64
	gate        string
	recovery    map[string]any
	historyTerm uint64
	posts       int
}

// planFake serves the replicas' client and admin planes; onPost runs on
// each accepted plan request (under the lock), as the cluster would react.
type planFake struct {
	mu       sync.Mutex
	replicas map[uint64]*planReplica
	onPost   func(r *planReplica, body map[string]any) (int, map[string]any)
}

func (f *planFake) serve(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("cluster_id = \"c\"\n\n")
	for id := uint64(1); id <= uint64(len(f.replicas)); id++ {
		r := f.replicas[id]
		client := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			f.mu.Lock()
			defer f.mu.Unlock()
			var history any
			if r.historyTerm != 0 {
				history = map[string]any{"event_index": r.last + 1, "plan_term": r.historyTerm}
			}
			writeFakeJSON(w, 200, map[string]any{"node_id": r.id, "cluster_id": "c", "process_incarnation": fmt.Sprintf("inc-%d", r.id),
				"raft_groups": []any{map[string]any{
					"raft_group_id": 0, "leader_id": r.leader, "voter_configs": [][]uint64{{1, 2, 3}}, "committed_voter_configs": [][]uint64{{1, 2, 3}},
					"recovery_gate": r.gate, "recovery": r.recovery, "committed_index": r.last, "committed_term": r.term, "committed_node": 1,
					"last_applied_index": r.last, "last_log_index": r.last, "last_log_term": r.term, "current_term": r.term,
					"leads_live": false, "history": history, "maintenance": map[string]any{"running": true},
				}}})
		}))
		admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			var body map[string]any
			_ = json.NewDecoder(req.Body).Decode(&body)
			f.mu.Lock()
			defer f.mu.Unlock()
			r.posts++
			code, doc := f.onPost(r, body)
			writeFakeJSON(w, code, doc)
		}))
		t.Cleanup(client.Close)
		t.Cleanup(admin.Close)
		fmt.Fprintf(&b, "[[nodes]]\nid = %d\nclient_url = %q\nadmin_url = %q\n\n", id, client.URL, admin.URL)
	}
	path := filepath.Join(t.TempDir(), "cluster.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestApplyFollowerAlreadyFollowsPlanLeader: the plan's leader takes the
// plan and, with a replica that needs no gate, is elected before the last
// replica's step; that replica already follows it above the plan term, an
// expected result (no request is sent to it), and the operation completes
// once every replica applied the new history. The same proof again
// reports the completed operation and sends nothing.
func TestApplyFollowerAlreadyFollowsPlanLeader(t *testing.T) {
	f := &planFake{replicas: map[uint64]*planReplica{
		1: {id: 1, term: 3, last: 20, gate: "open"},
		2: {id: 2, term: 3, last: 20, gate: "stalled"},
		3: {id: 3, term: 3, last: 12, gate: "stalled"},
	}}
	f.onPost = func(r *planReplica, body map[string]any) (int, map[string]any) {
		step := body["step"].(map[string]any)
		if _, lead := step["lead"]; lead {
			// Node 2 leads (greatest last log id, then node id); the open
			// node 1 votes it in at once and follows it.
			r.recovery = map[string]any{"leader": 2.0, "leader_term": 3.0, "point": 20.0, "cut": false, "role": "lead"}
			r.leader, r.term = 2, 4
			n1 := f.replicas[1]
			n1.leader, n1.term = 2, 4
			return 200, map[string]any{"outcome": "leads", "leader_term": 3}
		}
		r.recovery = map[string]any{"leader": 2.0, "leader_term": 3.0, "point": 20.0, "cut": false, "role": "follow"}
		// The new history applies everywhere once the last replica took it.
		for _, x := range f.replicas {
			x.recovery, x.historyTerm, x.leader = nil, 3, 2
		}
		return 200, map[string]any{"outcome": "follows", "leader_term": 3}
	}
	manifest := f.serve(t)
	code, out, _ := runCLI(t, Env{}, "--manifest", manifest, "recover-group", "plan", "--group", "0")
	if code != 0 {
		t.Fatalf("plan: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	proof := strings.TrimPrefix(lines[len(lines)-1], "proof ")
	journal := t.TempDir()
	args := []string{"--manifest", manifest, "--actor", "t", "--reason", "test", "--poll", "10ms", "--yes", "recover-group", "apply", "--group", "0", "--expect-proof", proof, "--journal-dir", journal}
	// Off a terminal and without --yes, a matching plan is refused before
	// anything is journaled or sent.
	noYes := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--yes" })
	code, _, errs := runCLI(t, Env{}, noYes...)
	if code != ExitError || !strings.Contains(errs, "pass --yes") || f.replicas[2].posts+f.replicas[3].posts != 0 {
		t.Fatalf("apply without --yes: exit %d, %q", code, errs)
	}
	if ents, _ := os.ReadDir(journal); len(ents) != 0 {
		t.Fatalf("apply without --yes journaled %d files", len(ents))
	}
	code, out, _ = runCLI(t, Env{}, args...)
	if code != 0 || !strings.Contains(out, "already follows the plan's leader") || !strings.Contains(out, "completed") {
		t.Fatalf("apply: exit %d\n%s", code, out)
	}
	if f.replicas[1].posts != 0 || f.replicas[2].posts != 1 || f.replicas[3].posts != 1 {
		t.Fatalf("requests sent: node 1 %d, node 2 %d, node 3 %d", f.replicas[1].posts, f.replicas[2].posts, f.replicas[3].posts)
	}
	code, out, _ = runCLI(t, Env{}, args...)
	if code != 0 || !strings.Contains(out, "already completed") || f.replicas[2].posts != 1 {
		t.Fatalf("the same proof again: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, Env{}, append(args, "--json")...)
	var res ApplyResult
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res.State != opCompleted || res.Proof != proof || res.Leader != 2 {
		t.Fatalf("--json: exit %d, %v: %+v", code, err, res)
	}
}
