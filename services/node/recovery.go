package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/ursula/ursula/storage/multiraft"
)

// POST /__ursula/raft/{group}/recovery/accept-unsynced-loss: one replica's
// part of a recovery plan (see "Recovering after a host crash" in
// ops/README.md). The admin guard has authenticated the request, checked
// its process incarnation and records it in the audit trail.

// maxPlanBody bounds a plan request's body.
const maxPlanBody = 16 << 10

// planBody is the request, in the seed's shape.
type planBody struct {
	Leader     *uint64    `json:"leader"`
	Point      *uint64    `json:"point"`
	Cut        bool       `json:"cut"`
	PointEntry *entryID   `json:"point_entry,omitempty"`
	Step       *planStep  `json:"step"`
	Expected   *logExpect `json:"expected"`
}

type entryID struct {
	Term   uint64 `json:"term"`
	NodeID uint64 `json:"node_id"`
}

type planStep struct {
	Lead *struct {
		HighestTerm *uint64 `json:"highest_term"`
	} `json:"lead,omitempty"`
	Follow *struct {
		LeaderTerm *uint64 `json:"leader_term"`
	} `json:"follow,omitempty"`
}

// logExpect is the replica's state as the tool read it; an empty log
// reports null.
type logExpect struct {
	LastLogIndex *uint64 `json:"last_log_index"`
	LastLogTerm  *uint64 `json:"last_log_term"`
	CurrentTerm  *uint64 `json:"current_term"`
}

func (s *Server) serveAcceptUnsyncedLoss(w http.ResponseWriter, r *http.Request) {
	self := s.n.Config().NodeID
	g64, err := strconv.ParseUint(r.PathValue("group"), 10, 32)
	if err != nil || int(g64) >= s.n.Cluster.GroupCount() {
		writeJSON(w, http.StatusNotFound, map[string]any{"code": "NOT_FOUND", "message": fmt.Sprintf("no raft group %q on this node", r.PathValue("group"))})
		return
	}
	g := uint32(g64)
	answer := func(code int, doc map[string]any) {
		doc["raft_group_id"], doc["node_id"] = g, self
		writeJSON(w, code, doc)
	}
	bad := func(code int, name, format string, args ...any) {
		answer(code, map[string]any{"code": name, "message": fmt.Sprintf(format, args...)})
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPlanBody+1))
	if err != nil || len(body) > maxPlanBody {
		bad(http.StatusBadRequest, "INVALID_ARGUMENT", "the plan body is unreadable or larger than %d bytes", maxPlanBody)
		return
	}
	var b planBody
	if err := json.Unmarshal(body, &b); err != nil {
		bad(http.StatusBadRequest, "INVALID_ARGUMENT", "the plan body is not JSON of the documented shape: %v", err)
		return
	}
	if b.Step == nil || b.Expected == nil {
		bad(http.StatusUnprocessableEntity, "PLAN_FORM_UNSUPPORTED", "a plan needs step and expected (the 0.7 form is no longer taken): compute it with ursulactl recover-group")
		return
	}
	req, err := b.request()
	if err != nil {
		bad(http.StatusBadRequest, "INVALID_ARGUMENT", "%v", err)
		return
	}
	if _, busy := s.planInFlight.LoadOrStore(g, true); busy {
		answer(http.StatusConflict, refusalDoc(&multiraft.PlanRefusal{Reason: "plan_in_flight", Message: "the replica is taking another plan: wait for its answer and observe again"}))
		return
	}
	defer s.planInFlight.Delete(g)
	term, err := s.n.Cluster.AcceptPlan(r.Context(), g, req)
	var refusal *multiraft.PlanRefusal
	switch {
	case errors.As(err, &refusal):
		answer(http.StatusConflict, refusalDoc(refusal))
	case err != nil:
		adminFail(w, err)
	case req.Lead:
		answer(http.StatusOK, map[string]any{"outcome": "leads", "leader_term": term})
	default:
		answer(http.StatusOK, map[string]any{"outcome": "follows", "leader_term": term})
	}
}

func refusalDoc(r *multiraft.PlanRefusal) map[string]any {
	ref := map[string]any{"reason": r.Reason}
	if r.LeaderID != 0 {
		ref["leader_id"] = r.LeaderID
	}
	return map[string]any{"code": "RECOVERY_PLAN_REFUSED", "refusal": ref, "message": r.Message}
}

// request validates the body and turns it into a multiraft request.
func (b *planBody) request() (multiraft.PlanRequest, error) {
	var req multiraft.PlanRequest
	switch {
	case b.Leader == nil || *b.Leader == 0:
		return req, errors.New("leader is required (a node id)")
	case b.Point == nil:
		return req, errors.New("point is required")
	case (b.Step.Lead == nil) == (b.Step.Follow == nil):
		return req, errors.New("step holds exactly one of lead and follow")
	case b.Expected.CurrentTerm == nil:
		return req, errors.New("expected.current_term is required")
	}
	req.Leader, req.Point, req.Cut = *b.Leader, *b.Point, b.Cut
	if b.PointEntry != nil {
		if !b.Cut || b.PointEntry.Term == 0 {
			return req, errors.New("point_entry goes only with a cut, and names a term")
		}
		req.PointEntryTerm = b.PointEntry.Term
	}
	if l := b.Step.Lead; l != nil {
		if l.HighestTerm == nil {
			return req, errors.New("step.lead.highest_term is required")
		}
		req.Lead, req.HighestTerm = true, *l.HighestTerm
	} else {
		if b.Step.Follow.LeaderTerm == nil {
			return req, errors.New("step.follow.leader_term is required")
		}
		req.LeaderTerm = *b.Step.Follow.LeaderTerm
	}
	deref := func(p *uint64) uint64 {
		if p == nil {
			return 0
		}
		return *p
	}
	req.ExpectedLastIndex, req.ExpectedLastTerm, req.ExpectedTerm = deref(b.Expected.LastLogIndex), deref(b.Expected.LastLogTerm), *b.Expected.CurrentTerm
	return req, nil
}
