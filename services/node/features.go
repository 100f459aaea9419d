package node

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// GET and POST /__ursula/feature-level on the admin plane (see "Feature
// levels" in docs/architecture.md and "Upgrading" in ops/README.md). The
// admin guard runs first: reads are open on a loopback listener; a raise is
// a mutation (token, process incarnation, audit trail).

// maxFeatureLevelBody bounds a raise's body ({"level": N}).
const maxFeatureLevelBody = 4 << 10

// nodeLevelDoc renders one node's answer.
func nodeLevelDoc(n cluster.NodeFeatureLevel) map[string]any {
	doc := map[string]any{"node_id": n.NodeID}
	if n.Err != nil {
		doc["error"] = n.Err.Error()
		return doc
	}
	doc["max_level"] = n.MaxLevel
	doc["cluster_level"] = minLevel(n.GroupLevels)
	doc["halted_groups"] = nonNil(n.HaltedGroups)
	return doc
}

// minLevel is the level every group has reached (0 without groups).
func minLevel(levels []uint32) uint32 {
	if len(levels) == 0 {
		return 0
	}
	return slices.Min(levels)
}

func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}

// serveFeatureLevel answers this node's view: the level of each of its
// replicas, the highest level its build knows, and what every member
// answered (so that an operator sees what a raise would meet).
func (s *Server) serveFeatureLevel(w http.ResponseWriter, r *http.Request) {
	local := s.n.Cluster.LocalFeatureLevel()
	nodes := []any{}
	raisable := local.MaxLevel
	for _, n := range s.n.Cluster.FeatureLevels(r.Context()) {
		nodes = append(nodes, nodeLevelDoc(n))
		if n.Err != nil {
			raisable = 0
		} else {
			raisable = min(raisable, n.MaxLevel)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"node_id":        local.NodeID,
		"baseline_level": stream.BaselineFeatureLevel,
		"max_level":      local.MaxLevel,
		// cluster_level is the level every group's replica on this node
		// applied: the level the cluster runs at once a raise completed.
		"cluster_level": minLevel(local.GroupLevels),
		"group_levels":  local.GroupLevels,
		"halted_groups": nonNil(local.HaltedGroups),
		// raisable_to is the highest level every member knows (0 when one
		// did not answer).
		"raisable_to": raisable,
		"nodes":       nodes,
	})
}

// serveRaiseFeatureLevel raises every group to the level of the body,
// {"level": N}, once every member answered that it knows the level; a
// member that does not, or does not answer, makes it 409
// FEATURE_LEVEL_UNSUPPORTED naming the nodes, and nothing is proposed.
func (s *Server) serveRaiseFeatureLevel(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxFeatureLevelBody+1))
	if err != nil || len(body) > maxFeatureLevelBody {
		writeAdminError(w, errcode.New(errcode.InvalidArgument, "the body is unreadable or larger than %d bytes", maxFeatureLevelBody))
		return
	}
	var req struct {
		Level *uint32 `json:"level"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Level == nil {
		writeAdminError(w, errcode.New(errcode.InvalidArgument, `the body must be {"level": N} with N a feature level (%d to %d on this node)`, stream.BaselineFeatureLevel, stream.MaxFeatureLevel))
		return
	}
	raised, err := s.n.Cluster.RaiseFeatureLevel(r.Context(), *req.Level)
	var refusal *cluster.FeatureLevelRefusal
	switch {
	case errors.As(err, &refusal):
		nodes := []any{}
		for _, n := range refusal.Nodes {
			nodes = append(nodes, nodeLevelDoc(n))
		}
		writeJSON(w, errcode.HTTPStatus(errcode.FeatureLevelUnsupported), map[string]any{
			"code": errcode.Reason(errcode.FeatureLevelUnsupported), "message": refusal.Error(), "level": refusal.Level, "nodes": nodes})
	case err != nil:
		adminFail(w, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"level": *req.Level, "groups_raised": nonNil(raised)})
	}
}

// haltedLevel describes the first halted group for readiness: the level
// it reached that this build does not know (0 for a halt of another
// cause) and why.
func haltedLevel(groups []multiraft.GroupStatus) (group uint32, level uint32, detail string, ok bool) {
	for _, st := range groups {
		if st.Halted == nil {
			continue
		}
		var fe *stream.FeatureLevelError
		if errors.As(st.Halted, &fe) {
			level = fe.Level
		}
		return st.GroupID, level, st.Halted.Error(), true
	}
	return 0, 0, "", false
}
