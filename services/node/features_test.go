package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// post sends body and decodes the JSON answer.
func post(tb testing.TB, client *http.Client, url string, header http.Header, body string) (int, map[string]any) {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(raw), &doc); err != nil {
		tb.Fatalf("%d answer is not JSON: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, doc
}

// TestFeatureLevelRoutes: GET reports this node's view (a fresh install is
// at the release's level); POST is an admin mutation (token, incarnation)
// that takes {"level": N}, refuses a level some member does not know with
// 409 naming the node, and raises every group otherwise (a repeat raises
// none).
func TestFeatureLevelRoutes(t *testing.T) {
	s, eng, ts := adminServer(t)
	url := ts.URL + "/__ursula/feature-level"
	code, doc := do(t, ts.Client(), http.MethodGet, url, nil)
	if code != http.StatusOK || doc["max_level"] != float64(stream.MaxFeatureLevel) || doc["cluster_level"] != float64(stream.ReleaseFeatureLevel) ||
		doc["raisable_to"] != float64(stream.MaxFeatureLevel) {
		t.Fatalf("GET: %d %v", code, doc)
	}
	if nodes, _ := doc["nodes"].([]any); len(nodes) != 1 {
		t.Fatalf("GET nodes: %v, want this node alone", doc["nodes"])
	}

	unknown := stream.MaxFeatureLevel + 1
	current := fmt.Sprintf(`{"level":%d}`, stream.ReleaseFeatureLevel)
	for _, tc := range []struct {
		name     string
		header   http.Header
		body     string
		wantCode int
		want     string
	}{
		{"no token", incarnation(s.Incarnation()), `{"level":1}`, http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"no incarnation", authed(s, ""), `{"level":1}`, http.StatusPreconditionRequired, "INCARNATION_REQUIRED"},
		{"other incarnation", authed(s, "not-"+s.Incarnation()), `{"level":1}`, http.StatusPreconditionFailed, "INCARNATION_MISMATCH"},
		{"not JSON", authed(s, s.Incarnation()), `level=1`, http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"no level", authed(s, s.Incarnation()), `{}`, http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"level 0", authed(s, s.Incarnation()), `{"level":0}`, http.StatusBadRequest, "INVALID_ARGUMENT"},
		{"unknown level", authed(s, s.Incarnation()), fmt.Sprintf(`{"level":%d}`, unknown), http.StatusConflict, "FEATURE_LEVEL_UNSUPPORTED"},
		{"a raise down", authed(s, s.Incarnation()), `{"level":1}`, http.StatusConflict, "FEATURE_LEVEL_UNSUPPORTED"},
		{"the current level", authed(s, s.Incarnation()), current, http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, doc := post(t, ts.Client(), url, tc.header, tc.body)
			if code != tc.wantCode || (tc.want != "" && doc["code"] != tc.want) {
				t.Fatalf("answer %d %v, want %d %s", code, doc, tc.wantCode, tc.want)
			}
			if got := eng.Cluster.Machine(0).FeatureLevel(); got != stream.ReleaseFeatureLevel {
				t.Fatalf("group 0 at level %d after %s", got, tc.name)
			}
			switch tc.name {
			case "unknown level":
				nodes, _ := doc["nodes"].([]any)
				if len(nodes) != 1 || nodes[0].(map[string]any)["node_id"] != float64(1) || !strings.Contains(doc["message"].(string), "node 1 knows levels up to") {
					t.Fatalf("the refusal does not name node 1: %v", doc)
				}
			case "the current level":
				if raised, _ := doc["groups_raised"].([]any); len(raised) != 0 {
					t.Fatalf("a raise to the current level raised %v", raised)
				}
			}
		})
	}

	if stream.MaxFeatureLevel == stream.ReleaseFeatureLevel {
		return // the raise itself runs in the featuretest build
	}
	code, doc = post(t, ts.Client(), url, authed(s, s.Incarnation()), fmt.Sprintf(`{"level":%d}`, stream.MaxFeatureLevel))
	if raised, _ := doc["groups_raised"].([]any); code != http.StatusOK || len(raised) != eng.Cluster.GroupCount() {
		t.Fatalf("raise: %d %v, want every group raised", code, doc)
	}
	for g := range uint32(eng.Cluster.GroupCount()) {
		if got := eng.Cluster.Machine(g).FeatureLevel(); got != stream.MaxFeatureLevel {
			t.Fatalf("group %d at level %d after the raise", g, got)
		}
	}
	if code, doc = post(t, ts.Client(), url, authed(s, s.Incarnation()), current); code != http.StatusConflict || doc["code"] != "FEATURE_LEVEL_UNSUPPORTED" {
		t.Fatalf("a raise down: %d %v, want 409", code, doc)
	}
}

// TestHaltedGroupReadiness: a group halted at a feature level this build
// does not know makes the node unready with feature_level_unsupported,
// before any other reason but a shutdown, and the ready document names
// the level.
func TestHaltedGroupReadiness(t *testing.T) {
	fe := &stream.FeatureLevelError{Group: 3, Level: stream.MaxFeatureLevel + 1, Index: 42}
	led := multiraft.GroupStatus{LeaderID: 2, Voters: []uint64{1, 2, 3}}
	halted := multiraft.GroupStatus{GroupID: 3, Voters: []uint64{1, 2, 3}, Halted: fmt.Errorf("wrapped: %w", fe)}
	groups := []multiraft.GroupStatus{led, halted}
	if got := readinessReason(false, false, 1, nil, groups, 1, time.Now()); got != ReasonFeatureLevelUnsupported {
		t.Fatalf("reason %q, want %q", got, ReasonFeatureLevelUnsupported)
	}
	if got := readinessReason(true, true, 0, nil, groups, 1, time.Now()); got != ReasonShuttingDown {
		t.Fatalf("reason while stopping %q, want %q", got, ReasonShuttingDown)
	}
	g, level, detail, ok := haltedLevel(groups)
	if !ok || g != 3 || level != fe.Level || !strings.Contains(detail, fmt.Sprintf("feature level %d", fe.Level)) {
		t.Fatalf("haltedLevel = %d %d %q %v", g, level, detail, ok)
	}
	if _, level, _, ok := haltedLevel([]multiraft.GroupStatus{{Halted: errors.New("other")}}); !ok || level != 0 {
		t.Fatalf("a halt of another cause: level %d ok %v", level, ok)
	}
}
