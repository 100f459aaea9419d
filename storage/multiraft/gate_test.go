package multiraft

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
	"github.com/ursula/ursula/storage/wal/powerloss"
	"github.com/ursula/ursula/tests/await"
)

// crash stops a node as a host crash would: without recording a clean
// shutdown, and on a boot its next start does not share (its running
// record is gone, as if the kernel's boot id had changed).
func (c *cluster) crash(tb testing.TB, id uint64) {
	tb.Helper()
	c.processCrash(tb, id)
	cfg := c.cfgs[id]
	fsys := cfg.FS
	if fsys == nil {
		fsys = wal.OSFS{}
	}
	if err := wal.ForgetRunning(fsys, wal.LogDir(cfg.Dir)); err != nil {
		tb.Fatal(err)
	}
}

// processCrash stops a node as a crash of its process alone would: the
// host, and its page cache, live on.
func (c *cluster) processCrash(tb testing.TB, id uint64) {
	tb.Helper()
	c.net.set(id, nil)
	c.nodes[id].halt(tb)
	delete(c.nodes, id)
}

// TestRecoveryGate: a voter restarted after a crash under fsync "never"
// holds every group it had behind the gate, recorded so that a further
// restart keeps it; a gated replica still follows its leader but helps
// elect no one; OpenGate opens it for good. A clean restart gates nothing.
func TestRecoveryGate(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 2, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	l := c.leader(t, 0)
	var a uint64
	for id, n := range c.nodes {
		if n != l {
			a = id
			break
		}
	}

	c.stop(t, a)
	if got := c.start(t, a).h.Gated(); len(got) != 0 {
		t.Fatalf("after a clean restart gated %v, want none", got)
	}
	c.processCrash(t, a)
	if got := c.start(t, a).h.Gated(); len(got) != 0 {
		t.Fatalf("after a crash of the process alone gated %v, want none", got)
	}
	c.crash(t, a)
	if got := c.start(t, a).h.Gated(); !slices.Equal(got, []uint32{0, 1}) {
		t.Fatalf("after a crash gated %v, want both groups", got)
	}
	c.processCrash(t, a)
	if got := c.start(t, a).h.Gated(); !slices.Equal(got, []uint32{0, 1}) {
		t.Fatalf("after a crash of the process alone gated %v, want the recorded gates kept", got)
	}
	c.crash(t, a)
	na := c.start(t, a)
	if got := na.h.Gated(); !slices.Equal(got, []uint32{0, 1}) || !na.h.Status(0).Gated {
		t.Fatalf("after a second start gated %v, want the recorded gates kept", got)
	}
	// A gated replica follows its leader.
	c.proposeN(t, 0, 5)
	c.converged(t, 0)

	// Without the gated replica's vote the survivor of the leader's stop
	// elects no one in the groups the stopped node led: its (pre-)vote
	// requests are dropped. (A group the survivor already leads keeps its
	// leader: the gated replica still follows.)
	var orphaned []uint32
	for g := range uint32(2) {
		if l.h.Status(g).IsLeader {
			orphaned = append(orphaned, g)
		}
	}
	c.stop(t, l.h.cfg.NodeID)
	var b *testNode
	for id, n := range c.nodes {
		if id != a {
			b = n
		}
	}
	dropped := na.h.GateDropped()
	await.True(t, "the gated replica to drop a vote request", func() bool { return na.h.GateDropped() > dropped })
	for _, g := range orphaned {
		if b.h.Status(g).IsLeader || na.h.Status(g).IsLeader {
			t.Fatalf("group %d elected a leader without a vote of an open majority", g)
		}
	}

	if err := na.h.OpenGate(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := na.h.Gated(); !slices.Equal(got, []uint32{1}) || na.h.Status(0).Gated {
		t.Fatalf("after OpenGate(0) gated %v", got)
	}
	c.leader(t, 0)
	c.proposeN(t, 0, 1)
}

// TestEveryProcessCrashedOnItsBoot: every voter's process crashed at once
// (a poison entry, an OOM kill of every pod) while the hosts stayed up, so
// the page caches kept every acknowledged write: nothing is gated, the
// group elects a leader and holds what it committed, and the journals
// were synced by the start. Without the running record (a start on
// another boot) the same crash leaves the group without a leader.
func TestEveryProcessCrashedOnItsBoot(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	c.converged(t, 0)
	sum, count := c.leader(t, 0).sms[0].state()
	for id := range c.cfgs {
		c.processCrash(t, id)
	}
	for id := range c.cfgs {
		n := c.start(t, id)
		if got := n.h.Gated(); len(got) != 0 || n.h.TailMayBeLost() {
			t.Fatalf("node %d after a crash of every process: gated %v, tail may be lost %v; want neither", id, got, n.h.TailMayBeLost())
		}
	}
	c.converged(t, 0)
	if s, n := c.leader(t, 0).sms[0].state(); s != sum || n != count {
		t.Fatalf("after the crash the group holds sum %d of %d entries, want %d of %d", s, n, sum, count)
	}
	c.proposeN(t, 0, 1)

	for id := range c.cfgs {
		c.crash(t, id)
	}
	for id := range c.cfgs {
		if n := c.start(t, id); !n.h.TailMayBeLost() || len(n.h.Gated()) != 1 {
			t.Fatalf("node %d after a host crash: gated %v, want the group", id, n.h.Gated())
		}
	}
}

// TestRecoveryPlan: every voter of a group crashed and came back gated, so
// the group elects no one. A plan led by the replica with the longest log
// elects it above the plan term; refusals change nothing; the plan is
// recorded until PlanSatisfied, after which the group serves as before.
func TestRecoveryPlan(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	c.converged(t, 0)
	for id := range c.nodes {
		c.crash(t, id)
	}
	for id := uint64(1); id <= 3; id++ {
		c.start(t, id)
	}
	ctx := context.Background()
	var leader uint64
	var highest uint64
	for id, n := range c.nodes {
		st := n.h.Status(0)
		if !st.Gated {
			t.Fatalf("node %d not gated after the crash", id)
		}
		highest = max(highest, st.Term)
		if l := c.nodes[leader]; leader == 0 || st.LastTerm > l.h.Status(0).LastTerm ||
			st.LastTerm == l.h.Status(0).LastTerm && st.LastIndex > l.h.Status(0).LastIndex {
			leader = id
		}
	}
	req := func(id uint64, lead bool, leaderTerm uint64) PlanRequest {
		st := c.nodes[id].h.Status(0)
		return PlanRequest{Leader: leader, Point: c.nodes[leader].h.Status(0).LastIndex, Lead: lead, HighestTerm: highest, LeaderTerm: leaderTerm,
			ExpectedLastIndex: st.LastIndex, ExpectedLastTerm: st.LastTerm, ExpectedTerm: st.Term, Stalled: true}
	}
	refused := func(id uint64, r PlanRequest, reason string) {
		t.Helper()
		_, err := c.nodes[id].h.AcceptPlan(ctx, 0, r)
		var pr *PlanRefusal
		if !errors.As(err, &pr) || pr.Reason != reason {
			t.Fatalf("node %d: got %v, want refusal %s", id, err, reason)
		}
		if c.nodes[id].h.Status(0).Recovery != nil {
			t.Fatalf("node %d holds a plan after a refusal", id)
		}
	}
	var other uint64
	for id := range c.nodes {
		if id != leader {
			other = id
		}
	}
	refused(other, req(other, true, 0), RefuseStepMismatch)
	notStalled := req(leader, true, 0)
	notStalled.Stalled = false
	refused(leader, notStalled, RefuseNotStalled)
	moved := req(leader, true, 0)
	moved.ExpectedLastIndex++
	refused(leader, moved, RefuseExpectedMismatch)

	term, err := c.nodes[leader].h.AcceptPlan(ctx, 0, req(leader, true, 0))
	if err != nil {
		t.Fatal(err)
	}
	if term < highest {
		t.Fatalf("plan term %d below the highest term %d", term, highest)
	}
	if again, err := c.nodes[leader].h.AcceptPlan(ctx, 0, req(leader, true, 0)); err != nil || again != term {
		t.Fatalf("the same plan again: %d, %v", again, err)
	}
	low := req(other, false, term)
	low.LeaderTerm = low.ExpectedTerm - 1
	if low.ExpectedTerm > 0 {
		refused(other, low, RefusePlanTermBelowVote)
	}
	for id := range c.nodes {
		if id == leader {
			continue
		}
		if got, err := c.nodes[id].h.AcceptPlan(ctx, 0, req(id, false, term)); err != nil || got != term {
			t.Fatalf("node %d follow: %d, %v", id, got, err)
		}
	}
	await.True(t, "the plan's leader to be elected above the plan term", func() bool {
		st := c.nodes[leader].h.Status(0)
		return st.IsLeader && st.Term > term
	})
	// A restart keeps the plan until it is satisfied.
	c.stop(t, other)
	if p := c.start(t, other).h.Status(0).Recovery; p == nil || p.Term != term || p.Role != PlanFollow {
		t.Fatalf("after a restart the follower holds %+v", p)
	}
	for _, n := range c.nodes {
		if err := n.h.PlanSatisfied(ctx, 0, term); err != nil {
			t.Fatal(err)
		}
		if n.h.Status(0).Recovery != nil || len(n.h.Plans()) != 0 {
			t.Fatalf("node %d still holds the plan", n.h.cfg.NodeID)
		}
	}
	if c.nodes[leader].h.Status(0).Gated {
		t.Fatal("the plan's leader is still gated after its plan was satisfied")
	}
	c.proposeN(t, 0, 3)
}

// TestRecoveryPlanCut: a leader cut off from its quorum appended entries it
// never committed; every node then crashed. A plan that cuts drops, on
// every replica, the entries above its committed entry, durably (a restart
// does not bring them back), and the group goes on from the point.
func TestRecoveryPlanCut(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	c.converged(t, 0)
	l := c.leader(t, 0)
	cutOff := l.h.cfg.NodeID
	c.net.setDown(cutOff, true)
	before := l.h.Status(0)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, _ = l.h.Propose(ctx, 0, u64(1))
		}()
	}
	await.True(t, "the cut-off leader to append entries it cannot commit", func() bool {
		st := l.h.Status(0)
		return st.LastIndex >= before.LastIndex+3
	})
	for id := range c.nodes {
		c.crash(t, id)
	}
	c.net.setDown(cutOff, false)
	for id := uint64(1); id <= 3; id++ {
		c.start(t, id)
	}
	ctx := context.Background()
	sts := map[uint64]GroupStatus{}
	var leader, highest uint64
	for id, n := range c.nodes {
		st := n.h.Status(0)
		sts[id] = st
		highest = max(highest, st.Term)
		if leader == 0 || st.Commit > sts[leader].Commit || st.Commit == sts[leader].Commit && id != cutOff && id > leader {
			leader = id
		}
	}
	if sts[cutOff].LastIndex <= sts[cutOff].Commit {
		t.Fatalf("the cut-off leader holds no uncommitted entry: %+v", sts[cutOff])
	}
	point := sts[leader].Commit
	req := func(id uint64, term uint64) PlanRequest {
		st := sts[id]
		return PlanRequest{Leader: leader, Point: point, Cut: true, Lead: id == leader, HighestTerm: highest, LeaderTerm: term,
			ExpectedLastIndex: st.LastIndex, ExpectedLastTerm: st.LastTerm, ExpectedTerm: st.Term, Stalled: true}
	}
	term, err := c.nodes[leader].h.AcceptPlan(ctx, 0, req(leader, 0))
	if err != nil {
		t.Fatal(err)
	}
	if leader != cutOff {
		if _, err := c.nodes[cutOff].h.AcceptPlan(ctx, 0, req(cutOff, term)); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.nodes[cutOff].h.Status(0); st.LastIndex != sts[cutOff].Commit {
		t.Fatalf("after the cut the log ends at %d, want its committed entry %d", st.LastIndex, sts[cutOff].Commit)
	}
	// The cut is in the journal: a restart does not bring the entries back.
	c.stop(t, cutOff)
	if st := c.start(t, cutOff).h.Status(0); st.LastIndex != sts[cutOff].Commit || st.Recovery == nil {
		t.Fatalf("after a restart: last index %d (want %d), plan %+v", st.LastIndex, sts[cutOff].Commit, st.Recovery)
	}
	for id := range c.nodes {
		if id == leader || id == cutOff {
			continue
		}
		if _, err := c.nodes[id].h.AcceptPlan(ctx, 0, req(id, term)); err != nil {
			var pr *PlanRefusal
			if !errors.As(err, &pr) || pr.Reason != RefuseFollowsLeader || pr.LeaderID != leader {
				t.Fatal(err)
			}
		}
	}
	await.True(t, "the plan's leader to be elected above the plan term", func() bool {
		st := c.nodes[leader].h.Status(0)
		return st.IsLeader && st.Term > term
	})
	for _, n := range c.nodes {
		if err := n.h.PlanSatisfied(ctx, 0, term); err != nil {
			t.Fatal(err)
		}
	}
	c.proposeN(t, 0, 3)
	c.converged(t, 0)
}

// TestCommittedOverwriteRefused: a voter that was down while the other two
// lost power and recovered through a plan comes back holding committed
// entries the new history replaced. The new leader's appends would replace
// them (Raft panics on that); the replica refuses them and keeps its log
// for an operator to rejoin it as a wiped node.
func TestCommittedOverwriteRefused(t *testing.T) {
	disks := map[uint64]*powerloss.FS{}
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.GroupCount, cfg.ShardCount = 1, 1
		disks[cfg.NodeID] = powerloss.New(cfg.Dir)
		cfg.FS = disks[cfg.NodeID]
	})
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	c.converged(t, 0)
	c.stop(t, 1)
	for id := uint64(2); id <= 3; id++ {
		n := c.nodes[id]
		if _, err := disks[id].PowerLoss(powerloss.Loss{Seed: powerloss.Seed(t)}); err != nil {
			t.Fatal(err)
		}
		n.powerLost = true
		n.cancel()
		<-n.done // fails: the disk is gone
		c.net.set(id, nil)
		delete(c.nodes, id)
		cfg := c.cfgs[id]
		cfg.FS = powerloss.New(cfg.Dir)
		c.cfgs[id] = cfg
		c.start(t, id)
	}
	st2, st3 := c.nodes[2].h.Status(0), c.nodes[3].h.Status(0)
	leader, other := uint64(2), uint64(3)
	if st3.LastTerm > st2.LastTerm || st3.LastTerm == st2.LastTerm && st3.LastIndex > st2.LastIndex {
		leader, other = 3, 2
	}
	sts := map[uint64]GroupStatus{2: st2, 3: st3}
	highest := max(st2.Term, st3.Term)
	req := func(id, term uint64) PlanRequest {
		st := sts[id]
		return PlanRequest{Leader: leader, Point: sts[leader].LastIndex, Lead: id == leader, HighestTerm: highest, LeaderTerm: term,
			ExpectedLastIndex: st.LastIndex, ExpectedLastTerm: st.LastTerm, ExpectedTerm: st.Term, Stalled: true}
	}
	ctx := context.Background()
	term, err := c.nodes[leader].h.AcceptPlan(ctx, 0, req(leader, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodes[other].h.AcceptPlan(ctx, 0, req(other, term)); err != nil {
		t.Fatal(err)
	}
	await.True(t, "the plan's leader to be elected", func() bool { st := c.nodes[leader].h.Status(0); return st.IsLeader && st.Term > term })
	point := sts[leader].LastIndex
	cfg := c.cfgs[1]
	cfg.FS = powerloss.New(cfg.Dir)
	c.cfgs[1] = cfg
	n1 := c.start(t, 1)
	before := n1.h.Status(0)
	if before.Commit <= point {
		t.Skipf("the power loss kept every committed entry (commit %d, point %d): nothing to overwrite", before.Commit, point)
	}
	dropped := n1.h.GateDropped()
	for i := range 5 {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = c.nodes[leader].h.Propose(ctx, 0, u64(uint64(100+i)))
		cancel()
	}
	await.True(t, "the replica to refuse appends over its committed entries", func() bool { return n1.h.GateDropped() > dropped })
	select {
	case err := <-n1.done:
		t.Fatalf("the replica stopped: %v", err)
	default:
	}
	if st := n1.h.Status(0); st.Commit < before.Commit || st.LastIndex < before.Commit {
		t.Fatalf("the replica's committed entries changed: before %+v, after %+v", before, st)
	}
}

// TestStaleAppendIsNotACommittedOverwrite: a deposed leader's append,
// delivered after a newer leader committed another entry at its index, is
// of an earlier term: Raft drops it, and it is neither refused nor
// reported as an append over committed entries (under load such delayed
// appends were logged as CommittedOverwrite errors).
func TestStaleAppendIsNotACommittedOverwrite(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 3)
	c.converged(t, 0)
	old := c.leader(t, 0)
	oldID := old.h.cfg.NodeID
	oldTerm := old.h.Status(0).Term
	c.net.setHold(func(_ uint32, m *pb.Message) bool {
		return m.GetFrom() == oldID && m.GetType() == pb.MessageType_MsgApp && len(m.GetEntries()) > 0
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _, _ = old.h.Propose(ctx, 0, u64(99)) }() // never commits: its appends are held
	await.True(t, "the old leader's appends to both followers held", func() bool {
		c.net.mu.Lock()
		defer c.net.mu.Unlock()
		return len(c.net.held) >= 2
	})
	c.stop(t, oldID)
	c.proposeN(t, 0, 2) // a new leader, a new term, other entries committed at the held one's index
	dropped := map[uint64]uint64{}
	for id, n := range c.nodes {
		if st := n.h.Status(0); st.Term <= oldTerm {
			t.Fatalf("node %d still at term %d", id, st.Term)
		}
		dropped[id] = n.h.GateDropped()
	}
	c.net.release()
	c.proposeN(t, 0, 1) // queued behind the stale appends on every replica
	c.converged(t, 0)
	for id, n := range c.nodes {
		if got := n.h.GateDropped(); got != dropped[id] {
			t.Errorf("node %d refused %d appends as overwrites of committed entries", id, got-dropped[id])
		}
	}
}
