package ursulactl

import (
	"strings"
	"testing"
)

func p64(v uint64) *uint64 { return &v }

// replica builds a stalled voter of the three-voter group {1,2,3}.
func replica(id, lastIndex, lastTerm, term, commit uint64) *Replica {
	return &Replica{
		NodeID: id, ProcessIncarnation: "inc-" + string(rune('a'+id)), Running: true,
		Voters: [][]uint64{{1, 2, 3}}, Kept: [][]uint64{{1, 2, 3}}, Gate: "stalled",
		CommittedIndex: p64(commit), CommittedTerm: p64(lastTerm), CommittedNode: p64(1), LastAppliedIndex: commit,
		Expected: Expected{LastLogIndex: p64(lastIndex), LastLogTerm: p64(lastTerm), CurrentTerm: term},
	}
}

func sealed(t *testing.T, all []*Replica, unanswered ...uint64) *RecoveryPlan {
	t.Helper()
	p := computePlan("c", 7, all, unanswered)
	if err := p.seal(); err != nil {
		t.Fatal(err)
	}
	return p
}

// The longest log leads, no cut, the leader's step first; the proof is
// deterministic, covers each replica's process incarnation, and the
// operation id derives from the plan.
func TestPlanLongestLogLeads(t *testing.T) {
	all := []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30), replica(3, 50, 3, 3, 30)}
	p := sealed(t, all)
	if p.manualRepair != "" || len(p.Blockers) != 0 {
		t.Fatalf("plan not applicable: %q %v", p.manualRepair, p.Blockers)
	}
	if p.Leader != 2 || p.Point != 55 || p.Cut || p.HighestTerm != 3 {
		t.Fatalf("plan %+v", p)
	}
	if len(p.Steps) != 3 || p.Steps[0].NodeID != 2 || p.Steps[0].Step != "lead" || p.Steps[1].Step != "follow" {
		t.Fatalf("steps %+v", p.Steps)
	}
	if !strings.Contains(strings.Join(p.Consequences, "\n"), "may be gone") {
		t.Fatalf("consequences %v", p.Consequences)
	}
	again := sealed(t, []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30), replica(3, 50, 3, 3, 30)})
	if again.Proof != p.Proof || again.ID != p.ID || len(p.Proof) != 64 || len(p.ID) != 32 {
		t.Fatalf("proof not deterministic: %s/%s vs %s/%s", p.Proof, p.ID, again.Proof, again.ID)
	}
	restarted := []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30), replica(3, 50, 3, 3, 30)}
	restarted[2].ProcessIncarnation = "other"
	if q := sealed(t, restarted); q.Proof == p.Proof {
		t.Fatal("a replica's new process incarnation left the proof unchanged")
	}
}

// A replica that may still open, or a live leader, blocks apply; a voter
// set without a majority answering, or a committed entry above every
// plan's point, needs manual repair.
func TestPlanBlockersAndManualRepair(t *testing.T) {
	waiting := []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30), replica(3, 50, 3, 3, 30)}
	waiting[0].Gate = "awaiting_barrier"
	if p := sealed(t, waiting); len(p.Blockers) == 0 || applicable(p) == nil {
		t.Fatalf("a replica awaiting a barrier did not block: %+v", p.Blockers)
	}
	live := []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30)}
	live[1].LeadsLive, live[1].Gate = true, "open"
	if p := sealed(t, live, 3); len(p.Blockers) == 0 {
		t.Fatal("a live leader did not block")
	}
	if p := sealed(t, []*Replica{replica(1, 40, 3, 3, 30)}, 2, 3); p.manualRepair == "" || ExitCode(applicable(p)) != ExitManualRepair {
		t.Fatalf("one voter of three answering: %q", p.manualRepair)
	}
	ahead := []*Replica{replica(1, 40, 3, 3, 30), replica(2, 55, 3, 3, 30), replica(3, 50, 3, 3, 30)}
	ahead[0].LastAppliedIndex = 60
	if p := sealed(t, ahead); p.manualRepair == "" {
		t.Fatal("a replica that applied above the point did not need manual repair")
	}
}

// When the longest log's last term is below the floor (an election may
// have overwritten its tail), the plan cuts to the greatest committed
// entry of a replica that stays a voter.
func TestPlanCuts(t *testing.T) {
	all := []*Replica{replica(1, 60, 3, 5, 42), replica(2, 50, 3, 5, 45), replica(3, 48, 3, 5, 44)}
	p := sealed(t, all)
	if !p.Cut || p.Leader != 2 || p.Point != 45 || p.Floor != 5 {
		t.Fatalf("plan %+v", p)
	}
	single := []*Replica{replica(1, 60, 3, 5, 42)}
	single[0].Voters, single[0].Kept = [][]uint64{{1}}, [][]uint64{{1}}
	if p := sealed(t, single); p.Cut || p.Leader != 1 || p.Point != 60 {
		t.Fatalf("a single voter's log must be kept whole: %+v", p)
	}
}
