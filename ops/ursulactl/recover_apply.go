package ursulactl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Applying a recovery plan. The operation is recorded in a journal file
// (<journal dir>/<operation id>.json) before its first write and after
// every step, so that an apply interrupted by a timeout, a lost connection
// or a restart of ursulactl is finished by applying the same proof again:
// the journal's plan is used (never a recomputed one), and each remaining
// step finds its expected start (and is sent), its expected result (and is
// skipped), or neither (the operation diverges, keeps the record as
// evidence and stops).

// Journal states.
const (
	opApplying  = "applying"
	opWaiting   = "waiting"
	opCompleted = "completed"
	opDiverged  = "diverged"
	opRefused   = "refused"
)

// recoveryJournal is one operation's durable record.
type recoveryJournal struct {
	Version    int           `json:"version"`
	ID         string        `json:"id"`
	Proof      string        `json:"proof"`
	Group      uint32        `json:"raft_group_id"`
	Actor      string        `json:"actor"`
	Reason     string        `json:"reason"`
	State      string        `json:"state"`
	Plan       *RecoveryPlan `json:"plan"`
	PlanProof  string        `json:"plan_proof"`
	Replans    []string      `json:"replans"`
	LeaderTerm uint64        `json:"leader_term"`
	Steps      []journalStep `json:"steps"`
	Evidence   string        `json:"evidence,omitempty"`
	Started    time.Time     `json:"started"`
	Updated    time.Time     `json:"updated"`
}

type journalStep struct {
	NodeID  uint64      `json:"node_id"`
	Step    string      `json:"step"`
	Outcome string      `json:"outcome"`
	Answer  *planAnswer `json:"answer,omitempty"`
	Found   *Replica    `json:"found,omitempty"`
}

func (j *recoveryJournal) write(dir string) error {
	j.Updated = time.Now().UTC()
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("recovery journal: %w", err)
	}
	path := filepath.Join(dir, j.ID+".json")
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("recovery journal: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("recovery journal: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("recovery journal: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("recovery journal: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("recovery journal: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// findJournal returns the journal record of an operation with proof.
func findJournal(dir, proof string) (*recoveryJournal, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoRecoveryJournal
	}
	if err != nil {
		return nil, fmt.Errorf("recovery journal: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("recovery journal: %w", err)
		}
		var j recoveryJournal
		if err := json.Unmarshal(b, &j); err != nil {
			return nil, codedf(ExitManualRepair, "recovery journal %s does not decode (%v): repair it from evidence; it is never ignored", e.Name(), err)
		}
		if j.Proof == proof {
			return &j, nil
		}
	}
	return nil, errNoRecoveryJournal
}

// ApplyOptions tune an apply.
type ApplyOptions struct {
	ExpectProof string
	MaxPlans    int
	JournalDir  string
}

// Apply applies group g's recovery plan whose proof the operator reviewed.
// A new operation is confirmed (Options.Confirm) once its plan is known to
// have that proof and to be applicable, before its journal and first
// write; resuming a journaled operation asks nothing.
func (c *Controller) Apply(ctx context.Context, g uint32, o ApplyOptions) error {
	if c.opts.Actor == "" || strings.TrimSpace(c.opts.Reason) == "" {
		return fmt.Errorf("apply needs --actor and --reason (recorded in the journal and in every node's audit trail)")
	}
	j, err := findJournal(o.JournalDir, o.ExpectProof)
	switch {
	case err == nil && j.State == opCompleted:
		c.printf("operation %s (proof %s) already completed at %s: nothing written", j.ID, j.Proof, j.Updated.Format(time.RFC3339))
		return nil
	case err == nil:
		if j.Group != g {
			return abortf("proof %s belongs to an operation on group %d, not %d", o.ExpectProof, j.Group, g)
		}
		c.printf("resuming operation %s (state %s) with its recorded plan", j.ID, j.State)
		j.Plan.Proof = j.PlanProof
	case !errors.Is(err, errNoRecoveryJournal):
		return err
	default:
		p, err := c.Plan(ctx, g)
		if err != nil {
			return err
		}
		if p.Proof != o.ExpectProof {
			c.PrintPlan(p)
			return codedf(ExitProofMismatch, "the plan changed since it was reviewed: new proof %s (expected %s); nothing was written; review it with recover-group plan", p.Proof, o.ExpectProof)
		}
		if err := applicable(p); err != nil {
			return err
		}
		if err := c.confirm(ctx, Confirmation{
			Verb: "recover-group apply",
			Action: fmt.Sprintf("apply group %d's recovery plan %s (leader node %d, point %d, cut %t), accepting that writes acknowledged after the last fsync may be lost, and start a new history of the group",
				g, p.Proof, p.Leader, p.Point, p.Cut),
		}); err != nil {
			return err
		}
		j = &recoveryJournal{Version: 1, ID: p.ID, Proof: p.Proof, Group: g, Actor: c.opts.Actor, Reason: c.opts.Reason,
			State: opApplying, Plan: p, PlanProof: p.Proof, Replans: []string{}, Started: time.Now().UTC()}
		j.resetSteps()
		if err := j.write(o.JournalDir); err != nil {
			return err
		}
		c.printf("operation %s recorded in %s", j.ID, filepath.Join(o.JournalDir, j.ID+".json"))
	}
	return c.runOperation(ctx, j, o)
}

// ApplyResult is what an apply did (its --json document), from its
// journal.
type ApplyResult struct {
	Operation  string   `json:"operation"`
	Group      uint32   `json:"raft_group_id"`
	Proof      string   `json:"proof"`
	State      string   `json:"state"`
	Leader     uint64   `json:"leader"`
	LeaderTerm uint64   `json:"leader_term"`
	Replans    []string `json:"replans"`
	Journal    string   `json:"journal"`
}

// apply is Apply; it returns the operation as its journal records it.
func (c *Controller) apply(ctx context.Context, g uint32, o ApplyOptions) (*ApplyResult, error) {
	if err := c.Apply(ctx, g, o); err != nil {
		return nil, err
	}
	j, err := findJournal(o.JournalDir, o.ExpectProof)
	if err != nil {
		return nil, fmt.Errorf("read the operation's journal after it completed: %w", err)
	}
	r := &ApplyResult{Operation: j.ID, Group: j.Group, Proof: j.Proof, State: j.State, LeaderTerm: j.LeaderTerm,
		Replans: j.Replans, Journal: filepath.Join(o.JournalDir, j.ID+".json")}
	if j.Plan != nil {
		r.Leader = j.Plan.Leader
	}
	if r.Replans == nil {
		r.Replans = []string{}
	}
	return r, nil
}

func applicable(p *RecoveryPlan) error {
	if p.manualRepair != "" {
		return codedf(ExitManualRepair, "manual repair: %s", p.manualRepair)
	}
	if len(p.Blockers) > 0 {
		return abortf("apply is not possible now: %s", strings.Join(p.Blockers, "; "))
	}
	return nil
}

func (j *recoveryJournal) resetSteps() {
	j.Steps = make([]journalStep, len(j.Plan.Steps))
	for i, s := range j.Plan.Steps {
		j.Steps[i] = journalStep{NodeID: s.NodeID, Step: s.Step, Outcome: "pending"}
	}
	j.LeaderTerm = 0
}

// runOperation performs the journal's remaining steps, then waits until
// the plan is satisfied, planning again where the seed's rules say so.
func (c *Controller) runOperation(ctx context.Context, j *recoveryJournal, o ApplyOptions) error {
	plans := 1 + len(j.Replans)
	for {
		replan, err := c.runSteps(ctx, j, o)
		if err == nil && !replan {
			replan, err = c.awaitSatisfied(ctx, j, o)
			if err == nil && !replan {
				j.State = opCompleted
				if werr := j.write(o.JournalDir); werr != nil {
					return werr
				}
				c.printf("operation %s completed: group %d runs a new history led by node %d (plan term %d)", j.ID, j.Group, j.Plan.Leader, j.LeaderTerm)
				return nil
			}
		}
		if err != nil {
			return err
		}
		if plans >= o.MaxPlans {
			j.State = opRefused
			_ = j.write(o.JournalDir)
			return fmt.Errorf("the plan did not complete (%s) and --max-plans %d allows no other: observe with recover-group diagnose and plan again", j.Evidence, o.MaxPlans)
		}
		p, err := c.Plan(ctx, j.Group)
		if err != nil {
			return err
		}
		if err := applicable(p); err != nil {
			return err
		}
		plans++
		c.printf("planning again (%d of at most %d): %s; new plan %s, proof %s", plans, o.MaxPlans, j.Evidence, planSummary(p), p.Proof)
		j.Replans = append(j.Replans, p.Proof)
		j.Plan, j.PlanProof, j.State, j.Evidence = p, p.Proof, opApplying, ""
		j.resetSteps()
		if err := j.write(o.JournalDir); err != nil {
			return err
		}
	}
}

// runSteps sends the remaining steps, the leader's first. It reports
// whether the leader refused in a way another plan may fix.
func (c *Controller) runSteps(ctx context.Context, j *recoveryJournal, o ApplyOptions) (bool, error) {
	p := j.Plan
	for i := range p.Steps {
		s, js := p.Steps[i], &j.Steps[i]
		if stepSettled(js.Outcome) {
			continue // a resumed operation redoes only what did not settle
		}
		r, err := c.readReplica(ctx, s.NodeID, p.Group)
		if err != nil || r == nil {
			if s.Step == "lead" {
				return false, fmt.Errorf("the plan's leader, node %d, did not answer: %v; apply the same proof again once it does", s.NodeID, err)
			}
			js.Outcome = "unreachable"
			c.printf("step %d: node %d did not answer (%v): it takes no part; it rejoins through the plan's leader", i+1, s.NodeID, err)
			if err := j.write(o.JournalDir); err != nil {
				return false, err
			}
			continue
		}
		switch {
		case s.Step == "follow" && j.LeaderTerm > 0 && r.LeaderID == p.Leader && r.Expected.CurrentTerm > j.LeaderTerm:
			// The replicas that took the plan already elected its leader,
			// and this one follows it: it rejoins through it.
			js.Outcome, js.Found = "follows_plan_leader", r
			c.printf("step %d: node %d already follows the plan's leader, node %d: it rejoins through it", i+1, s.NodeID, p.Leader)
		case holdsPlan(r, p, s, j.LeaderTerm):
			js.Outcome, js.Found = "skipped", r
			if s.Step == "lead" && r.Recovery != nil {
				j.LeaderTerm = r.Recovery.LeaderTerm
			}
			if h, ok := r.history(); ok && s.Step == "lead" && j.LeaderTerm == 0 {
				j.LeaderTerm = h.PlanTerm
			}
			c.printf("step %d: node %d already holds the plan: skipped", i+1, s.NodeID)
		case atStart(r, s):
			a, err := c.sendStep(ctx, p, s, r.ProcessIncarnation, j.LeaderTerm)
			if err != nil {
				js.Outcome, js.Found = "error", r
				j.Evidence = err.Error()
				_ = j.write(o.JournalDir)
				return false, err
			}
			js.Answer = a
			if a.Status == 200 {
				js.Outcome = "taken"
				if s.Step == "lead" {
					j.LeaderTerm = a.LeaderTerm
				}
				c.printf("step %d: node %d %s (plan term %d)", i+1, s.NodeID, a.Outcome, a.LeaderTerm)
				break
			}
			js.Outcome = "refused"
			reason := ""
			if a.Refusal != nil {
				reason = a.Refusal.Reason
			}
			c.printf("step %d: node %d refused: %s: %s", i+1, s.NodeID, reason, a.Message)
			if s.Step == "lead" {
				j.State, j.Evidence = opRefused, fmt.Sprintf("the plan's leader node %d refused: %s", s.NodeID, reason)
				if err := j.write(o.JournalDir); err != nil {
					return false, err
				}
				if reason == "missing_vote_floor" || reason == "step_mismatch" {
					return false, fmt.Errorf("%s: no plan fixes that", j.Evidence)
				}
				return true, nil
			}
			if reason == "follows_leader" && a.Refusal.LeaderID == p.Leader {
				js.Outcome = "follows_plan_leader"
			}
		default:
			js.Outcome, js.Found = "diverged", r
			j.State = opDiverged
			j.Evidence = fmt.Sprintf("step %d on node %d found neither its expected start (no plan held, last log %s, current_term %d) nor its result (the plan held): last log %s, current_term %d, recovery %v",
				i+1, s.NodeID, logID(s.Before.LastLogTerm, s.Before.LastLogIndex), s.Before.CurrentTerm,
				logID(r.Expected.LastLogTerm, r.Expected.LastLogIndex), r.Expected.CurrentTerm, r.Recovery)
			if err := j.write(o.JournalDir); err != nil {
				return false, err
			}
			return false, codedf(ExitDiverged, "operation %s diverged: %s; the journal keeps the evidence; bring the replica back to the expected start and apply the same proof again", j.ID, j.Evidence)
		}
		if err := j.write(o.JournalDir); err != nil {
			return false, err
		}
	}
	j.State = opWaiting
	return false, j.write(o.JournalDir)
}

// stepSettled reports a step outcome an apply never redoes.
func stepSettled(outcome string) bool {
	switch outcome {
	case "taken", "skipped", "follows_plan_leader", "refused":
		return true
	}
	return false
}

// holdsPlan reports a replica that reached the step's expected result: it
// holds the plan, or already applied the history it started.
func holdsPlan(r *Replica, p *RecoveryPlan, s PlanStep, leaderTerm uint64) bool {
	if rc := r.Recovery; rc != nil {
		return rc.Leader == p.Leader && rc.Point == p.Point && rc.Role == s.Step &&
			(s.Step == "lead" || rc.LeaderTerm == leaderTerm)
	}
	h, ok := r.history()
	return ok && h.EventIndex > p.Point && (leaderTerm == 0 || h.PlanTerm == leaderTerm)
}

// atStart reports a replica at the step's expected start.
func atStart(r *Replica, s PlanStep) bool {
	same := func(a, b *uint64) bool { return u64(a) == u64(b) && (a == nil) == (b == nil) }
	return r.Recovery == nil && same(r.Expected.LastLogIndex, s.Before.LastLogIndex) && same(r.Expected.LastLogTerm, s.Before.LastLogTerm) &&
		(r.Gate == "open" || r.Expected.CurrentTerm == s.Before.CurrentTerm)
}

// awaitSatisfied waits until every replica that took the plan applied the
// new history event (recovery back to null, history at the plan term). It
// reports a wedged plan (seen twice in a row) for planning again.
func (c *Controller) awaitSatisfied(ctx context.Context, j *recoveryJournal, o ApplyOptions) (bool, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	p := j.Plan
	prog := c.newProgress(fmt.Sprintf("group %d: waiting for the plan", p.Group), false)
	defer prog.finish()
	wedged := 0
	for {
		done, wedge, why := true, false, ""
		var leaderLog []int64
		all, _ := c.readReplicas(ctx, p.Group)
		for _, r := range all {
			if r.NodeID == p.Leader {
				leaderLog = []int64{u(r.Expected.LastLogTerm, -1), u(r.Expected.LastLogIndex, -1)}
			}
		}
		for i, s := range p.Steps {
			if o := j.Steps[i].Outcome; o != "taken" && o != "skipped" && o != "follows_plan_leader" {
				continue
			}
			var r *Replica
			for _, x := range all {
				if x.NodeID == s.NodeID {
					r = x
				}
			}
			if r == nil {
				done, why = false, fmt.Sprintf("node %d did not answer", s.NodeID)
				continue
			}
			if r.Recovery != nil {
				done, why = false, fmt.Sprintf("node %d still holds the plan", s.NodeID)
				longer := leaderLog != nil && cmpTuple([]int64{u(r.Expected.LastLogTerm, -1), u(r.Expected.LastLogIndex, -1)}, leaderLog) > 0
				if longer || r.Gate == "stalled" && r.Recovery.LeaderTerm == j.LeaderTerm {
					wedge, why = true, fmt.Sprintf("node %d holds the plan with a longer log than its leader (a greater last log id), or reports the group stalled", s.NodeID)
				}
				continue
			}
			if h, ok := r.history(); !ok || h.PlanTerm != j.LeaderTerm {
				done, why = false, fmt.Sprintf("node %d has not applied the plan's history event", s.NodeID)
			}
		}
		if done {
			return false, nil
		}
		if wedge {
			wedged++
		} else {
			wedged = 0
		}
		prog.set(0, 0, fmt.Sprintf("group %d: operation %s: %s", p.Group, j.ID, why))
		if wedged >= 2 {
			j.Evidence = "the plan wedged: " + why
			return true, j.write(o.JournalDir)
		}
		if !c.sleep(ctx) {
			j.Evidence = "not satisfied in time: " + why
			_ = j.write(o.JournalDir)
			return false, fmt.Errorf("operation %s: the plan is not satisfied yet (%s); apply the same proof again to keep waiting", j.ID, why)
		}
	}
}
