package node

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ursula/ursula/services/platform/statuspage"
)

// TestStatusPageOnAdminPlane reads the status page of a single node on its
// admin plane: the node reads itself in process, and the admin guard
// stands in front of the page as of every admin read.
func TestStatusPageOnAdminPlane(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	h, err := s.adminHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	s.page.Refresh(t.Context())

	get := func(path string, header http.Header) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, ts.URL+path, nil)
		for k, v := range header {
			req.Header[k] = v
		}
		if host := header.Get("Host"); host != "" {
			req.Host = host
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/__ursula/ui/snapshot", nil)
	if code != http.StatusOK {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	var snap statuspage.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Source != "node 1" || len(snap.Nodes) != 1 || !snap.Nodes[0].Reachable || snap.Nodes[0].ID != 1 || snap.ClusterID != testClusterID {
		t.Fatalf("snapshot: %+v", snap)
	}
	if len(snap.Groups) != 8 || len(snap.GroupsWithoutLeader) != 0 {
		t.Fatalf("groups %+v, without a leader %v", snap.Groups, snap.GroupsWithoutLeader)
	}
	for _, g := range snap.Groups {
		if g.Leader != 1 || len(g.Voters) != 1 {
			t.Fatalf("group %+v", g)
		}
	}
	if code, body := get("/__ursula/ui/", nil); code != http.StatusOK || !strings.Contains(body, "app.js") {
		t.Fatalf("the page: %d %.200s", code, body)
	}
	if code, _ := get("/__ursula/ui/", http.Header{"Host": {"rebound.example:4438"}}); code != http.StatusForbidden {
		t.Fatalf("the page for another host name: %d, want 403", code)
	}
}
