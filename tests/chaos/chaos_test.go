package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ursula/ursula/tests/await"
	"github.com/ursula/ursula/tests/e2e"
)

// Environment variables (and flags) that tune a run.
const (
	// EnvDuration is how long faults are injected, e.g. 10m (make
	// test-chaos); the default is the short run of make test.
	EnvDuration = "URSULA_CHAOS_DURATION"
	// EnvSeed fixes the random choices of a run (the faults' timing still
	// depends on the machine).
	EnvSeed = "URSULA_CHAOS_SEED"
	// EnvNodes is the number of nodes, 3 unless set (5 for a larger run;
	// 1 exercises the harness and the checker without a cluster plane).
	EnvNodes = "URSULA_CHAOS_NODES"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "how long faults are injected (default $"+EnvDuration+", else 40s)")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the run's random choices (default $"+EnvSeed+", else the time)")
)

// Shape of the workload.
const (
	defaultDuration   = 40 * time.Second
	chaosStreams      = 6               // written at once; a new set every streamLifetime
	streamLifetime    = 2 * time.Minute // bounds each stream's history (porcupine's cost grows with it)
	producersPerStrm  = 3
	readersPerStream  = 1
	chaosGroups       = 8
	attemptTimeout    = 10 * time.Second // one HTTP request
	opRetryBudget     = 20 * time.Second // then the producer gives up: outcome unknown
	drainBudget       = 90 * time.Second // in-flight appends after the faults stop
	recoveryBudget    = 90 * time.Second // the cluster back to ready after a fault
	checkTimeout      = 2 * time.Minute  // porcupine, per stream
	verifyReadTimeout = 2 * time.Minute  // reading everything back from every node, plus 1 ms per operation and node
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

// TestChaos runs idempotent producers and readers through the gateway of a
// 3-node cluster while a nemesis SIGKILLs the leader of busy groups (also
// with a lost journal tail), SIGTERMs nodes, cuts one node off the cluster plane, delays and resets its
// links; then it checks every stream's history for linearizability and
// reads every acknowledged append back at its offset from every node.
func TestChaos(t *testing.T) {
	dur := chaosDuration(t)
	seed := chaosSeed(t)
	t.Logf("chaos: faults for %v, seed %d (rerun with %s=%d)", dur, seed, EnvSeed, seed)
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))

	nodes := chaosNodes(t)
	c := e2e.StartCluster(t, e2e.ClusterOptions{
		Nodes:      nodes,
		GroupCount: chaosGroups,
		Proxies:    nodes > 1,
		Gateway:    true,
		// Flush within milliseconds: leaders move bytes to the shared
		// cold store while they are killed and cut off, and reads of
		// every node cross cold objects.
		ColdTuning: e2e.TinyFlushTOML, RuntimeTuning: e2e.TinyFlushRuntimeTOML,
		// A short deleted-data bound, small journal segments and a fast
		// snapshot driver: segments are sealed, the live logs they keep
		// copied forward and the segments deleted every few seconds,
		// while nodes are killed and lose power.
		RaftTuning: `deleted_data_max_age = "8s"`,
		WALTuning:  "segment_size = 65536",
		Extra:      "[storage.snapshot]\ndrive_interval = \"250ms\"\n",
	})
	client := c.Client()
	h := NewHistory()
	w := &workload{t: t, client: client, h: h, acks: make([]atomic.Int64, chaosStreams), tag: seed & 0xffffffff}
	if err := w.rotate(t.Context()); err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithTimeout(t.Context(), dur+drainBudget+5*time.Minute)
	defer cancelRun()
	var producers, readers sync.WaitGroup
	stopNew := make(chan struct{}) // producers start no new appends
	stopReads := make(chan struct{})
	clientID := 0
	for si := range chaosStreams {
		for p := range producersPerStrm {
			pr := &producer{
				w: w, streamIdx: si, client: clientID, gen: -1,
				id:  fmt.Sprintf("s%dp%d", si, p),
				rng: rand.New(rand.NewPCG(seed, uint64(clientID)+1)),
			}
			clientID++
			producers.Go(func() { pr.run(runCtx, stopNew) })
		}
		for range readersPerStream {
			rd := &reader{w: w, streamIdx: si, client: clientID, gen: -1, rng: rand.New(rand.NewPCG(seed, uint64(clientID)+1))}
			clientID++
			readers.Go(func() { rd.run(runCtx, stopReads) })
		}
	}
	// Every streamLifetime the workers move to a new set of streams.
	rotCtx, stopRotation := context.WithCancel(runCtx)
	var rotation sync.WaitGroup
	rotation.Go(func() {
		for {
			select {
			case <-rotCtx.Done():
				return
			case <-time.After(streamLifetime):
			}
			if err := w.rotate(rotCtx); err != nil && rotCtx.Err() == nil {
				t.Errorf("liveness: %v", err)
			}
		}
	})

	// However the test ends, the workers stop before it returns.
	defer func() {
		cancelRun()
		rotation.Wait()
		producers.Wait()
		readers.Wait()
	}()

	// Let the workload get going before the first fault.
	await.True(t, "the first acknowledged append", func() bool { return sum(w.ackCounts()) > 0 })
	n := &nemesis{t: t, c: c, h: h, rng: rng, w: w}
	n.run(runCtx, dur)
	stopRotation()
	rotation.Wait()

	// Heal everything, then every stream must make progress again.
	n.healAll(runCtx)
	before := w.ackCounts()
	if !await.Until(await.DefaultTimeout, func() bool { return progressed(before, w.ackCounts()) }) {
		t.Errorf("liveness: %v after healing, some stream acknowledged nothing new (acks per stream %v, then %v)",
			await.DefaultTimeout, before, w.ackCounts())
	}

	// Stop: producers finish their in-flight append (retrying it until it
	// has a definite answer), then the readers stop.
	close(stopNew)
	if !waitTimeout(&producers, drainBudget+attemptTimeout) {
		t.Errorf("producers still running %v after they were told to stop", drainBudget+attemptTimeout)
		cancelRun()
		producers.Wait()
	}
	close(stopReads)
	readers.Wait()
	cancelRun()

	streams := w.allStreams()
	var acked, dup, unknown, reads int
	for _, s := range streams {
		cn := h.Counts(s)
		acked, dup, unknown, reads = acked+cn[Acked], dup+cn[Duplicate], unknown+cn[Unknown]+cn[Refused], reads+cn[Returned]
	}
	t.Logf("history: %d appends acknowledged (200), %d deduplicated retries (204), %d of unknown outcome, %d reads in %d streams; %d faults injected",
		acked, dup, unknown, reads, len(streams), n.faults)
	if acked == 0 {
		t.Fatal("no append was acknowledged")
	}

	checkHistories(t, c, h, streams)
	verifyEveryNode(t, c, client, h, streams)
	var rewritten float64
	for _, node := range c.Running() {
		if m, err := node.Metrics(t.Context()); err == nil {
			rewritten += m.WALRewrittenBytes
		}
	}
	t.Logf("the running nodes' journals copied %.0f bytes of live entries forward to free segments", rewritten)
	if rewritten == 0 {
		t.Error("no journal copied a live entry forward: the run did not exercise the segment rewrite it configures")
	}
}

func chaosDuration(t testing.TB) time.Duration {
	t.Helper()
	if *flagDuration > 0 {
		return *flagDuration
	}
	if v := os.Getenv(EnvDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", EnvDuration, v)
		}
		return d
	}
	if testing.Short() {
		return defaultDuration / 2
	}
	return defaultDuration
}

func chaosNodes(t testing.TB) int {
	t.Helper()
	v := os.Getenv(EnvNodes)
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 7 {
		t.Fatalf("%s=%q: want 1 to 7", EnvNodes, v)
	}
	return n
}

func chaosSeed(t testing.TB) uint64 {
	t.Helper()
	if *flagSeed != 0 {
		return *flagSeed
	}
	if v := os.Getenv(EnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvSeed, v, err)
		}
		return s
	}
	return uint64(time.Now().UnixNano())
}

// createStream creates stream through the gateway, retrying while the
// cluster settles or recovers from a fault.
func createStream(ctx context.Context, client *e2e.Client, stream string) error {
	deadline := time.Now().Add(recoveryBudget)
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		resp, err := client.Create(actx, stream, "application/octet-stream", nil)
		cancel()
		switch {
		case err == nil && (resp.Status == http.StatusCreated || resp.Status == http.StatusOK):
			return nil // 200: a retry of a create that went through
		case err == nil && resp.Status < 500:
			return fmt.Errorf("create %s: %v", stream, resp)
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("create %s: no success within %v: %v %v", stream, recoveryBudget, resp, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// workload is what producers and readers share.
type workload struct {
	t      testing.TB
	client *e2e.Client
	h      *History
	acks   []atomic.Int64 // 200 answers per stream index, over every set
	tag    uint64

	mu   sync.Mutex
	sets [][]string // the sets of streams in use, in order; the last is current
}

// rotate creates a new set of streams and makes it current.
func (w *workload) rotate(ctx context.Context) error {
	w.mu.Lock()
	gen := len(w.sets)
	w.mu.Unlock()
	set := make([]string, len(w.acks))
	for i := range set {
		set[i] = fmt.Sprintf("chaos-%x-%d-%d", w.tag, gen, i)
		if err := createStream(ctx, w.client, set[i]); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.sets = append(w.sets, set)
	w.mu.Unlock()
	return nil
}

// current returns the current stream of index i and its set number.
func (w *workload) current(i int) (string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := len(w.sets) - 1
	return w.sets[g][i], g
}

func (w *workload) allStreams() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, set := range w.sets {
		out = append(out, set...)
	}
	return out
}

func (w *workload) ackCounts() []int64 {
	out := make([]int64, len(w.acks))
	for i := range w.acks {
		out[i] = w.acks[i].Load()
	}
	return out
}

func progressed(before, after []int64) bool {
	for i := range before {
		if after[i] <= before[i] {
			return false
		}
	}
	return true
}

func sum(counts []int64) int64 {
	var total int64
	for _, n := range counts {
		total += n
	}
	return total
}

// producer appends unique records to one stream as an idempotent producer,
// one append in flight. Each append is retried with the same (id, epoch,
// seq) until it has a definite answer (200 or 204); after opRetryBudget its
// outcome is unknown and the producer moves to the next epoch.
type producer struct {
	w         *workload
	streamIdx int
	client    int
	id        string
	rng       *rand.Rand

	stream     string
	gen        int // the stream set stream belongs to
	epoch, seq uint64
	op         int
}

func (p *producer) record() string {
	pad := make([]byte, p.rng.IntN(64))
	for i := range pad {
		pad[i] = 'a' + byte(p.rng.IntN(26))
	}
	p.op++
	return fmt.Sprintf("%s.%d.%s\n", p.id, p.op, pad)
}

func (p *producer) run(ctx context.Context, stopNew <-chan struct{}) {
	for ctx.Err() == nil {
		select {
		case <-stopNew:
			return
		default:
		}
		if name, gen := p.w.current(p.streamIdx); gen != p.gen {
			// A new stream: a fresh producer state there.
			p.stream, p.gen, p.epoch, p.seq = name, gen, 0, 0
		}
		rec := p.record()
		call := p.w.h.Now()
		out := p.appendOnce(ctx, rec)
		p.w.h.Add(p.stream, p.client, Input{Kind: Append, Record: rec}, call, out, p.w.h.Now())
		switch out.Outcome {
		case Acked:
			p.w.acks[p.streamIdx].Add(1)
			p.seq++
		case Duplicate:
			p.seq++
		default:
			// The tuple's fate is unknown: a new epoch fences it.
			p.epoch++
			p.seq = 0
		}
		sleep(ctx, time.Duration(10+p.rng.IntN(50))*time.Millisecond) // pacing, not synchronization
	}
}

// appendOnce sends one record until it has a definite answer, the budget
// runs out or ctx ends.
func (p *producer) appendOnce(ctx context.Context, rec string) Output {
	t := p.w.t
	deadline := time.Now().Add(opRetryBudget)
	backoff := 20 * time.Millisecond
	prod := &e2e.Producer{ID: p.id, Epoch: p.epoch, Seq: p.seq}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		resp, err := p.w.client.Append(actx, p.stream, "application/octet-stream", []byte(rec), prod)
		cancel()
		if err == nil {
			switch {
			case resp.Status == http.StatusOK:
				end, perr := e2e.ParseOffset(resp.NextOffset())
				if perr != nil {
					t.Errorf("producer %s seq %d: 200 with a bad Stream-Next-Offset: %v", p.id, p.seq, perr)
					return Output{Outcome: Unknown}
				}
				return Output{Outcome: Acked, End: end.Pos}
			case resp.Status == http.StatusNoContent:
				if got := resp.Header.Get("Producer-Seq"); got != strconv.FormatUint(p.seq, 10) {
					t.Errorf("producer %s seq %d: 204 with Producer-Seq %q", p.id, p.seq, got)
				}
				return Output{Outcome: Duplicate}
			case resp.Status >= 400 && resp.Status < 500 && resp.Status != http.StatusTooManyRequests && resp.Status != http.StatusRequestTimeout:
				// Never expected from this workload: a lost stream (404),
				// lost producer state (409 sequence gap), a fenced epoch.
				t.Errorf("producer %s epoch %d seq %d attempt %d: %v", p.id, p.epoch, p.seq, attempt, resp)
				return Output{Outcome: Unknown}
			}
			// 5xx (503 OUTCOME_UNKNOWN, unavailable, not leader), 408, 429:
			// the same tuple is sent again.
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return Output{Outcome: Unknown}
		}
		sleep(ctx, backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// reader reads one stream through the gateway: mostly from where its last
// read ended, sometimes from an offset it was given earlier, rarely from the
// start.
type reader struct {
	w         *workload
	streamIdx int
	client    int
	rng       *rand.Rand

	stream string
	gen    int
	pos    uint64
	seen   []uint64 // recent Stream-Next-Offset positions
}

func (r *reader) run(ctx context.Context, stop <-chan struct{}) {
	for ctx.Err() == nil {
		select {
		case <-stop:
			return
		default:
		}
		if name, gen := r.w.current(r.streamIdx); gen != r.gen {
			r.stream, r.gen, r.pos, r.seen = name, gen, 0, nil
		}
		from := r.pos
		switch p := r.rng.IntN(100); {
		case p < 5:
			from = 0
		case p < 30 && len(r.seen) > 0:
			from = r.seen[r.rng.IntN(len(r.seen))]
		}
		call := r.w.h.Now()
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		resp, err := r.w.client.Read(actx, r.stream, e2e.OffsetAt(from))
		cancel()
		ret := r.w.h.Now()
		if err == nil && resp.Status == http.StatusOK {
			end, perr := e2e.ParseOffset(resp.NextOffset())
			if perr != nil {
				r.w.t.Errorf("read %s from byte %d: %v", r.stream, from, perr)
			} else {
				r.w.h.Add(r.stream, r.client, Input{Kind: Read, From: from},
					call, ReadOutput(end.Pos, resp.Body, resp.UpToDate()), ret)
				r.pos = end.Pos
				if len(r.seen) < 64 {
					r.seen = append(r.seen, end.Pos)
				} else {
					r.seen[r.rng.IntN(len(r.seen))] = end.Pos
				}
			}
		} else if err == nil && resp.Status >= 400 && resp.Status < 500 && resp.Status != http.StatusTooManyRequests {
			r.w.t.Errorf("read %s from byte %d: %v", r.stream, from, resp)
		}
		// A failed read changes nothing and is not recorded.
		sleep(ctx, time.Duration(10+r.rng.IntN(40))*time.Millisecond) // pacing, not synchronization
	}
}

// nemesis injects one fault at a time and waits for the cluster to recover
// from it before the next.
type nemesis struct {
	t      testing.TB
	c      *e2e.Cluster
	h      *History
	rng    *rand.Rand
	w      *workload
	faults int
}

// busyStream returns one of the streams being written.
func (n *nemesis) busyStream() string {
	s, _ := n.w.current(n.rng.IntN(len(n.w.acks)))
	return s
}

func (n *nemesis) logf(format string, args ...any) {
	n.t.Helper()
	n.t.Logf("t=%6.1fs nemesis: %s", float64(n.h.Now())/1e9, fmt.Sprintf(format, args...))
}

func (n *nemesis) run(ctx context.Context, dur time.Duration) {
	end := time.Now().Add(dur)
	type fault struct {
		weight int
		do     func(context.Context)
	}
	faults := []fault{
		{3, n.killLeader},
		{2, n.powerLossOfLeader},
		{1, n.terminate},
	}
	if len(n.c.Links(1)) > 0 {
		faults = append(faults, fault{2, n.isolate}, fault{1, n.delay}, fault{1, n.resetLinks})
	}
	total := 0
	for _, f := range faults {
		total += f.weight
	}
	for time.Now().Before(end) && ctx.Err() == nil && !n.t.Failed() {
		pick := n.rng.IntN(total)
		for _, f := range faults {
			if pick < f.weight {
				f.do(ctx)
				break
			}
			pick -= f.weight
		}
		n.faults++
		if !n.recover(ctx) {
			return
		}
		sleep(ctx, time.Duration(500+n.rng.IntN(2000))*time.Millisecond) // the nemesis schedule: pacing
	}
}

// busyLeader picks a busy stream and returns it, its group and the
// group's leader. The cluster recovered before each fault: a group
// without a leader for the liveness budget is a failure (nil leader).
func (n *nemesis) busyLeader(ctx context.Context) (string, uint32, *e2e.Node) {
	stream := n.busyStream()
	g := n.c.GroupOf(stream)
	lctx, cancel := context.WithTimeout(ctx, recoveryBudget)
	defer cancel()
	leader, err := n.c.Leader(lctx, g)
	if err != nil {
		n.t.Errorf("liveness: %v", err)
		return stream, g, nil
	}
	return stream, g, leader
}

// killLeader SIGKILLs the leader of the group of a random stream, and
// restarts it on its data directory after a moment.
func (n *nemesis) killLeader(ctx context.Context) {
	stream, g, leader := n.busyLeader(ctx)
	if leader == nil {
		return
	}
	down := time.Duration(200+n.rng.IntN(2500)) * time.Millisecond
	start := n.h.Now()
	n.logf("SIGKILL node %d, leader of group %d (stream %s), for %v", leader.ID, g, stream, down)
	if err := leader.Kill(); err != nil {
		n.t.Errorf("SIGKILL node %d: %v", leader.ID, err)
	}
	sleep(ctx, down)
	n.restart(ctx, leader)
	n.h.Fault(fmt.Sprintf("SIGKILL node %d (leader of group %d)", leader.ID, g), start, n.h.Now())
}

// powerLossOfLeader SIGKILLs the leader of a busy group and cuts the tail
// of each of its active journal segments (a random part, up to half: the
// page cache a host crash takes under fsync "never") before restarting it.
// The node comes back behind the recovery gate; the other two voters hold
// every acknowledged write, so the history must stay linearizable.
func (n *nemesis) powerLossOfLeader(ctx context.Context) {
	stream, g, leader := n.busyLeader(ctx)
	if leader == nil {
		return
	}
	start := n.h.Now()
	if err := leader.Kill(); err != nil {
		n.t.Errorf("SIGKILL node %d: %v", leader.ID, err)
	}
	cut := n.cutJournalTails(leader.Config.DataDir)
	n.logf("power loss of node %d, leader of group %d (stream %s): %d journal bytes lost", leader.ID, g, stream, cut)
	sleep(ctx, time.Duration(200+n.rng.IntN(1500))*time.Millisecond)
	n.restart(ctx, leader)
	n.h.Fault(fmt.Sprintf("power loss of node %d (leader of group %d)", leader.ID, g), start, n.h.Now())
}

// cutJournalTails cuts up to half of every shard's newest segment, never
// below what the node synced (e2e.CutJournalTail), and returns the bytes
// cut.
func (n *nemesis) cutJournalTails(dataDir string) int64 {
	cut, err := e2e.CutJournalTail(dataDir, 0.5, func(room int64) int64 { return 1 + n.rng.Int64N(room) })
	if err != nil {
		n.t.Errorf("cut the journals of %s: %v", dataDir, err)
	}
	return cut
}

// terminate SIGTERMs a random node and restarts it.
func (n *nemesis) terminate(ctx context.Context) {
	node := n.c.Nodes[n.rng.IntN(len(n.c.Nodes))]
	start := n.h.Now()
	n.logf("SIGTERM node %d", node.ID)
	if err := node.Terminate(30 * time.Second); err != nil {
		n.t.Errorf("SIGTERM node %d: %v", node.ID, err)
	}
	sleep(ctx, time.Duration(200+n.rng.IntN(1500))*time.Millisecond)
	n.restart(ctx, node)
	n.h.Fault(fmt.Sprintf("SIGTERM node %d", node.ID), start, n.h.Now())
}

func (n *nemesis) restart(ctx context.Context, node *e2e.Node) {
	if node.Running() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, recoveryBudget)
	defer cancel()
	if err := node.Restart(rctx); err != nil {
		n.t.Errorf("restart node %d: %v", node.ID, err)
		return
	}
	n.logf("node %d ready again", node.ID)
}

// isolate blackholes every cluster-plane link of a node, then heals. Half
// of the time the node leads a busy group: it may go on believing it leads,
// and the gateway still reaches it.
func (n *nemesis) isolate(ctx context.Context) {
	node := n.c.Nodes[n.rng.IntN(len(n.c.Nodes))]
	what := "a random node"
	if n.rng.IntN(2) == 0 {
		stream := n.busyStream()
		g := n.c.GroupOf(stream)
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if leader, err := n.c.Leader(lctx, g); err == nil {
			node, what = leader, fmt.Sprintf("leader of group %d (stream %s)", g, stream)
		}
		cancel()
	}
	d := time.Duration(1500+n.rng.IntN(5000)) * time.Millisecond
	start := n.h.Now()
	n.logf("isolate node %d, %s, for %v", node.ID, what, d)
	n.c.Isolate(node.ID)
	sleep(ctx, d)
	n.c.Heal()
	n.h.Fault(fmt.Sprintf("isolate node %d", node.ID), start, n.h.Now())
}

// delay slows every cluster-plane link of a node.
func (n *nemesis) delay(ctx context.Context) {
	node := n.c.Nodes[n.rng.IntN(len(n.c.Nodes))]
	lat := time.Duration(20+n.rng.IntN(150)) * time.Millisecond
	d := time.Duration(2000+n.rng.IntN(4000)) * time.Millisecond
	start := n.h.Now()
	n.logf("delay the links of node %d by %v for %v", node.ID, lat, d)
	for _, p := range n.c.Links(node.ID) {
		p.SetDelay(lat)
	}
	sleep(ctx, d)
	n.c.Heal()
	n.h.Fault(fmt.Sprintf("delay node %d by %v", node.ID, lat), start, n.h.Now())
}

// resetLinks closes every open cluster-plane connection of a node.
func (n *nemesis) resetLinks(ctx context.Context) {
	node := n.c.Nodes[n.rng.IntN(len(n.c.Nodes))]
	start := n.h.Now()
	n.logf("reset the connections of node %d", node.ID)
	for _, p := range n.c.Links(node.ID) {
		p.Reset()
	}
	n.h.Fault(fmt.Sprintf("reset links of node %d", node.ID), start, n.h.Now())
}

// recover waits until every node is ready and every group has an agreed
// leader; a cluster that does not get there is a liveness failure.
func (n *nemesis) recover(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, recoveryBudget)
	defer cancel()
	err := n.c.WaitReady(rctx)
	if err == nil {
		err = n.c.WaitGroupsLed(rctx)
	}
	if err != nil {
		n.t.Errorf("liveness: the cluster did not recover within %v of the last fault: %v", recoveryBudget, err)
		return false
	}
	return true
}

// healAll ends every fault: links pass, stopped nodes start.
func (n *nemesis) healAll(ctx context.Context) {
	n.c.Heal()
	for _, node := range n.c.Nodes {
		if !node.Running() {
			n.restart(ctx, node)
		}
	}
	n.recover(ctx)
	n.logf("faults over, cluster healed")
}

// checkHistories checks every stream's history with porcupine.
func checkHistories(t testing.TB, c *e2e.Cluster, h *History, streams []string) {
	t.Helper()
	for _, s := range streams {
		start := time.Now()
		vis := filepath.Join(c.Dir, "history-"+s+".html")
		res, err := h.Check(s, checkTimeout, vis)
		took := time.Since(start).Round(time.Millisecond)
		switch res {
		case porcupine.Ok:
			t.Logf("stream %s: %d operations linearizable (checked in %v)", s, len(h.Ops(s)), took)
		case porcupine.Illegal:
			msg := "no visualization: " + fmt.Sprint(err)
			if err == nil {
				msg = "visualization " + keepFile(vis)
			}
			t.Errorf("stream %s: history of %d operations is NOT linearizable (%s)", s, len(h.Ops(s)), msg)
		default:
			t.Errorf("stream %s: linearizability check inconclusive after %v (%d operations)", s, took, len(h.Ops(s)))
		}
	}
}

// keepFile copies a file out of the test's temporary directory (removed at
// the end) and returns where it went.
func keepFile(path string) string {
	dir := os.Getenv(e2e.EnvArtifacts)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "ursula-chaos-"); err != nil {
			return path
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return path
	}
	out := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return path
	}
	return out
}

// streamTruth is a stream as the gateway serves it after the run, checked
// against what the producers learned.
type streamTruth struct {
	name    string
	content []byte
	fates   map[string]fate // by record
}

// fate is what a record's producer learned.
type fate struct {
	outcome Outcome
	end     uint64
}

// verifyEveryNode reads every stream back: through the gateway, where each
// record must sit where its producer was told (and appear once), then from
// every node over gRPC, which must hold the same bytes and return every
// acknowledged append at its offset.
func verifyEveryNode(t testing.TB, c *e2e.Cluster, client *e2e.Client, h *History, streams []string) {
	t.Helper()
	gctx, cancel := context.WithTimeout(t.Context(), verifyReadTimeout)
	defer cancel()
	var truths []*streamTruth
	for _, s := range streams {
		if tr := checkStream(gctx, t, client, h, s); tr != nil {
			truths = append(truths, tr)
		}
	}

	// One budget for the nodes, so that a node that cannot serve fails
	// the check in bounded time; long runs read more back.
	budget := verifyReadTimeout
	for _, s := range streams {
		budget += time.Duration(len(h.Ops(s))) * time.Duration(len(c.Nodes)) * time.Millisecond
	}
	nctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	incs := map[string]map[uint64]uint64{} // stream -> node -> incarnation
	verified := map[uint64]int{}           // node -> acknowledged appends read back
	for _, node := range c.Nodes {
		wg.Go(func() {
			sc, err := node.StreamClient()
			if err != nil {
				t.Error(err)
				return
			}
			for _, tr := range truths {
				if nctx.Err() != nil {
					t.Errorf("node %d: read-back budget of %v spent: its other streams were not read", node.ID, budget)
					return
				}
				got, inc, err := e2e.WaitReadRange(nctx, sc, tr.name, 0, uint64(len(tr.content)))
				if err != nil {
					t.Errorf("stream %s on node %d: %v", tr.name, node.ID, err)
					continue
				}
				if string(got) != string(tr.content) {
					t.Errorf("stream %s: node %d holds other bytes than the gateway served (%d bytes, first difference at byte %d)",
						tr.name, node.ID, len(got), firstDiff(got, tr.content))
					continue
				}
				mu.Lock()
				if incs[tr.name] == nil {
					incs[tr.name] = map[uint64]uint64{}
				}
				incs[tr.name][node.ID] = inc
				mu.Unlock()
				bad := 0
				for rec, f := range tr.fates {
					if f.outcome != Acked {
						continue
					}
					if err := e2e.ReadAt(nctx, sc, tr.name, f.end-uint64(len(rec)), []byte(rec)); err != nil {
						t.Errorf("stream %s on node %d: acknowledged append: %v", tr.name, node.ID, err)
						if bad++; bad == 10 {
							break
						}
						continue
					}
					mu.Lock()
					verified[node.ID]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for s, m := range incs {
		if len(uniq(m)) > 1 {
			t.Errorf("stream %s: nodes report different incarnations: %v", s, m)
		}
	}
	t.Logf("acknowledged appends read back at their offsets, per node: %v", verified)
}

// checkStream reads stream through the gateway to its tail and checks that
// every record was appended by a producer, appears once, sits where a 200
// answer said, and that no acknowledged (200 or 204) record is missing.
func checkStream(ctx context.Context, t testing.TB, client *e2e.Client, h *History, s string) *streamTruth {
	t.Helper()
	tr := &streamTruth{name: s, fates: map[string]fate{}}
	for _, op := range h.Ops(s) {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind == Append {
			tr.fates[in.Record] = fate{out.Outcome, out.End}
		}
	}
	content, _, err := readAllRetry(ctx, client, s)
	if err != nil {
		t.Errorf("stream %s: read through the gateway: %v", s, err)
		return nil
	}
	tr.content = content
	seen := map[string]uint64{}
	pos := uint64(0)
	for _, line := range strings.SplitAfter(string(content), "\n") {
		if line == "" {
			continue
		}
		if !strings.HasSuffix(line, "\n") {
			t.Errorf("stream %s: torn record at byte %d: %q", s, pos, line)
			break
		}
		end := pos + uint64(len(line))
		f, sent := tr.fates[line]
		switch {
		case !sent:
			t.Errorf("stream %s: bytes [%d, %d) %q were never appended", s, pos, end, line)
		case seen[line] != 0:
			t.Errorf("stream %s: record %q DUPLICATED: ends at byte %d and at byte %d", s, strings.TrimSpace(line), seen[line], end)
		case f.outcome == Acked && f.end != end:
			t.Errorf("stream %s: record %q acknowledged at [%d, %d) but found at [%d, %d)",
				s, strings.TrimSpace(line), f.end-uint64(len(line)), f.end, pos, end)
		case f.outcome == Refused:
			t.Errorf("stream %s: refused record %q found at [%d, %d)", s, strings.TrimSpace(line), pos, end)
		}
		seen[line] = end
		pos = end
	}
	lost := 0
	for rec, f := range tr.fates {
		if (f.outcome == Acked || f.outcome == Duplicate) && seen[rec] == 0 {
			if lost++; lost <= 20 {
				t.Errorf("stream %s: %s append %q LOST: not in the stream", s, f.outcome, strings.TrimSpace(rec))
			}
		}
	}
	if lost > 0 {
		t.Errorf("stream %s: %d acknowledged appends lost", s, lost)
	}
	return tr
}

// readAllRetry reads a stream through the gateway to its tail, retrying
// while the cluster answers errors.
func readAllRetry(ctx context.Context, client *e2e.Client, stream string) ([]byte, string, error) {
	for {
		data, tail, err := client.ReadAll(ctx, stream)
		if err == nil {
			return data, tail, nil
		}
		select {
		case <-ctx.Done():
			return nil, "", err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func uniq(m map[uint64]uint64) []uint64 {
	var out []uint64
	for _, v := range m {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
