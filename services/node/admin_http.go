package node

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/storage/multiraft"
)

// IncarnationHeader pins the process an admin mutation is meant for.
const IncarnationHeader = "x-ursula-process-incarnation"

// mutation wraps an admin mutation: a missing process incarnation is 428,
// another one (the target restarted) 412, both before anything changes.
func (s *Server) mutation(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(IncarnationHeader)
		switch {
		case got == "":
			writeJSON(w, http.StatusPreconditionRequired, map[string]any{"code": "INCARNATION_REQUIRED",
				"message": IncarnationHeader + " is required on admin mutations; read process_incarnation from /__ursula/metrics"})
		case got != s.incarnation:
			writeJSON(w, http.StatusPreconditionFailed, map[string]any{"code": "INCARNATION_MISMATCH",
				"message": "the target process restarted since the incarnation was read", "process_incarnation": s.incarnation})
		default:
			h(w, r)
		}
	}
}

// registerAdmin adds the Raft and leadership endpoints to the admin mux.
func (s *Server) registerAdmin(mux *http.ServeMux) {
	mux.HandleFunc("GET /__ursula/leadership-shed", s.serveShed)
	mux.HandleFunc("POST /__ursula/leadership-shed/maintenance", s.mutation(func(w http.ResponseWriter, r *http.Request) {
		s.eng.SetDraining(true)
		s.serveShed(w, r)
	}))
	mux.HandleFunc("DELETE /__ursula/leadership-shed/maintenance", s.mutation(func(w http.ResponseWriter, r *http.Request) {
		s.eng.SetDraining(false)
		s.serveShed(w, r)
	}))
	mux.HandleFunc("POST /__ursula/raft/{group}/leader/transfer/{to}", s.mutation(s.serveTransfer))
	mux.HandleFunc("POST /__ursula/raft/{group}/learners/{id}", s.mutation(s.serveAddLearner))
	mux.HandleFunc("POST /__ursula/raft/{group}/membership", s.mutation(s.serveMembership))
}

func (s *Server) serveShed(w http.ResponseWriter, _ *http.Request) {
	st := shedState(s.eng, s.cfg.ClusterID, s.eng.Config().NodeID)
	writeJSON(w, http.StatusOK, map[string]any{
		"cluster_id":                  st.GetClusterId(),
		"node_id":                     st.GetNodeId(),
		"bits":                        st.GetBits(),
		"state":                       st.GetState(),
		"should_accept_transfer":      st.GetShouldAcceptTransfer(),
		"should_campaign":             st.GetShouldCampaign(),
		"should_shed_current_leaders": st.GetShouldShedCurrentLeaders(),
	})
}

// groupParam parses the {group} path value; it answers 400 itself.
func (s *Server) groupParam(w http.ResponseWriter, r *http.Request) (uint32, bool) {
	g, err := strconv.ParseUint(r.PathValue("group"), 10, 32)
	if err != nil || int(g) >= s.eng.Config().GroupCount {
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT", "message": "group must be a number below raft.group_count"})
		return 0, false
	}
	return uint32(g), true
}

func nodeParam(w http.ResponseWriter, raw string) (uint64, bool) {
	id, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || id == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT", "message": "node id must be a positive number"})
		return 0, false
	}
	return id, true
}

// adminError answers a multiraft error: not leader → 409 with the leader.
func adminError(w http.ResponseWriter, err error) {
	var nl *multiraft.NotLeaderError
	switch {
	case errors.As(err, &nl):
		writeJSON(w, http.StatusConflict, map[string]any{"code": "NOT_LEADER", "message": "this node does not lead the group", "leader_id": nl.LeaderID})
	case errors.Is(err, multiraft.ErrNotVoter):
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": "NOT_A_VOTER", "message": err.Error()})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": "UNAVAILABLE", "message": err.Error()})
	}
}

func (s *Server) serveTransfer(w http.ResponseWriter, r *http.Request) {
	g, ok := s.groupParam(w, r)
	if !ok {
		return
	}
	to, ok := nodeParam(w, r.PathValue("to"))
	if !ok {
		return
	}
	if err := s.eng.Host().TransferLeader(r.Context(), g, to); err != nil {
		adminError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"raft_group_id": g, "transfer_to": to})
}

func (s *Server) serveAddLearner(w http.ResponseWriter, r *http.Request) {
	g, ok := s.groupParam(w, r)
	if !ok {
		return
	}
	id, ok := nodeParam(w, r.PathValue("id"))
	if !ok {
		return
	}
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(id)}}}
	if err := s.eng.Host().ProposeConfChange(r.Context(), g, cc); err != nil {
		adminError(w, err)
		return
	}
	if r.URL.Query().Get("blocking") == "true" {
		if !s.waitMembership(r.Context(), g, func(st multiraft.GroupStatus) bool { return slices.Contains(st.Learners, id) }) {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": "UNAVAILABLE", "message": "learner not added in time"})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"raft_group_id": g, "learner": id})
}

// serveMembership replaces a group's voter set in one joint change.
func (s *Server) serveMembership(w http.ResponseWriter, r *http.Request) {
	g, ok := s.groupParam(w, r)
	if !ok {
		return
	}
	raw := strings.TrimSpace(r.URL.Query().Get("voters"))
	if raw == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT", "message": "voters query parameter is required (comma-separated node ids)"})
		return
	}
	var want []uint64
	for _, part := range strings.Split(raw, ",") {
		id, ok := nodeParam(w, strings.TrimSpace(part))
		if !ok {
			return
		}
		want = append(want, id)
	}
	st := s.eng.Host().Status(g)
	if !st.IsLeader {
		adminError(w, &multiraft.NotLeaderError{LeaderID: st.LeaderID})
		return
	}
	cc := &pb.ConfChangeV2{}
	for _, id := range want {
		if !slices.Contains(st.Voters, id) {
			cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(id)})
		}
	}
	for _, id := range st.Voters {
		if !slices.Contains(want, id) {
			cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
		}
	}
	if len(cc.Changes) > 0 {
		if err := s.eng.Host().ProposeConfChange(r.Context(), g, cc); err != nil {
			adminError(w, err)
			return
		}
	}
	same := func(st multiraft.GroupStatus) bool {
		a, b := slices.Sorted(slices.Values(st.Voters)), slices.Sorted(slices.Values(want))
		return slices.Equal(a, b)
	}
	if !s.waitMembership(r.Context(), g, same) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": "UNAVAILABLE", "message": "the new voter set did not commit in time"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"raft_group_id": g, "voters": want, "committed_index": s.eng.Host().Status(g).Commit})
}

func (s *Server) waitMembership(ctx context.Context, g uint32, done func(multiraft.GroupStatus) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if done(s.eng.Host().Status(g)) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
