package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/wal"
	"github.com/ursula/ursula/storage/wal/powerloss"
	"github.com/ursula/ursula/tests/await"
)

// Host power loss on a single node, through the power-loss file system
// (storage/wal/powerloss): the node runs on a powerloss.FS over its data
// directory, the host loses power, and a new process starts on what the
// disk kept.
//
// The losses are strict about directories too (no Loss.KeepNewDirs): the
// WAL and snapshot stores sync the parent of every directory they create
// (wal.MkdirDurable), so a loss during a node's first run keeps raft-log/,
// its shard directories and the snapshot directories; without that it
// took the whole WAL, acknowledged appends under fsync "always" included.

// crash ends te's Run after its file system lost power. Whatever Run
// returns is the dead process's (it usually fails on the first write).
func (te *testEngine) crash(tb testing.TB) {
	tb.Helper()
	if te.cancel == nil {
		return
	}
	te.cancel()
	te.cancel = nil
	select {
	case err := <-te.done:
		tb.Logf("the crashed engine's Run returned: %v", err)
	case <-time.After(15 * time.Second):
		tb.Fatalf("engine Run did not return after the power loss")
	}
}

// loseAndReopen loses the power of te's host, crashes te and opens a new
// engine on what its directory kept, through a new powerloss.FS. It
// returns the new engine (not running) or Open's error.
func loseAndReopen(tb testing.TB, te *testEngine, fsys *powerloss.FS, loss powerloss.Loss) (*testEngine, error) {
	tb.Helper()
	r, err := fsys.PowerLoss(loss)
	if err != nil {
		tb.Fatalf("PowerLoss: %v", err)
	}
	tb.Log(r)
	te.crash(tb)
	cfg := te.Config()
	deps := Deps{FS: powerloss.New(cfg.DataDir), Logger: testLogger(tb)}
	n, err := Open(cfg, deps)
	if err != nil {
		return nil, err
	}
	return &testEngine{Engine: n.Engine, node: n, deps: deps}, nil
}

// powerLossCases are the losses both fsync modes are run through.
var powerLossCases = []struct {
	name string
	loss powerloss.Loss
}{
	{name: "unsynced bytes dropped", loss: powerloss.Loss{}},
	{name: "partial writeback", loss: powerloss.Loss{Writeback: true}},
	{name: "partial writeback and a zeroed sector", loss: powerloss.Loss{Writeback: true, Tear: powerloss.TearZeros}},
	// A torn sector of garbage after a frame whose CRC fails is cut like a
	// zeroed one (no intact frame follows it), and the shard's groups are
	// gated.
	{name: "partial writeback and a garbage sector", loss: powerloss.Loss{Writeback: true, Tear: powerloss.TearGarbage}},
}

// appendBody is the i-th append to a stream in these tests.
func appendBody(stream string, i int) string { return fmt.Sprintf("%s-%03d;", stream, i) }

// TestPowerLossFsyncAlways: with fsync "always" every acknowledged append
// survives a power loss exactly, and the restarted node reports the crash.
func TestPowerLossFsyncAlways(t *testing.T) {
	for _, tc := range powerLossCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Fsync = "always"
			fsys := powerloss.New(cfg.DataDir)
			te := openEngine(t, cfg, Deps{FS: fsys})
			te.run(t)
			te.waitReady(t)
			if _, err := te.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
				t.Fatal(err)
			}
			streams := []string{"a", "b", "c"}
			want := map[string]string{}
			for _, s := range streams {
				mustCreate(t, te, &streamv1.CreateStreamRequest{Ref: ref(s), ContentType: "text/plain"})
			}
			// More appends than SnapshotEntries: the groups take snapshots
			// before the loss.
			for i := range 40 {
				for _, s := range streams {
					mustAppend(t, te, s, "text/plain", appendBody(s, i))
					want[s] += appendBody(s, i)
				}
			}

			loss := tc.loss
			loss.Seed = powerloss.Seed(t)
			ne, err := loseAndReopen(t, te, fsys, loss)
			if err != nil {
				t.Fatalf("reopen after the power loss: %v", err)
			}
			ne.run(t)
			ne.waitReady(t)
			if !ne.node.WALRecovery() {
				t.Error("no wal_recovery after a power loss")
			}
			for _, s := range streams {
				if got := readAll(t, ne, s); got != want[s] {
					t.Errorf("stream %s after the loss:\n got %q\nwant %q", s, got, want[s])
				}
			}
			mustAppend(t, ne, "a", "text/plain", "after;")
			if got := readAll(t, ne, "a"); got != want["a"]+"after;" {
				t.Errorf("append after the recovery: read %q", got)
			}
		})
	}
}

// TestPowerLossFsyncNever: with fsync "never" a power loss may take the
// acknowledged appends that were still in the page cache. Today the
// restarted node recovers what the disk kept without crashing: each stream
// holds a prefix of its acknowledged appends, whole appends only, and the
// node reports the crash (wal_recovery). It does not know which appends it
// lost, and on a single node nothing can give them back; the recovery
// gates of the same issue (multi-node: a replica that may have lost
// acknowledged entries stays out of elections until it caught up) will
// tighten what a crashed node is allowed to do, not this outcome.
func TestPowerLossFsyncNever(t *testing.T) {
	for _, tc := range powerLossCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Fsync = "never"
			fsys := powerloss.New(cfg.DataDir)

			// The bucket and the streams are made durable by a clean
			// shutdown, so that the loss can only take appends.
			te := openEngine(t, cfg, Deps{FS: fsys})
			te.run(t)
			te.waitReady(t)
			if _, err := te.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
				t.Fatal(err)
			}
			streams := []string{"a", "b", "c"}
			for _, s := range streams {
				mustCreate(t, te, &streamv1.CreateStreamRequest{Ref: ref(s), ContentType: "text/plain"})
			}
			te = restart(t, te, nil)

			const appends = 40
			for i := range appends {
				for _, s := range streams {
					mustAppend(t, te, s, "text/plain", appendBody(s, i))
				}
			}

			loss := tc.loss
			loss.Seed = powerloss.Seed(t)
			ne, err := loseAndReopen(t, te, fsys, loss)
			if err != nil {
				t.Fatalf("reopen after the power loss: %v", err)
			}
			ne.run(t)
			ne.waitReady(t)
			if !ne.node.WALRecovery() {
				t.Error("no wal_recovery after a power loss")
			}
			for _, s := range streams {
				got := readAll(t, ne, s)
				var all strings.Builder
				kept := -1
				for i := 0; i <= appends; i++ {
					if all.String() == got {
						kept = i
						break
					}
					if i < appends {
						all.WriteString(appendBody(s, i))
					}
				}
				if kept < 0 {
					t.Errorf("stream %s after the loss holds %q: not a prefix of its appends in whole appends", s, got)
					continue
				}
				t.Logf("stream %s kept %d of its %d acknowledged appends", s, kept, appends)
				// The recovered stream takes appends at its recovered tail.
				mustAppend(t, ne, s, "text/plain", "after;")
				if got2 := readAll(t, ne, s); got2 != got+"after;" {
					t.Errorf("stream %s: append after the recovery reads %q", s, got2)
				}
			}
		})
	}
}

// plCluster is a three-node in-memory cluster on power-loss file systems,
// with one stream in every group and the appends acknowledged so far.
type plCluster struct {
	*memCluster
	disks  map[uint64]*powerloss.FS
	groups uint32
	names  map[uint32]string
	want   map[uint32]string
}

func startPowerLossCluster(t *testing.T, tune func(*Config)) *plCluster {
	t.Helper()
	var mu sync.Mutex
	pc := &plCluster{disks: map[uint64]*powerloss.FS{}, names: map[uint32]string{}, want: map[uint32]string{}}
	pc.memCluster = startClusterTuned(t, 3, func(id uint64, dir string) wal.FS {
		mu.Lock()
		defer mu.Unlock()
		pc.disks[id] = powerloss.New(dir)
		return pc.disks[id]
	}, tune)
	c := pc.memCluster
	pc.groups = uint32(c.engines[1].Config().GroupCount)
	lead0 := c.waitLeader(t, bucketGroup)
	if _, err := c.engines[lead0].CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(pc.names) < int(pc.groups); i++ {
		name := "s" + strconv.Itoa(i)
		g := c.engines[1].GroupOf(key(name))
		if _, ok := pc.names[g]; !ok {
			pc.names[g] = name
			mustCreate(t, c.engines[c.waitLeader(t, g)], &streamv1.CreateStreamRequest{Ref: ref(name)})
		}
	}
	return pc
}

// appendEverywhere appends round's body to every stream through its
// leader. A leader that changes meanwhile is retried; an outcome left
// unknown is looked up on the next leader before it is retried.
func (pc *plCluster) appendEverywhere(tb testing.TB, round int) {
	tb.Helper()
	c := pc.memCluster
	for g, name := range pc.names {
		body := appendBody(name, round)
		await.True(tb, fmt.Sprintf("append %q through the leader", body), func() bool {
			e, _ := c.engine(c.waitLeader(tb, g))
			_, err := e.Append(tb.Context(), &streamv1.AppendRequest{Ref: ref(name), ContentType: DefaultContentType, Body: []byte(body)})
			switch codeOf(err) {
			case nil:
				return true
			case fault.ErrOutcomeUnknown:
				var r *streamv1.ReadResponse
				await.True(tb, "a leader to read from", func() bool {
					e, _ := c.engine(c.waitLeader(tb, g))
					r, err = e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: stream.OffsetStart, NoTouch: true})
					return err == nil && r.GetUpToDate()
				})
				return string(r.GetData()) == pc.want[g]+body
			case fault.ErrNotLeader, fault.ErrUnavailable, fault.ErrOverloaded:
				return false
			}
			tb.Fatalf("append %q: %v", body, err)
			return false
		})
		pc.want[g] += body
	}
}

// powerLoss cuts the power of the given nodes at once (their disks keep
// what loss keeps) and opens new processes on what the disks kept, with
// now as their clock (nil: time.Now); the new engines are not running.
func (pc *plCluster) powerLoss(t *testing.T, loss powerloss.Loss, now func() time.Time, ids ...uint64) map[uint64]*testEngine {
	t.Helper()
	c := pc.memCluster
	var olds []*testEngine
	for _, id := range ids {
		r, err := pc.disks[id].PowerLoss(loss)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d: %v", id, r)
		old, _ := c.engine(id)
		olds = append(olds, old)
	}
	out := map[uint64]*testEngine{}
	for i, id := range ids {
		olds[i].crash(t)
		cfg := olds[i].Config()
		nd := &memNet{c: c, self: id}
		deps := Deps{Network: nd, FS: c.fs(id, cfg.DataDir), Now: now}
		ne := openEngine(t, cfg, deps)
		c.mu.Lock()
		c.nets[id] = nd
		c.engines[id] = ne
		c.mu.Unlock()
		out[id] = ne
	}
	return out
}

// checkAll checks that every stream reads what was acknowledged, on its
// leader and on every replica.
func (pc *plCluster) checkAll(t *testing.T) {
	t.Helper()
	c := pc.memCluster
	for g, name := range pc.names {
		var got string
		c.onLeader(t, g, fmt.Sprintf("group %d's leader to read %s", g, name), func(le *testEngine) (err error) {
			got, err = readFrom(t, le, name, 0)
			return err
		})
		if got != pc.want[g] {
			t.Errorf("group %d: the leader reads %q, want %q", g, got, pc.want[g])
		}
		for id := range c.engines {
			e, _ := c.engine(id)
			await.True(t, fmt.Sprintf("node %d to hold group %d's acknowledged appends", id, g), func() bool {
				return string(readOwn(t, e, name)) == pc.want[g]
			})
		}
	}
}

// TestClusterPowerLossOfOneVoter: one voter of three loses power under
// fsync "never" (its unsynced tail is gone): it comes back with every group
// gated, follows, opens every gate through its leaders' barriers, and
// nothing acknowledged is lost; no operator step.
func TestClusterPowerLossOfOneVoter(t *testing.T) {
	pc := startPowerLossCluster(t, nil)
	for round := range 10 {
		pc.appendEverywhere(t, round)
	}
	const victim = 3
	loss := powerloss.Loss{Seed: powerloss.Seed(t), Writeback: true, Tear: powerloss.TearZeros}
	ne := pc.powerLoss(t, loss, nil, victim)[victim]
	if got := ne.node.Cluster.GateStates(); len(got) != int(pc.groups) {
		t.Errorf("the restarted node gates %d groups, want all %d: %v", len(got), pc.groups, got)
	}
	ne.run(t)
	if !ne.node.WALRecovery() {
		t.Error("no wal_recovery on the node that lost power")
	}
	for round := 10; round < 15; round++ {
		pc.appendEverywhere(t, round)
	}
	ne.waitReady(t)
	await.True(t, "every recovery gate to open", func() bool { return len(ne.node.Cluster.GateStates()) == 0 })
	pc.checkAll(t)
}

// TestClusterPowerLossFsyncAlways: under fsync "always" every node loses
// power at once; no acknowledged append is lost, and nothing is gated (a
// synced journal lost nothing it acknowledged).
func TestClusterPowerLossFsyncAlways(t *testing.T) {
	pc := startPowerLossCluster(t, func(cfg *Config) { cfg.Fsync = "always" })
	for round := range 10 {
		pc.appendEverywhere(t, round)
	}
	loss := powerloss.Loss{Seed: powerloss.Seed(t), Writeback: true, Tear: powerloss.TearZeros}
	engines := pc.powerLoss(t, loss, nil, 1, 2, 3)
	for id, e := range engines {
		if got := e.node.Cluster.GateStates(); len(got) != 0 {
			t.Errorf("node %d gates %v after a power loss under fsync always", id, got)
		}
		e.run(t)
	}
	for _, e := range engines {
		e.waitReady(t)
	}
	pc.checkAll(t)
	for round := 10; round < 12; round++ {
		pc.appendEverywhere(t, round)
	}
	pc.checkAll(t)
}

// TestClusterMinorityCorruption: a flipped bit in the last frame of one
// voter's active journal segment, and a truncated one on another run: the
// damaged node refuses to start or comes back gated; it never serves what
// it lost, and the group's history stays whole.
func TestClusterMinorityCorruption(t *testing.T) {
	for _, damage := range []string{"bit flip", "truncation"} {
		t.Run(damage, func(t *testing.T) {
			pc := startPowerLossCluster(t, nil)
			for round := range 10 {
				pc.appendEverywhere(t, round)
			}
			const victim = 2
			old, _ := pc.engine(victim)
			cfg := old.Config()
			old.stop(t)
			seg := activeSegment(t, cfg.DataDir, 0)
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			switch damage {
			case "bit flip":
				b[len(b)-10] ^= 0x10
			case "truncation":
				b = b[:len(b)-7]
			}
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// A clean shutdown was recorded: the start holds the journal
			// to it and refuses the damage, changing nothing.
			if _, err := Open(cfg, Deps{Network: &memNet{c: pc.memCluster, self: victim}, Logger: testLogger(t)}); !errors.Is(err, wal.ErrCorrupt) {
				t.Fatalf("a damaged journal after a clean shutdown opened: %v", err)
			}
			// Without the record (as after a crash), the damaged tail is cut
			// and every group on it gated until its leader's barrier.
			if err := os.Remove(filepath.Join(wal.LogDir(cfg.DataDir), "clean_shutdown")); err != nil {
				t.Fatal(err)
			}
			ne := pc.open(t, victim, cfg)
			pc.mu.Lock()
			pc.engines[victim] = ne
			pc.mu.Unlock()
			if got := ne.node.Cluster.GateStates(); len(got) != int(pc.groups) {
				t.Errorf("the damaged node gates %v, want every group", got)
			}
			ne.run(t)
			for round := 10; round < 12; round++ {
				pc.appendEverywhere(t, round)
			}
			ne.waitReady(t)
			pc.checkAll(t)
		})
	}
}

// TestClusterPowerLossOfMajority: every voter loses power under fsync
// "never", so no group can elect a leader: every gated replica reports its
// group stalled. A recovery plan per group (the longest log leads) elects
// its leader above the plan term, which starts a new history: every stream
// gets a new incarnation naming the old one and the offset it kept, each
// stream holds a prefix of what was acknowledged (the plan's loss, never
// silent: the test reports it), and the group serves writes again.
func TestClusterPowerLossOfMajority(t *testing.T) {
	pc := startPowerLossCluster(t, nil)
	for round := range 5 {
		pc.appendEverywhere(t, round)
	}
	// A clean restart of every node syncs what came before: the loss can
	// only take the appends after it.
	for id := uint64(1); id <= 3; id++ {
		pc.restart(t, id, false)
	}
	for id := uint64(1); id <= 3; id++ {
		e, _ := pc.engine(id)
		e.waitReady(t)
	}
	before := map[uint32]uint64{}
	for g, name := range pc.names {
		pc.onLeader(t, g, fmt.Sprintf("group %d's leader to answer HEAD", g), func(le *testEngine) error {
			h, err := le.Head(t.Context(), &streamv1.HeadRequest{Ref: ref(name)})
			before[g] = h.GetInfo().GetIncarnation()
			return err
		})
	}
	for round := 5; round < 10; round++ {
		pc.appendEverywhere(t, round)
	}

	clk := newFakeClock(time.Now())
	engines := pc.powerLoss(t, powerloss.Loss{Seed: powerloss.Seed(t)}, clk.Now, 1, 2, 3)
	for _, e := range engines {
		e.run(t)
	}
	await.True(t, "every gated group to report itself stalled", func() bool {
		clk.Advance(time.Second)
		for _, e := range engines {
			st := e.node.Cluster.GateStates()
			if len(st) != int(pc.groups) {
				return false
			}
			for _, s := range st {
				if s != cluster.GateStalled {
					return false
				}
			}
		}
		return true
	})
	if lead := pc.leaderOf(0); lead != 0 {
		t.Fatalf("group 0 elected node %d with every voter gated", lead)
	}

	// The plan of each group, as recover-group computes it when no log
	// needs a cut: the greatest last log id leads, its last index is the
	// point, the plan term is at least every replica's term.
	planTerms := map[uint32]uint64{}
	for g := range pc.groups {
		var leader uint64
		var highest uint64
		sts := map[uint64]multiraft.GroupStatus{}
		for id, e := range engines {
			st := e.node.Cluster.Status(g)
			sts[id] = st
			highest = max(highest, st.Term)
			if l, ok := sts[leader]; leader == 0 || !ok || st.LastTerm > l.LastTerm || st.LastTerm == l.LastTerm && st.LastIndex > l.LastIndex {
				leader = id
			}
		}
		// The longest log may hold entries a lost leader overwrote: the
		// plan cuts every log to its committed entry, led by the greatest.
		cut := sts[leader].LastTerm < highest
		point := sts[leader].LastIndex
		if cut {
			for id, st := range sts {
				if st.Commit > sts[leader].Commit || st.Commit == sts[leader].Commit && id > leader {
					leader = id
				}
			}
			point = sts[leader].Commit
			t.Logf("group %d: the plan cuts to node %d's committed entry %d", g, leader, point)
		}
		req := func(id uint64) multiraft.PlanRequest {
			st := sts[id]
			return multiraft.PlanRequest{Leader: leader, Point: point, Cut: cut, Lead: id == leader, HighestTerm: highest, LeaderTerm: planTerms[g],
				ExpectedLastIndex: st.LastIndex, ExpectedLastTerm: st.LastTerm, ExpectedTerm: st.Term}
		}
		term, err := engines[leader].node.Cluster.AcceptPlan(t.Context(), g, req(leader))
		if err != nil {
			t.Fatalf("group %d: the plan's leader node %d: %v", g, leader, err)
		}
		planTerms[g] = term
		for id, e := range engines {
			if id == leader {
				continue
			}
			// A replica that already follows the plan's leader (elected by
			// the replicas that took the plan) rejoins through it.
			var refusal *multiraft.PlanRefusal
			if _, err := e.node.Cluster.AcceptPlan(t.Context(), g, req(id)); err != nil &&
				!(errors.As(err, &refusal) && refusal.Reason == multiraft.RefuseFollowsLeader && refusal.LeaderID == leader) {
				t.Fatalf("group %d: follow on node %d: %v", g, id, err)
			}
		}
		// Until its new history applied, a replica holding the plan serves
		// nothing of the group.
		if _, err := engines[leader].Head(t.Context(), &streamv1.HeadRequest{Ref: ref(pc.names[g])}); codeOf(err) != fault.ErrUnavailable && codeOf(err) != fault.ErrNotLeader {
			t.Errorf("group %d: HEAD while the plan is pending: %v", g, err)
		}
	}
	pending := ""
	if !await.Until(await.DefaultTimeout, func() bool {
		for id, e := range engines {
			for g := range pc.groups {
				st := e.node.Cluster.Status(g)
				h, ok := e.History(g)
				if gs, gated := e.node.Cluster.GateStates()[g]; gated || st.Recovery != nil || !ok || h.PlanTerm != planTerms[g] {
					pending = fmt.Sprintf("node %d group %d: gate %q (gated %t), plan %+v, history %+v (%t), leader %d, term %d, applied %d, last %d",
						id, g, gs, gated, st.Recovery, h, ok, st.LeaderID, st.Term, st.Applied, st.LastIndex)
					for other, oe := range engines {
						ost := oe.node.Cluster.Status(g)
						pending += fmt.Sprintf("; node %d: leader %d, is leader %t, term %d, commit %d, applied %d, last %d, plan %+v, gated %t",
							other, ost.LeaderID, ost.IsLeader, ost.Term, ost.Commit, ost.Applied, ost.LastIndex, ost.Recovery, ost.Gated)
					}
					return false
				}
			}
		}
		return true
	}) {
		t.Fatalf("the plans were not satisfied, or a gate stayed closed: %s", pending)
	}
	lost := 0
	for g, name := range pc.names {
		var le *testEngine
		var got string
		pc.onLeader(t, g, fmt.Sprintf("group %d's leader to read %s", g, name), func(e *testEngine) (err error) {
			le = e
			got, err = readFrom(t, e, name, 0)
			return err
		})
		if !strings.HasPrefix(pc.want[g], got) {
			t.Fatalf("group %d: the new history reads %q, not a prefix of the acknowledged %q", g, got, pc.want[g])
		}
		lost += len(pc.want[g]) - len(got)
		h, err := le.Head(t.Context(), &streamv1.HeadRequest{Ref: ref(name)})
		if err != nil {
			t.Fatal(err)
		}
		info := h.GetInfo()
		if info.GetIncarnation() == before[g] || info.GetPreviousIncarnation() != before[g] || info.GetInheritedOffset() != info.GetNextOffset() {
			t.Errorf("group %d: incarnation %d (before %d), previous %d, inherited %q, next %q", g,
				info.GetIncarnation(), before[g], info.GetPreviousIncarnation(), info.GetInheritedOffset(), info.GetNextOffset())
		}
		pc.want[g] = got
	}
	t.Logf("the plans dropped %d acknowledged bytes that no replica kept", lost)
	pc.appendEverywhere(t, 10)
	pc.checkAll(t)
}
