package ursulactl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// recover-group: the seed's accept-unsynced-loss recovery of one stalled
// Raft group as a recovery operation (diagnose → plan → apply). The plan is
// computed from every replica's metrics as the seed's runbook does; its
// proof is the SHA-256 of the canonical plan (bindings with each replica's
// process incarnation, the plan, its steps and consequences); apply
// recomputes it, refuses a plan whose proof differs, journals the operation
// before its first write and sends the plan to its leader first.

// Exit codes of recover-group beyond ExitOK, ExitError and ExitAborted.
const (
	// ExitProofMismatch: the plan recomputed at apply has another proof;
	// nothing was written.
	ExitProofMismatch = 3
	// ExitDiverged: a step found neither its expected start nor its
	// expected result; the journal keeps the evidence.
	ExitDiverged = 4
	// ExitManualRepair: no plan can prove what the group committed (a
	// voter set without a majority answering, a replica that knows a later
	// committed entry than any plan would keep): restore the group from a
	// backup or bring back the missing voters.
	ExitManualRepair = 5
)

// codedError carries a recover-group exit code.
type codedError struct {
	code int
	msg  string
}

func (e *codedError) Error() string { return e.msg }

func codedf(code int, format string, args ...any) error {
	return &codedError{code: code, msg: fmt.Sprintf(format, args...)}
}

// Replica is one replica's state of the group, as its metrics report it
// (the fields the seed's runbook reads).
type Replica struct {
	NodeID             uint64          `json:"node_id"`
	ProcessIncarnation string          `json:"process_incarnation"`
	Running            bool            `json:"running"`
	Voters             [][]uint64      `json:"voters"`
	Kept               [][]uint64      `json:"kept"`
	Gate               string          `json:"gate"`
	Recovery           *RecoveryState  `json:"recovery"`
	CommittedIndex     *uint64         `json:"committed_index"`
	CommittedTerm      *uint64         `json:"committed_term"`
	CommittedNode      *uint64         `json:"committed_node"`
	LastAppliedIndex   uint64          `json:"last_applied_index"`
	Expected           Expected        `json:"expected"`
	LeadsLive          bool            `json:"leads_live"`
	LeaderID           uint64          `json:"leader_id"`
	History            json.RawMessage `json:"history"`
}

// Expected is the log a replica reports, as a plan request expects it.
type Expected struct {
	LastLogIndex *uint64 `json:"last_log_index"`
	LastLogTerm  *uint64 `json:"last_log_term"`
	CurrentTerm  uint64  `json:"current_term"`
}

// RecoveryState is the plan a replica holds (metrics' recovery).
type RecoveryState struct {
	Leader     uint64 `json:"leader"`
	LeaderTerm uint64 `json:"leader_term"`
	Point      uint64 `json:"point"`
	Cut        bool   `json:"cut"`
	Role       string `json:"role"`
	LeaderLost bool   `json:"leader_lost"`
}

// historyEvent is the part of metrics' history a plan's completion reads.
type historyEvent struct {
	EventIndex uint64 `json:"event_index"`
	PlanTerm   uint64 `json:"plan_term"`
}

func (r *Replica) history() (historyEvent, bool) {
	var h historyEvent
	if len(r.History) == 0 || string(r.History) == "null" || json.Unmarshal(r.History, &h) != nil {
		return h, false
	}
	return h, true
}

func u(p *uint64, def int64) int64 {
	if p == nil {
		return def
	}
	return int64(*p)
}

// inSets reports whether n is named by any of the sets.
func inSets(sets [][]uint64, n uint64) bool {
	for _, s := range sets {
		if slices.Contains(s, n) {
			return true
		}
	}
	return false
}

// votes reports whether the replica is a voter of the membership it would
// campaign under: its kept sets after a cut, its current ones otherwise.
func (r *Replica) votes(cut bool) bool {
	if cut {
		return inSets(r.Kept, r.NodeID)
	}
	return inSets(r.Voters, r.NodeID)
}

// readReplicas reads group g's state from every manifest node; the nodes
// that did not answer are returned by id with their error.
func (c *Controller) readReplicas(ctx context.Context, g uint32) ([]*Replica, map[uint64]error) {
	missing := map[uint64]error{}
	var out []*Replica
	for _, n := range c.m.Nodes {
		r, err := c.readReplica(ctx, n.ID, g)
		if err != nil {
			missing[n.ID] = err
			continue
		}
		if r != nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *Replica) int { return int(a.NodeID) - int(b.NodeID) })
	return out, missing
}

// readReplica reads node id's replica of g (nil when it holds none).
func (c *Controller) readReplica(ctx context.Context, id uint64, g uint32) (*Replica, error) {
	cl, err := c.client(id)
	if err != nil {
		return nil, err
	}
	var doc struct {
		NodeID             uint64 `json:"node_id"`
		ClusterID          string `json:"cluster_id"`
		ProcessIncarnation string `json:"process_incarnation"`
		Groups             []struct {
			GroupID        uint32          `json:"raft_group_id"`
			LeaderID       uint64          `json:"leader_id"`
			Voters         [][]uint64      `json:"voter_configs"`
			Kept           [][]uint64      `json:"committed_voter_configs"`
			Gate           string          `json:"recovery_gate"`
			Recovery       *RecoveryState  `json:"recovery"`
			CommittedIndex *uint64         `json:"committed_index"`
			CommittedTerm  *uint64         `json:"committed_term"`
			CommittedNode  *uint64         `json:"committed_node"`
			LastApplied    uint64          `json:"last_applied_index"`
			LastLogIndex   *uint64         `json:"last_log_index"`
			LastLogTerm    *uint64         `json:"last_log_term"`
			CurrentTerm    uint64          `json:"current_term"`
			LeadsLive      bool            `json:"leads_live"`
			History        json.RawMessage `json:"history"`
			Maintenance    struct {
				Running bool `json:"running"`
			} `json:"maintenance"`
		} `json:"raft_groups"`
	}
	if err := cl.metricsInto(ctx, &doc); err != nil {
		return nil, err
	}
	if err := c.checkIdentity(id, &Metrics{NodeID: doc.NodeID, ClusterID: doc.ClusterID}); err != nil {
		return nil, err
	}
	for _, gm := range doc.Groups {
		if gm.GroupID != g {
			continue
		}
		return &Replica{
			NodeID: doc.NodeID, ProcessIncarnation: doc.ProcessIncarnation, Running: gm.Maintenance.Running,
			Voters: gm.Voters, Kept: gm.Kept, Gate: gm.Gate, Recovery: gm.Recovery,
			CommittedIndex: gm.CommittedIndex, CommittedTerm: gm.CommittedTerm, CommittedNode: gm.CommittedNode,
			LastAppliedIndex: gm.LastApplied, LeadsLive: gm.LeadsLive, LeaderID: gm.LeaderID, History: gm.History,
			Expected: Expected{LastLogIndex: gm.LastLogIndex, LastLogTerm: gm.LastLogTerm, CurrentTerm: gm.CurrentTerm},
		}, nil
	}
	return nil, nil
}

// RecoveryPlan is a computed plan of one group, in its canonical form (the
// proof is the SHA-256 of its JSON encoding without the proof).
type RecoveryPlan struct {
	Version      int         `json:"version"`
	Operation    string      `json:"operation"`
	ID           string      `json:"id"`
	ClusterID    string      `json:"cluster_id"`
	Group        uint32      `json:"raft_group_id"`
	Consequences []string    `json:"consequences"`
	Bindings     []*Replica  `json:"bindings"`
	Unanswered   []uint64    `json:"unanswered"`
	Leader       uint64      `json:"leader"`
	Point        uint64      `json:"point"`
	Cut          bool        `json:"cut"`
	PointEntry   *PointEntry `json:"point_entry,omitempty"`
	HighestTerm  uint64      `json:"highest_term"`
	Floor        uint64      `json:"floor"`
	Steps        []PlanStep  `json:"steps"`
	Blockers     []string    `json:"blockers"`
	Proof        string      `json:"-"`
	manualRepair string
}

// PointEntry names the entry a cut keeps at the point.
type PointEntry struct {
	Term   uint64 `json:"term"`
	NodeID uint64 `json:"node_id"`
}

// PlanStep is one request of the plan, with the state it expects before
// and leaves after.
type PlanStep struct {
	NodeID      uint64   `json:"node_id"`
	Step        string   `json:"step"`
	Incarnation string   `json:"process_incarnation"`
	Before      Expected `json:"expect_before"`
	After       string   `json:"expect_after"`
}

// Placeholder of the operation id while the plan seed is computed.
const idPlaceholder = "00000000000000000000000000000000"

// computePlan is the seed's planning algorithm over the replicas that
// answered. A plan with blockers cannot be applied now; one with
// manualRepair cannot be applied at all.
func computePlan(clusterID string, g uint32, all []*Replica, unanswered []uint64) *RecoveryPlan {
	p := &RecoveryPlan{Version: 1, Operation: "accept-unsynced-loss", ID: idPlaceholder, ClusterID: clusterID, Group: g,
		Bindings: all, Unanswered: unanswered, Consequences: []string{}, Blockers: []string{}, Steps: []PlanStep{}}
	if p.Unanswered == nil {
		p.Unanswered = []uint64{}
	}
	var running []*Replica
	for _, r := range all {
		if r.Running {
			running = append(running, r)
		}
	}
	answered := func(n uint64) bool {
		return slices.ContainsFunc(running, func(r *Replica) bool { return r.NodeID == n })
	}
	var sets [][]uint64
	for _, r := range running {
		for _, s := range append(slices.Clone(r.Voters), r.Kept...) {
			if len(s) > 0 && !slices.ContainsFunc(sets, func(t []uint64) bool { return slices.Equal(s, t) }) {
				sets = append(sets, s)
			}
		}
	}
	voters := map[uint64]bool{}
	for _, s := range sets {
		n := 0
		for _, v := range s {
			voters[v] = true
			if answered(v) {
				n++
			}
		}
		if n*2 <= len(s) {
			p.manualRepair = fmt.Sprintf("the voter set %v has no majority of its voters answering: no plan can prove what the group committed; bring those voters back, or restore the group from a backup", s)
			return p
		}
	}
	for _, r := range running {
		if r.Gate != "open" || r.Recovery != nil {
			p.Floor = max(p.Floor, r.Expected.CurrentTerm)
		}
		switch {
		case r.LeadsLive:
			p.Blockers = append(p.Blockers, fmt.Sprintf("node %d leads the group with a live quorum: nothing to recover", r.NodeID))
		case r.Gate == "awaiting_barrier" || r.Gate == "catching_up" || r.Gate == "cutting":
			p.Blockers = append(p.Blockers, fmt.Sprintf("node %d's gate is %s: it may still open through a leader's barrier without losing anything; wait until it reports stalled", r.NodeID, r.Gate))
		}
	}
	for _, r := range all {
		p.HighestTerm = max(p.HighestTerm, r.Expected.CurrentTerm)
	}
	var candidates []*Replica
	for _, r := range running {
		if voters[r.NodeID] {
			candidates = append(candidates, r)
		}
	}
	if len(candidates) == 0 {
		p.manualRepair = "no replica that answered is a voter of any reported membership"
		return p
	}
	longest := slices.MaxFunc(candidates, func(a, b *Replica) int {
		return cmpTuple(
			[]int64{u(a.Expected.LastLogTerm, -1), u(a.Expected.LastLogIndex, -1), b2i(a.votes(false)), int64(a.NodeID)},
			[]int64{u(b.Expected.LastLogTerm, -1), u(b.Expected.LastLogIndex, -1), b2i(b.votes(false)), int64(b.NodeID)})
	})
	named := map[uint64]bool{}
	for _, s := range append(slices.Clone(longest.Voters), longest.Kept...) {
		for _, v := range s {
			named[v] = true
		}
	}
	single := len(named) == 1
	p.Cut = !single && (uint64(u(longest.Expected.LastLogTerm, 0)) < p.Floor || !longest.votes(false))
	leader := longest
	if p.Cut {
		var keepers []*Replica
		for _, r := range candidates {
			if r.votes(true) {
				keepers = append(keepers, r)
			}
		}
		if len(keepers) == 0 {
			p.manualRepair = "no replica the plan may elect is a voter of the membership it would campaign under"
			return p
		}
		leader = slices.MaxFunc(keepers, func(a, b *Replica) int {
			return cmpTuple([]int64{u(a.CommittedIndex, -1), int64(a.NodeID)}, []int64{u(b.CommittedIndex, -1), int64(b.NodeID)})
		})
		p.Point = uint64(u(leader.CommittedIndex, 0))
		var known *Replica
		for _, r := range all {
			if r.CommittedIndex != nil && r.CommittedTerm != nil &&
				(known == nil || cmpTuple([]int64{int64(*r.CommittedIndex), int64(r.NodeID)}, []int64{int64(*known.CommittedIndex), int64(known.NodeID)}) > 0) {
				known = r
			}
		}
		if known != nil && *known.CommittedIndex > p.Point {
			var reaches *Replica
			for _, r := range candidates {
				if r.votes(true) && r.votes(false) && u(r.Expected.LastLogIndex, -1) >= int64(*known.CommittedIndex) &&
					(reaches == nil || cmpTuple([]int64{u(r.CommittedIndex, -1), int64(r.NodeID)}, []int64{u(reaches.CommittedIndex, -1), int64(reaches.NodeID)}) > 0) {
					reaches = r
				}
			}
			if reaches != nil {
				leader, p.Point = reaches, *known.CommittedIndex
				p.PointEntry = &PointEntry{Term: *known.CommittedTerm, NodeID: u64(known.CommittedNode)}
			}
		}
	} else {
		p.Point = uint64(u(leader.Expected.LastLogIndex, 0))
	}
	p.Leader = leader.NodeID
	for _, r := range all {
		if top := max(u64(r.CommittedIndex), r.LastAppliedIndex); top > p.Point {
			p.manualRepair = fmt.Sprintf("node %d knows committed or applied index %d, above the point %d every plan would keep: a plan would overwrite those committed entries; bring back a voter that may hold them, or restore the group from a backup", r.NodeID, top, p.Point)
			return p
		}
	}
	// The leader first, then every other replica that answered.
	order := append([]*Replica{leader}, slices.DeleteFunc(slices.Clone(running), func(r *Replica) bool { return r == leader })...)
	for _, r := range order {
		st := PlanStep{NodeID: r.NodeID, Step: "follow", Incarnation: r.ProcessIncarnation, Before: r.Expected,
			After: fmt.Sprintf("recovery: follow node %d above the plan term the leader answers", leader.NodeID)}
		if r == leader {
			st.Step, st.After = "lead", "recovery: lead at a plan term at least the highest term; campaigns above it"
		}
		p.Steps = append(p.Steps, st)
	}
	p.Consequences = consequences(p, all)
	return p
}

// consequences are printed first: what the plan may lose and what changes
// for clients.
func consequences(p *RecoveryPlan, all []*Replica) []string {
	out := []string{
		fmt.Sprintf("Writes acknowledged after the last fsync of the surviving replicas may be gone: group %d keeps its log up to index %d of node %d%s, and no replica can say what was acknowledged beyond the logs that survived.",
			p.Group, p.Point, p.Leader, map[bool]string{true: " (cut back to a committed entry)", false: ""}[p.Cut]),
	}
	for _, r := range all {
		if last := u64(r.Expected.LastLogIndex); last > p.Point {
			out = append(out, fmt.Sprintf("Node %d holds entries %d..%d above the point: they are dropped (they were never known committed).", r.NodeID, p.Point+1, last))
		}
	}
	out = append(out,
		fmt.Sprintf("A new history of group %d starts: every stream of the group gets a new Stream-Incarnation; a client holding the old token gets 412 with the new one, and HEAD answers Stream-Previous-Incarnation and Stream-Inherited-Offset (how much of the stream survived).", p.Group),
		"Every producer epoch claimed before is closed: a producer's next new write in it answers 403 with Producer-Outcome: epoch-closed;by=history, and the producer claims a new epoch.",
		"The group serves nothing (503 with Retry-After) until the new history event applied on each replica.")
	return out
}

func cmpTuple(a, b []int64) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func u64(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// seal derives the operation id from the plan seed and computes the proof:
// the seed is the SHA-256 of the canonical plan with the id placeholder,
// the id 128 bits of a hash of the seed under its own domain, the proof
// the SHA-256 of the final plan. The proof is never an input to it.
func (p *RecoveryPlan) seal() error {
	p.ID = idPlaceholder
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	seed := sha256.Sum256(append([]byte("ursula.recover-group.seed\x00"), b...))
	id := sha256.Sum256(append([]byte("ursula.recover-group.id\x00operation\x00"), seed[:]...))
	p.ID = hex.EncodeToString(id[:16])
	b, err = json.Marshal(p)
	if err != nil {
		return err
	}
	proof := sha256.Sum256(b)
	p.Proof = hex.EncodeToString(proof[:])
	return nil
}

// Plan computes group g's recovery plan from the replicas now.
func (c *Controller) Plan(ctx context.Context, g uint32) (*RecoveryPlan, error) {
	all, missing := c.readReplicas(ctx, g)
	var unanswered []uint64
	for id := range missing {
		unanswered = append(unanswered, id)
	}
	slices.Sort(unanswered)
	if len(all) == 0 {
		return nil, fmt.Errorf("no node answered with a replica of group %d", g)
	}
	p := computePlan(c.m.ClusterID, g, all, unanswered)
	if err := p.seal(); err != nil {
		return nil, err
	}
	return p, nil
}

// Diagnose prints every replica's state of group g, what is stalled and
// why, and the operations that answer it. It changes nothing.
func (c *Controller) Diagnose(ctx context.Context, g uint32) error {
	_, err := c.diagnose(ctx, g)
	return err
}

// Diagnosis is what diagnose read and concluded (its --json document).
type Diagnosis struct {
	Group    uint32     `json:"raft_group_id"`
	Replicas []*Replica `json:"replicas"`
	// Unanswered maps the nodes that did not answer to their error.
	Unanswered map[uint64]string `json:"unanswered"`
	// Live says a replica leads the group with a live quorum; Waiting
	// and Stalled count the gated replicas that wait for a barrier and
	// that report the group stalled.
	Live    bool `json:"live"`
	Waiting int  `json:"waiting"`
	Stalled int  `json:"stalled"`
	// Verdict is the conclusion diagnose prints last.
	Verdict string `json:"verdict"`
}

// diagnose is Diagnose; it returns what it printed.
func (c *Controller) diagnose(ctx context.Context, g uint32) (*Diagnosis, error) {
	all, missing := c.readReplicas(ctx, g)
	d := &Diagnosis{Group: g, Replicas: all, Unanswered: map[uint64]string{}}
	if d.Replicas == nil {
		d.Replicas = []*Replica{}
	}
	for id, err := range missing {
		d.Unanswered[id] = err.Error()
	}
	c.printf("group %d: %d replicas answered, %d nodes did not", g, len(all), len(missing))
	for _, id := range mapsKeys(missing) {
		c.printf("  node %d: no answer: %v", id, missing[id])
	}
	stalled, waiting, live := 0, 0, false
	for _, r := range all {
		rec := "none"
		if r.Recovery != nil {
			rec = fmt.Sprintf("%s (leader node %d, plan term %d, point %d)", r.Recovery.Role, r.Recovery.Leader, r.Recovery.LeaderTerm, r.Recovery.Point)
		}
		c.printf("  node %d (process %s): gate %s, recovery %s, leader %d, leads_live %t, current_term %d, last log %s, committed %s, applied %d, voters %v, kept %v",
			r.NodeID, r.ProcessIncarnation, r.Gate, rec, r.LeaderID, r.LeadsLive, r.Expected.CurrentTerm,
			logID(r.Expected.LastLogTerm, r.Expected.LastLogIndex), logID(r.CommittedTerm, r.CommittedIndex), r.LastAppliedIndex, r.Voters, r.Kept)
		switch {
		case r.LeadsLive:
			live = true
		case r.Gate == "stalled":
			stalled++
		case r.Gate != "open":
			waiting++
		}
	}
	d.Live, d.Waiting, d.Stalled = live, waiting, stalled
	switch {
	case live:
		d.Verdict = "the group has a live leader: nothing to recover (gated replicas open through its barrier)"
	case waiting > 0:
		d.Verdict = fmt.Sprintf("%d replica(s) wait for a leader's barrier: they may still open without losing anything; wait until they report stalled (30 s without a barrier or an applied entry)", waiting)
	case stalled > 0:
		d.Verdict = fmt.Sprintf("%d replica(s) report the group stalled: no leader can be elected without a vote of a gated replica, and writes acknowledged after the last fsync may be gone", stalled)
	default:
		d.Verdict = "no gate is closed; a group without a leader here is raft_replica_unready: check the nodes' connectivity"
	}
	c.printf("%s", d.Verdict)
	if !live && waiting == 0 && stalled > 0 {
		c.printf("next: ursulactl recover-group plan --group %d (read-only), review it, then apply it with its proof", g)
	}
	return d, nil
}

func logID(term, index *uint64) string {
	if index == nil {
		return "empty"
	}
	return fmt.Sprintf("%d@term %d", *index, u64(term))
}

func mapsKeys(m map[uint64]error) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// PrintPlan prints a plan: consequences first, then bindings, steps,
// whether apply is possible now and its command, and the proof last.
func (c *Controller) PrintPlan(p *RecoveryPlan) {
	c.printf("recovery operation %s of group %d (accept-unsynced-loss), operation id %s", "plan", p.Group, p.ID)
	if p.manualRepair != "" {
		c.printf("manual repair: %s", p.manualRepair)
	}
	c.printf("consequences:")
	for _, s := range p.Consequences {
		c.printf("  - %s", s)
	}
	c.printf("bindings (read from each replica's /__ursula/metrics):")
	for _, r := range p.Bindings {
		c.printf("  node %d process %s: running %t, gate %s, current_term %d, last log %s, committed %s, applied %d, voters %v, kept %v",
			r.NodeID, r.ProcessIncarnation, r.Running, r.Gate, r.Expected.CurrentTerm, logID(r.Expected.LastLogTerm, r.Expected.LastLogIndex),
			logID(r.CommittedTerm, r.CommittedIndex), r.LastAppliedIndex, r.Voters, r.Kept)
	}
	if len(p.Unanswered) > 0 {
		c.printf("  did not answer: nodes %v", p.Unanswered)
	}
	if p.manualRepair == "" {
		c.printf("plan: leader node %d, point %d, cut %t, floor %d, highest_term %d", p.Leader, p.Point, p.Cut, p.Floor, p.HighestTerm)
		for i, s := range p.Steps {
			c.printf("  step %d: %s on node %d (process %s); expects last log %s, current_term %d, no plan held; leaves %s",
				i+1, s.Step, s.NodeID, s.Incarnation, logID(s.Before.LastLogTerm, s.Before.LastLogIndex), s.Before.CurrentTerm, s.After)
		}
	}
	switch {
	case p.manualRepair != "":
		c.printf("apply possible now: no (manual repair)")
	case len(p.Blockers) > 0:
		c.printf("apply possible now: no")
		for _, b := range p.Blockers {
			c.printf("  - %s", b)
		}
	default:
		c.printf("apply possible now: yes")
	}
	c.printf("apply: ursulactl recover-group apply --group %d --expect-proof %s --actor NAME --reason TEXT", p.Group, p.Proof)
	c.printf("proof %s", p.Proof)
}

// planRequestBody is the seed's request of one step.
func planRequestBody(p *RecoveryPlan, s PlanStep, leaderTerm uint64) ([]byte, error) {
	body := map[string]any{"leader": p.Leader, "point": p.Point, "cut": p.Cut, "expected": s.Before}
	if p.PointEntry != nil {
		body["point_entry"] = p.PointEntry
	}
	if s.Step == "lead" {
		body["step"] = map[string]any{"lead": map[string]any{"highest_term": p.HighestTerm}}
	} else {
		body["step"] = map[string]any{"follow": map[string]any{"leader_term": leaderTerm}}
	}
	return json.Marshal(body)
}

// planAnswer is a replica's answer to one step.
type planAnswer struct {
	Status     int    `json:"status"`
	Outcome    string `json:"outcome,omitempty"`
	LeaderTerm uint64 `json:"leader_term,omitempty"`
	Refusal    *struct {
		Reason   string `json:"reason"`
		LeaderID uint64 `json:"leader_id,omitempty"`
	} `json:"refusal,omitempty"`
	Message string `json:"message,omitempty"`
}

// sendStep sends one step to its replica, pinned to the incarnation read
// just before.
func (c *Controller) sendStep(ctx context.Context, p *RecoveryPlan, s PlanStep, incarnation string, leaderTerm uint64) (*planAnswer, error) {
	cl, err := c.client(s.NodeID)
	if err != nil {
		return nil, err
	}
	body, err := planRequestBody(p, s, leaderTerm)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set(IncarnationHeader, incarnation)
	h.Set(ProofHeader, p.Proof)
	if cl.actor != "" {
		h.Set(ActorHeader, cl.actor)
	}
	if cl.reason != "" {
		h.Set(ReasonHeader, cl.reason)
	}
	url := fmt.Sprintf("%s/__ursula/raft/%d/recovery/accept-unsynced-loss", cl.node.AdminURL, p.Group)
	status, rh, rb, err := cl.requestBody(ctx, http.MethodPost, url, h, true, body)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	switch status {
	case http.StatusOK, http.StatusConflict:
		a := &planAnswer{Status: status}
		if err := json.Unmarshal(rb, a); err != nil {
			return nil, fmt.Errorf("POST %s: %d answer: %w", url, status, err)
		}
		return a, nil
	case http.StatusPreconditionFailed:
		return nil, abortf("node %d restarted since its state was read (412): nothing was changed by this step", s.NodeID)
	default:
		return nil, statusError(http.MethodPost, url, status, rh, rb)
	}
}

// ProofHeader carries the proof of the plan a mutation applies.
const ProofHeader = "x-ursula-proof"

// errNoRecoveryJournal reports a proof no journal record holds.
var errNoRecoveryJournal = errors.New("no journal record of that proof")

func planSummary(p *RecoveryPlan) string {
	return fmt.Sprintf("leader node %d, point %d, cut %t", p.Leader, p.Point, p.Cut)
}
