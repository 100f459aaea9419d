package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

// Bounds of the cluster tests' waits.
const (
	clusterAppendBudget = 60 * time.Second  // one append, retried through leader changes
	rejoinBudget        = 180 * time.Second // a wiped node back as a voter of every group
	catchUpBudget       = 60 * time.Second  // every node's copy of every stream complete
	mismatchBudget      = 60 * time.Second  // a refused peer shows in metrics
)

// TestClusterWipedNodeRejoins stops one voter of a 3-node cluster, deletes
// its data directory and starts it again, as after a lost disk (seed:
// "Rejoining a wiped node"). Every group must rebuild it and promote it
// back to voter, without an operator step and without initializing any
// group again: every acknowledged append, including those written while it
// was down, stays readable at its offset from every node with the stream's
// incarnation unchanged, the rejoined node serves the old history itself,
// and once it is a voter again it carries quorums: with another node
// stopped, every group still commits.
func TestClusterWipedNodeRejoins(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 8, Gateway: true})
	ctx := t.Context()
	client := c.Client()
	logs := newStreamLogs(t, c, client, "wipe")

	writeRound(ctx, t, client, logs, 12, "before-wipe")
	incs := verifyNodes(ctx, t, c.Nodes, logs, nil)
	if t.Failed() {
		t.FailNow()
	}

	// The victim leads group 0, so the wipe also moves leaderships.
	lctx, cancel := context.WithTimeout(ctx, await.DefaultTimeout)
	victim, err := c.Leader(lctx, 0)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL node %d (leader of group 0) and wipe %s", victim.ID, victim.Config.DataDir)
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := victim.Wipe(); err != nil {
		t.Fatal(err)
	}
	// The other two voters are a quorum of every group: writes go on.
	writeRound(ctx, t, client, logs, 6, "while-down")
	if t.Failed() {
		t.FailNow()
	}

	start := time.Now()
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	// The surviving voters keep serving writes during the rebuild.
	wctx, stopWrites := context.WithCancel(ctx)
	writes := make(chan int)
	go func() {
		rounds := 0
		for wctx.Err() == nil && !t.Failed() {
			writeRound(wctx, t, client, logs, 1, fmt.Sprintf("rejoin-%d", rounds))
			rounds++
		}
		writes <- rounds
	}()
	rctx, cancel := context.WithTimeout(ctx, rejoinBudget)
	defer cancel()
	// Readiness: the rebuilt node stays unready, with a typed reason, until
	// every group has rebuilt it and promoted it back to voter.
	var seen map[string]int
	seen, err = waitReadyReasons(rctx, victim)
	t.Logf("node %d readiness while rejoining: %v", victim.ID, seen)
	if err == nil && seen["awaiting_rebuild"] == 0 && seen["learner_catching_up"] == 0 {
		t.Errorf("the wiped node never reported awaiting_rebuild or learner_catching_up while it was rebuilt: %v", seen)
	}
	if err == nil {
		err = c.WaitVoter(rctx, victim.ID)
	}
	if err == nil {
		err = waitCaughtUp(rctx, c, victim)
	}
	stopWrites()
	rounds := <-writes
	if err != nil {
		t.Fatalf("wiped node %d did not rejoin: %v", victim.ID, err)
	}
	t.Logf("node %d rejoined as a voter of every group %v after its start; %d write rounds meanwhile",
		victim.ID, time.Since(start).Round(time.Millisecond), rounds)

	// No group was initialized again: same incarnations, same bytes at the
	// same offsets, on every node, the wiped one included.
	verifyNodes(ctx, t, c.Nodes, logs, incs)
	if t.Failed() {
		t.FailNow()
	}

	// The rejoined node carries quorums: stop another voter and write to
	// every group.
	var other *Node
	for _, n := range c.Nodes {
		if n != victim {
			other = n
			break
		}
	}
	t.Logf("SIGKILL node %d: groups now need node %d's vote", other.ID, victim.ID)
	if err := other.Kill(); err != nil {
		t.Fatal(err)
	}
	writeRound(ctx, t, client, logs, 3, "other-down")
	var up []*Node
	for _, n := range c.Nodes {
		if n != other {
			up = append(up, n)
		}
	}
	verifyNodes(ctx, t, up, logs, incs)

	if err := other.Restart(rctx); err != nil {
		t.Fatalf("restart node %d: %v", other.ID, err)
	}
	writeRound(ctx, t, client, logs, 2, "all-up")
	verifyNodes(ctx, t, c.Nodes, logs, incs)
}

// TestClusterFiveNodes checks a 5-node cluster end to end: every group
// commits with two voters down (one SIGKILLed, one SIGTERMed), and every
// node, the restarted ones included, then holds every acknowledged append at
// its offset.
func TestClusterFiveNodes(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 5, GroupCount: 8, Gateway: true})
	ctx := t.Context()
	client := c.Client()
	logs := newStreamLogs(t, c, client, "five")
	writeRound(ctx, t, client, logs, 5, "all-up")

	lctx, cancel := context.WithTimeout(ctx, await.DefaultTimeout)
	killed, err := c.Leader(lctx, 0)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	stopped := c.Nodes[0]
	if stopped == killed {
		stopped = c.Nodes[1]
	}
	t.Logf("SIGKILL node %d (leader of group 0), SIGTERM node %d", killed.ID, stopped.ID)
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := stopped.Terminate(30 * time.Second); err != nil {
		t.Errorf("SIGTERM node %d: %v", stopped.ID, err)
	}
	writeRound(ctx, t, client, logs, 5, "two-down")
	verifyNodes(ctx, t, c.Running(), logs, nil)
	if t.Failed() {
		t.FailNow()
	}

	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for _, n := range []*Node{killed, stopped} {
		if err := n.Restart(rctx); err != nil {
			t.Fatalf("restart node %d: %v", n.ID, err)
		}
	}
	if err := c.WaitGroupsLed(rctx); err != nil {
		t.Fatal(err)
	}
	writeRound(ctx, t, client, logs, 2, "all-up-again")
	verifyNodes(ctx, t, c.Nodes, logs, nil)
}

// waitCaughtUp waits until n has applied, in every group, at least what the
// group's leader had committed when the wait began.
func waitCaughtUp(ctx context.Context, c *Cluster, n *Node) error {
	leaders, all, err := c.GroupLeaders(ctx)
	if err != nil {
		return err
	}
	want := map[uint32]uint64{}
	for g := range uint32(c.GroupCount()) {
		l := leaders[g]
		if l == 0 || all[l] == nil || all[l].Group(g) == nil {
			return fmt.Errorf("group %d has no leader", g)
		}
		want[g] = all[l].Group(g).CommitIndex
	}
	last := ""
	for {
		m, err := n.Metrics(ctx)
		if err == nil {
			last = ""
			for g, idx := range want {
				gm := m.Group(g)
				if gm == nil || gm.AppliedIndex < idx {
					last = fmt.Sprintf("group %d: applied %v, leader had committed %d", g, gm, idx)
					break
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d did not catch up: %s", n.ID, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestClusterPeerOfAnotherCluster checks the seed's "Peers of another
// cluster": Raft RPCs between nodes of different server.cluster_id are
// refused both ways, counted in raft_grpc_peer_cluster_refusals on both
// sides, a configured peer is listed under peer_cluster_mismatches (with
// its node_id and cluster_id) in metrics and readiness, a sender outside
// raft.peers never is, and the healthy nodes stay ready and keep serving.
// A node whose WAL holds another cluster id refuses to start.
func TestClusterPeerOfAnotherCluster(t *testing.T) {
	t.Run("configured peer with another cluster id", func(t *testing.T) {
		c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true})
		ctx := t.Context()
		client := c.Client()
		logs := newStreamLogs(t, c, client, "xcluster")
		writeRound(ctx, t, client, logs, 3, "before")

		// Node 3 is replaced by a node with a mistyped cluster id (on an
		// empty WAL, as a node whose WAL holds another id refuses to
		// start). Nodes 1 and 2 still list it at the same addresses.
		bad := c.Nodes[2]
		other := c.ID + "-other"
		if err := bad.Kill(); err != nil {
			t.Fatal(err)
		}
		// On its old WAL, which holds this cluster's id, it refuses to
		// start.
		if err := bad.Reconfigure(func(cfg *NodeConfig) { cfg.ClusterID = other }); err != nil {
			t.Fatal(err)
		}
		if err := bad.Start(); err != nil {
			t.Fatal(err)
		}
		if bad.wait(await.DefaultTimeout) != nil {
			t.Errorf("node %d started with server.cluster_id %q on a WAL of cluster %q; it must refuse to start", bad.ID, other, c.ID)
			bad.Kill()
		} else if bad.ExitErr() == nil {
			t.Errorf("node %d with server.cluster_id %q on a WAL of cluster %q exited with status 0; want a failure", bad.ID, other, c.ID)
		}
		err := bad.Reconfigure(func(cfg *NodeConfig) {
			cfg.DataDir = strings.TrimSuffix(cfg.DataDir, "data") + "data-other"
		})
		if err != nil {
			t.Fatal(err)
		}
		healthy := c.Running()
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		if err := c.WaitGroupsLed(wctx); err != nil {
			t.Fatalf("without node 3: %v", err)
		}
		cancel()
		if err := bad.Start(); err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d restarted with server.cluster_id %q", bad.ID, other)

		want := map[*Node][]PeerMismatch{bad: {}}
		for _, n := range healthy {
			want[n] = []PeerMismatch{{NodeID: bad.ID, ClusterID: other}}
			want[bad] = append(want[bad], PeerMismatch{NodeID: n.ID, ClusterID: c.ID})
		}
		waitMismatches(ctx, t, want)
		checkStaysHealthy(ctx, t, c, healthy, client, logs)

		// Nothing of this cluster reached the other one.
		sc, err := bad.StreamClient()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			resp, err := sc.Read(ctx, &streamv1.ReadRequest{Ref: &streamv1.StreamRef{Bucket: DSBucket, Stream: l.name}, Offset: "-1", NoTouch: true})
			if err == nil {
				t.Errorf("node %d of cluster %q serves stream %s of cluster %q: %d bytes", bad.ID, other, l.name, c.ID, len(resp.GetData()))
			} else if s, _ := status.FromError(err); s.Code() != codes.NotFound && s.Code() != codes.Unavailable && s.Code() != codes.FailedPrecondition {
				t.Logf("node %d: read %s: %v", bad.ID, l.name, err)
			}
		}
	})

	t.Run("unlisted node of another cluster", func(t *testing.T) {
		c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true})
		ctx := t.Context()
		client := c.Client()
		logs := newStreamLogs(t, c, client, "xcluster")
		writeRound(ctx, t, client, logs, 3, "before")

		// Node 4 belongs to another deployment but lists this cluster's
		// nodes as its peers; they do not list it.
		other := c.ID + "-other"
		stray := c.AddNode(4, func(cfg *NodeConfig) { cfg.ClusterID = other })
		if err := stray.Start(); err != nil {
			t.Fatal(err)
		}
		t.Logf("node 4 of cluster %q started with this cluster's nodes as peers", other)

		want := map[*Node][]PeerMismatch{stray: nil}
		for _, n := range c.Nodes {
			want[stray] = append(want[stray], PeerMismatch{NodeID: n.ID, ClusterID: c.ID})
			want[n] = []PeerMismatch{} // counted and logged, never listed
		}
		waitMismatches(ctx, t, want)
		checkStaysHealthy(ctx, t, c, c.Nodes, client, logs)
		// Still not listed after a while.
		for _, n := range c.Nodes {
			m, err := n.Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.PeerClusterMismatches) != 0 {
				t.Errorf("node %d lists %v under peer_cluster_mismatches; node 4 is not among its raft.peers", n.ID, m.PeerClusterMismatches)
			}
		}
	})
}

// waitMismatches waits until every node in want has counted refusals and
// lists exactly the wanted peer_cluster_mismatches in its metrics
// (checkStaysHealthy then compares readiness with metrics).
func waitMismatches(ctx context.Context, t testing.TB, want map[*Node][]PeerMismatch) {
	t.Helper()
	for n, mm := range want {
		var last string
		if !await.Until(mismatchBudget, func() bool { last = mismatchState(ctx, n, mm); return last == "" }) {
			t.Errorf("node %d (cluster %q): %s", n.ID, n.Config.ClusterID, last)
		}
	}
}

// mismatchState returns "" when n reports refusals and exactly want, else
// what differs.
func mismatchState(ctx context.Context, n *Node, want []PeerMismatch) string {
	m, err := n.Metrics(ctx)
	if err != nil {
		return err.Error()
	}
	if m.ClusterID != n.Config.ClusterID {
		return fmt.Sprintf("metrics cluster_id %q, configured %q", m.ClusterID, n.Config.ClusterID)
	}
	if m.PeerClusterRefusals == 0 {
		return "raft_grpc_peer_cluster_refusals is 0"
	}
	if !sameMismatches(m.PeerClusterMismatches, want) {
		return fmt.Sprintf("metrics peer_cluster_mismatches %+v, want %+v", m.PeerClusterMismatches, want)
	}
	return ""
}

func sameMismatches(got, want []PeerMismatch) bool {
	key := func(m PeerMismatch) string { return fmt.Sprintf("%d/%s", m.NodeID, m.ClusterID) }
	var g, w []string
	for _, m := range got {
		g = append(g, key(m))
	}
	for _, m := range want {
		w = append(w, key(m))
	}
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// checkStaysHealthy checks, for a few seconds, that every healthy node
// answers 200 on /__ursula/ready with its own cluster_id and the same
// peer_cluster_mismatches as its metrics, and that every group still takes
// writes through the gateway.
func checkStaysHealthy(ctx context.Context, t testing.TB, c *Cluster, healthy []*Node, client *Client, logs []*streamLog) {
	t.Helper()
	for round := range 5 {
		for _, n := range healthy {
			r, err := n.Readiness(ctx)
			if err != nil {
				t.Errorf("node %d readiness: %v", n.ID, err)
				continue
			}
			if r.Status != http.StatusOK || !r.Ready {
				t.Errorf("node %d is not ready (%d, reason %q) next to a peer of another cluster", n.ID, r.Status, r.Reason)
			}
			if r.ClusterID != c.ID {
				t.Errorf("node %d readiness cluster_id %q, want %q", n.ID, r.ClusterID, c.ID)
			}
			m, err := n.Metrics(ctx)
			if err != nil {
				t.Errorf("node %d metrics: %v", n.ID, err)
				continue
			}
			if !sameMismatches(r.PeerClusterMismatches, m.PeerClusterMismatches) {
				t.Errorf("node %d: readiness lists peer_cluster_mismatches %+v, metrics %+v", n.ID, r.PeerClusterMismatches, m.PeerClusterMismatches)
			}
		}
		writeRound(ctx, t, client, logs, 1, fmt.Sprintf("healthy-%d", round))
		time.Sleep(500 * time.Millisecond) // pacing, not synchronization: the rounds span a few seconds
	}
	verifyNodes(ctx, t, healthy, logs, nil)
}

// streamLog is one stream written by a single sequential idempotent
// producer, so its content is known exactly: every append lands at the
// tail.
type streamLog struct {
	name    string
	prod    Producer
	content []byte
	acks    []ackedRange
	pending []byte // sent without a definite answer yet
}

// ackedRange is an acknowledged append and where it is.
type ackedRange struct {
	start uint64
	body  []byte
}

// newStreamLogs creates one stream per group of c (so that every group
// gets writes) through the gateway.
func newStreamLogs(t testing.TB, c *Cluster, client *Client, prefix string) []*streamLog {
	t.Helper()
	tag := rand.Uint32()
	var logs []*streamLog
	covered := map[uint32]bool{}
	for i := 0; len(covered) < c.GroupCount(); i++ {
		name := fmt.Sprintf("%s-%08x-%d", prefix, tag, i)
		if g := c.GroupOf(name); !covered[g] {
			covered[g] = true
			logs = append(logs, &streamLog{name: name, prod: Producer{ID: "w-" + name}})
		}
	}
	for _, l := range logs {
		deadline := time.Now().Add(clusterAppendBudget)
		for {
			resp, err := client.Create(t.Context(), l.name, "application/octet-stream", nil)
			if err == nil && (resp.Status == http.StatusCreated || resp.Status == http.StatusOK) {
				break
			}
			if err == nil && resp.Status < 500 {
				t.Fatalf("create %s: %v", l.name, resp)
			}
			if time.Now().After(deadline) {
				t.Fatalf("create %s: %v %v", l.name, resp, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return logs
}

// writeRound appends n records to every stream; it stops quietly when ctx
// ends.
func writeRound(ctx context.Context, t testing.TB, client *Client, logs []*streamLog, n int, phase string) {
	t.Helper()
	for i := range n {
		for _, l := range logs {
			body := fmt.Appendf(nil, "%s|%s|%d|%d\n", l.name, phase, i, l.prod.Seq)
			if err := l.append(ctx, client, body); err != nil {
				if ctx.Err() == nil {
					t.Errorf("phase %s: %v", phase, err)
				}
				return
			}
		}
	}
}

// append sends body with the next producer seq until it has a definite
// answer: 200 must name the tail plus body, 204 means an earlier attempt
// landed (there, since nothing else writes the stream). An append left
// without an answer (ctx ended) is sent again, with the same bytes, before
// the next one.
func (l *streamLog) append(ctx context.Context, client *Client, body []byte) error {
	if l.pending != nil {
		if err := l.send(ctx, client, l.pending); err != nil {
			return err
		}
	}
	l.pending = body
	return l.send(ctx, client, body)
}

func (l *streamLog) send(ctx context.Context, client *Client, body []byte) error {
	deadline := time.Now().Add(clusterAppendBudget)
	var last string
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := client.Append(actx, l.name, "application/octet-stream", body, &l.prod)
		cancel()
		if err == nil {
			switch {
			case resp.Status == http.StatusOK:
				end, perr := ParseOffset(resp.NextOffset())
				if perr != nil {
					return fmt.Errorf("append to %s: %w", l.name, perr)
				}
				if want := uint64(len(l.content) + len(body)); end.Pos != want {
					return fmt.Errorf("append to %s (seq %d): acknowledged with Stream-Next-Offset byte %d, want %d", l.name, l.prod.Seq, end.Pos, want)
				}
				l.land(body)
				return nil
			case resp.Status == http.StatusNoContent:
				l.land(body)
				return nil
			case resp.Status < 500:
				return fmt.Errorf("append to %s (seq %d): %v", l.name, l.prod.Seq, resp)
			}
			last = resp.String()
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("append to %s (seq %d): no definite answer within %v: %s", l.name, l.prod.Seq, clusterAppendBudget, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (l *streamLog) land(body []byte) {
	l.acks = append(l.acks, ackedRange{start: uint64(len(l.content)), body: body})
	l.content = append(l.content, body...)
	l.prod.Seq++
	l.pending = nil
}

// verifyNodes reads every stream from each node over gRPC: the whole
// content must be there (waiting for followers to apply), each acknowledged
// append at its offset, with the incarnation in want (when given). It
// returns the incarnations seen.
func verifyNodes(ctx context.Context, t testing.TB, nodes []*Node, logs []*streamLog, want map[string]uint64) map[string]uint64 {
	t.Helper()
	seen := map[string]uint64{}
	// One budget for the whole check, so that a node that cannot serve
	// fails it in bounded time.
	rctx, cancel := context.WithTimeout(ctx, catchUpBudget)
	defer cancel()
	for _, n := range nodes {
		sc, err := n.StreamClient()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			if rctx.Err() != nil {
				t.Errorf("read-back budget of %v spent: the other streams and nodes were not read", catchUpBudget)
				return seen
			}
			got, inc, err := WaitReadRange(rctx, sc, l.name, 0, uint64(len(l.content)))
			if err != nil {
				t.Errorf("node %d: %v", n.ID, err)
				continue
			}
			if string(got) != string(l.content) {
				t.Errorf("node %d: stream %s differs from what was acknowledged (%d bytes, want %d)", n.ID, l.name, len(got), len(l.content))
			}
			if w, ok := want[l.name]; ok && inc != w {
				t.Errorf("node %d: stream %s has incarnation %d, was %d: the stream's history was replaced", n.ID, l.name, inc, w)
			}
			if s, ok := seen[l.name]; ok && s != inc {
				t.Errorf("stream %s: node %d reports incarnation %d, another node %d", l.name, n.ID, inc, s)
			}
			seen[l.name] = inc
			for _, a := range l.acks {
				if err := ReadAt(rctx, sc, l.name, a.start, a.body); err != nil {
					t.Errorf("node %d: acknowledged append: %v", n.ID, err)
					break
				}
			}
		}
	}
	return seen
}

// waitReadyReasons polls a node's /__ursula/ready until it answers 200 and
// counts the reasons of its 503 answers, each of which must be one a
// rejoining node may give.
func waitReadyReasons(ctx context.Context, n *Node) (map[string]int, error) {
	allowed := map[string]bool{"starting": true, "awaiting_rebuild": true, "learner_catching_up": true, "raft_replica_unready": true}
	seen := map[string]int{}
	for {
		r, err := n.Readiness(ctx)
		if err == nil {
			if r.Status == 200 {
				return seen, nil
			}
			seen[r.Reason]++
			if !allowed[r.Reason] {
				return seen, fmt.Errorf("node %d unready with reason %q", n.ID, r.Reason)
			}
		}
		select {
		case <-ctx.Done():
			return seen, fmt.Errorf("node %d not ready: %w (reasons seen %v)", n.ID, ctx.Err(), seen)
		case <-time.After(25 * time.Millisecond):
		}
	}
}
