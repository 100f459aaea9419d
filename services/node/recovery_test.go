package node

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAcceptUnsyncedLossAnswers checks the endpoint's answers in the seed's
// shapes: an unknown group, a body that does not decode, the 0.7 form, and
// typed refusals (a single node leads its groups live; a follow whose plan
// term is below the term it expects).
func TestAcceptUnsyncedLossAnswers(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	post := func(group, body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/__ursula/raft/"+group+"/recovery/accept-unsynced-loss", strings.NewReader(body))
		req.SetPathValue("group", group)
		rec := httptest.NewRecorder()
		s.serveAcceptUnsyncedLoss(rec, req)
		var doc map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Fatalf("answer %d is not JSON: %q", rec.Code, rec.Body)
		}
		return rec.Code, doc
	}
	expected := `"expected":{"last_log_index":null,"last_log_term":null,"current_term":5}`
	for _, tc := range []struct {
		name, group, body string
		code              int
		reason            string
	}{
		{"unknown group", "99", `{}`, http.StatusNotFound, ""},
		{"not JSON", "0", `{"leader":`, http.StatusBadRequest, ""},
		{"the 0.7 form", "0", `{"leader":1,"point":3}`, http.StatusUnprocessableEntity, ""},
		{"two steps", "0", `{"leader":1,"point":3,"step":{"lead":{"highest_term":5},"follow":{"leader_term":5}},` + expected + `}`, http.StatusBadRequest, ""},
		{"leads live", "0", `{"leader":1,"point":3,"cut":false,"step":{"lead":{"highest_term":5}},` + expected + `}`, http.StatusConflict, "leads_live"},
		{"lead sent to a follower", "0", `{"leader":2,"point":3,"step":{"lead":{"highest_term":5}},` + expected + `}`, http.StatusConflict, "step_mismatch"},
		{"plan term below the vote", "0", `{"leader":2,"point":3,"step":{"follow":{"leader_term":4}},` + expected + `}`, http.StatusConflict, "plan_term_below_vote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, doc := post(tc.group, tc.body)
			if code != tc.code {
				t.Fatalf("answer %d %v, want %d", code, doc, tc.code)
			}
			if tc.reason == "" {
				return
			}
			ref, _ := doc["refusal"].(map[string]any)
			if ref["reason"] != tc.reason || doc["code"] != "RECOVERY_PLAN_REFUSED" || doc["raft_group_id"] != float64(0) || doc["node_id"] != float64(1) || doc["message"] == "" {
				t.Fatalf("refusal %v, want reason %s in the seed's shape", doc, tc.reason)
			}
			if eng.Cluster.Status(0).Recovery != nil {
				t.Fatal("a refused plan was taken")
			}
		})
	}
}
