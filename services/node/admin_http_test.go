package node

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/ursula/ursula/storage/engine"
)

// adminServer serves a node's admin handler over httptest.
func adminServer(tb testing.TB) (*Server, *engine.Node, *httptest.Server) {
	tb.Helper()
	eng := startEngine(tb)
	s := newServer(tb, eng)
	h, err := s.adminHandler(tb.Context())
	if err != nil {
		tb.Fatalf("adminHandler: %v", err)
	}
	ts := httptest.NewServer(h)
	tb.Cleanup(ts.Close)
	return s, eng, ts
}

// TestAdminIncarnationRule checks every admin mutation refuses a request
// without the process incarnation (428) or with another one (412) before
// changing anything.
func TestAdminIncarnationRule(t *testing.T) {
	s, eng, ts := adminServer(t)
	snapIndex := eng.Cluster.Status(0).SnapshotIndex
	mutations := []struct {
		method, path string
	}{
		{http.MethodPost, "/__ursula/leadership-shed/maintenance"},
		{http.MethodDelete, "/__ursula/leadership-shed/maintenance"},
		{http.MethodPost, "/__ursula/raft/0/leader/transfer/1"},
		{http.MethodPost, "/__ursula/raft/0/learners/2"},
		{http.MethodPost, "/__ursula/raft/0/membership?voters=1,2"},
		{http.MethodPost, "/__ursula/raft/0/snapshot"},
		{http.MethodPost, "/__ursula/raft/0/purge?upto=1000"},
		{http.MethodPost, "/__ursula/flush-cold/demo/hello"},
		{http.MethodDelete, "/__ursula/purge/demo"},
		{http.MethodPost, "/__ursula/feature-level"},
	}
	headers := []struct {
		name     string
		value    string
		wantCode int
		wantErr  string
	}{
		{"missing", "", http.StatusPreconditionRequired, "INCARNATION_REQUIRED"},
		{"other process", "not-" + s.Incarnation(), http.StatusPreconditionFailed, "INCARNATION_MISMATCH"},
	}
	for _, m := range mutations {
		for _, h := range headers {
			t.Run(m.method+" "+m.path+" "+h.name, func(t *testing.T) {
				code, body := do(t, ts.Client(), m.method, ts.URL+m.path, authed(s, h.value))
				if code != h.wantCode || body["code"] != h.wantErr {
					t.Fatalf("answer %d %v, want %d %s", code, body, h.wantCode, h.wantErr)
				}
				if h.wantCode == http.StatusPreconditionFailed && body["process_incarnation"] != s.Incarnation() {
					t.Errorf("412 names incarnation %v, want %s", body["process_incarnation"], s.Incarnation())
				}
				if eng.Cluster.Draining() {
					t.Error("a refused mutation turned the drain on")
				}
				st := eng.Cluster.Status(0)
				if !slices.Equal(st.Voters, []uint64{1}) || len(st.Learners) != 0 || !st.IsLeader {
					t.Errorf("a refused mutation changed group 0: voters %v learners %v leader %v", st.Voters, st.Learners, st.IsLeader)
				}
				if st.SnapshotIndex != snapIndex {
					t.Errorf("a refused mutation took a snapshot of group 0: index %d, was %d", st.SnapshotIndex, snapIndex)
				}
			})
		}
	}
}

func TestLeadershipShed(t *testing.T) {
	s, eng, ts := adminServer(t)
	inc := authed(s, s.Incarnation())
	drained := map[string]any{
		"bits": float64(1), "state": "maintenance-drain",
		"should_accept_transfer": false, "should_campaign": false, "should_shed_current_leaders": true,
	}
	normal := map[string]any{
		"bits": float64(0), "state": "normal",
		"should_accept_transfer": true, "should_campaign": true, "should_shed_current_leaders": false,
	}
	steps := []struct {
		name         string
		method, path string
		header       http.Header
		want         map[string]any
		wantDraining bool
	}{
		{"initial state", http.MethodGet, "/__ursula/leadership-shed", nil, normal, false},
		{"drain on", http.MethodPost, "/__ursula/leadership-shed/maintenance", inc, drained, true},
		{"read while draining", http.MethodGet, "/__ursula/leadership-shed", nil, drained, true},
		{"drain on again is idempotent", http.MethodPost, "/__ursula/leadership-shed/maintenance", inc, drained, true},
		{"drain off", http.MethodDelete, "/__ursula/leadership-shed/maintenance", inc, normal, false},
		{"read after", http.MethodGet, "/__ursula/leadership-shed", nil, normal, false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			code, body := do(t, ts.Client(), st.method, ts.URL+st.path, st.header)
			if code != http.StatusOK {
				t.Fatalf("answer %d %v", code, body)
			}
			for k, v := range st.want {
				if body[k] != v {
					t.Errorf("%s = %v, want %v", k, body[k], v)
				}
			}
			if body["cluster_id"] != testClusterID || body["node_id"] != float64(1) {
				t.Errorf("cluster_id %v node_id %v", body["cluster_id"], body["node_id"])
			}
			if eng.Cluster.Draining() != st.wantDraining {
				t.Errorf("engine draining = %v, want %v", eng.Cluster.Draining(), st.wantDraining)
			}
		})
	}
}

func TestAdminRaftEndpoints(t *testing.T) {
	s, eng, ts := adminServer(t)
	inc := authed(s, s.Incarnation())
	tests := []struct {
		name     string
		path     string
		wantCode int
		wantErr  string
	}{
		{"transfer to a non-voter", "/__ursula/raft/0/leader/transfer/5", http.StatusBadRequest, "NOT_A_VOTER"},
		{"transfer to node 0", "/__ursula/raft/0/leader/transfer/0", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"transfer to a non-number", "/__ursula/raft/0/leader/transfer/x", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"group out of range", "/__ursula/raft/8/leader/transfer/1", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"group not a number", "/__ursula/raft/g/leader/transfer/1", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"membership without voters", "/__ursula/raft/0/membership", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"membership with empty voters", "/__ursula/raft/0/membership?voters=", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"membership with a bad id", "/__ursula/raft/0/membership?voters=1,x", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"membership with node 0", "/__ursula/raft/0/membership?voters=0", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"learner 0", "/__ursula/raft/0/learners/0", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"unchanged membership", "/__ursula/raft/0/membership?voters=1", http.StatusOK, ""},
		{"add a learner and wait", "/__ursula/raft/7/learners/2?blocking=true", http.StatusOK, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(t, ts.Client(), http.MethodPost, ts.URL+tc.path, inc)
			if code != tc.wantCode {
				t.Fatalf("answer %d %v, want %d", code, body, tc.wantCode)
			}
			if tc.wantErr != "" && body["code"] != tc.wantErr {
				t.Fatalf("code %v, want %s", body["code"], tc.wantErr)
			}
		})
	}
	if st := eng.Cluster.Status(0); !slices.Equal(st.Voters, []uint64{1}) || len(st.Learners) != 0 {
		t.Errorf("group 0 changed: voters %v learners %v", st.Voters, st.Learners)
	}
	if st := eng.Cluster.Status(7); !slices.Equal(st.Learners, []uint64{2}) || !slices.Equal(st.Voters, []uint64{1}) {
		t.Errorf("group 7 after adding learner 2: voters %v learners %v", st.Voters, st.Learners)
	}
}

func TestAdminReadinessBeforeRun(t *testing.T) {
	s, _, ts := adminServer(t)
	// Run has not started: the engine is ready but the server has not said so.
	code, body := do(t, ts.Client(), http.MethodGet, ts.URL+"/__ursula/ready", nil)
	if code != http.StatusServiceUnavailable || body["ready"] != false || body["reason"] != ReasonStarting {
		t.Fatalf("ready answer %d %v", code, body)
	}
	if body["process_incarnation"] != s.Incarnation() || body["cluster_id"] != testClusterID {
		t.Fatalf("ready answer %v", body)
	}
}
