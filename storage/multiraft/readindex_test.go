package multiraft

import (
	"context"
	"errors"
	"fmt"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/tests/await"
)

// readRounds sums the read-index rounds the host's shard workers issued.
func readRounds(h *Host) uint64 {
	var n uint64
	for _, st := range h.ShardStats() {
		n += st.ReadIndexRounds
	}
	return n
}

// readQueue reports, from the group's worker, whether a read-index round is
// in flight and how many readers wait for the next one.
func readQueue(tb testing.TB, h *Host, g uint32) (inflight bool, queued int) {
	tb.Helper()
	err := h.do(context.Background(), g, func(g *group) error {
		inflight, queued = g.reads.inflight != nil, len(g.reads.queued)
		return nil
	})
	if err != nil {
		tb.Fatalf("read queue of group %d: %v", g, err)
	}
	return inflight, queued
}

type readAnswer struct {
	index uint64
	err   error
}

// readAsync calls ReadIndex on its own goroutine.
func readAsync(h *Host, g uint32) <-chan readAnswer {
	return readAsyncCtx(context.Background(), h, g)
}

func readAsyncCtx(ctx context.Context, h *Host, g uint32) <-chan readAnswer {
	ch := make(chan readAnswer, 1)
	go func() {
		idx, err := h.ReadIndex(ctx, g)
		ch <- readAnswer{idx, err}
	}()
	return ch
}

// stuckReaders starts a reader of group 0 whose round cannot finish, and
// then n more that queue for the next round; it returns once they wait.
func stuckReaders(tb testing.TB, h *Host, n int) (first <-chan readAnswer, queued []<-chan readAnswer) {
	tb.Helper()
	first = readAsync(h, 0)
	await.True(tb, "the first reader's round", func() bool {
		inflight, _ := readQueue(tb, h, 0)
		return inflight
	})
	for range n {
		queued = append(queued, readAsync(h, 0))
	}
	await.True(tb, fmt.Sprintf("%d readers to wait for the next round", n), func() bool {
		inflight, q := readQueue(tb, h, 0)
		return inflight && q == n
	})
	return first, queued
}

func TestReadIndexSingleVoter(t *testing.T) {
	cfg := baseConfig(t.TempDir())
	n := startNode(t, cfg, nil)
	waitReady(t, n.h)
	for i := range 10 {
		if _, err := n.h.Propose(t.Context(), 0, u64(uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := n.h.ReadIndex(t.Context(), 0)
	if err != nil {
		t.Fatalf("ReadIndex: %v", err)
	}
	if st := n.h.Status(0); idx < st.Applied {
		t.Fatalf("read index %d below the applied index %d of acknowledged writes", idx, st.Applied)
	}
	if _, err := n.h.ReadIndex(t.Context(), uint32(cfg.GroupCount)); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("ReadIndex of an unknown group = %v", err)
	}

	// After a restart the read index covers every entry of the previous
	// run, whatever commit index the journal recorded.
	n.stop(t)
	n2 := startNode(t, cfg, nil)
	waitReady(t, n2.h)
	idx, err = n2.h.ReadIndex(t.Context(), 0)
	if err != nil {
		t.Fatalf("ReadIndex after restart: %v", err)
	}
	if err := n2.h.WaitApplied(t.Context(), 0, idx); err != nil {
		t.Fatal(err)
	}
	if _, count := n2.sms[0].state(); count != 10 {
		t.Fatalf("after its read index the replica applied %d entries, want 10", count)
	}
}

// TestReadIndex runs three voters whose node 1 never times out an election
// (so it leads group 0 until a higher term reaches it: nothing depends on
// how fast a test machine is), while nodes 2 and 3 elect quickly.
func TestReadIndex(t *testing.T) {
	const waiters = 4
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.GroupCount, cfg.ShardCount = 1, 1
		cfg.MaxReadWaiters = waiters
		if cfg.NodeID == 1 {
			cfg.ElectionTicks = 1 << 30
		}
	})
	// leadByOne makes node 1 the leader of group 0.
	leadByOne := func(tb testing.TB) *testNode {
		tb.Helper()
		await.True(tb, "node 1 to lead group 0", func() bool {
			l := c.leader(tb, 0)
			if l.h.cfg.NodeID == 1 {
				return true
			}
			_ = l.h.TransferLeader(context.Background(), 0, 1)
			return false
		})
		return c.nodes[1]
	}

	t.Run("followers are refused", func(t *testing.T) {
		leadByOne(t)
		for _, id := range []uint64{2, 3} {
			_, err := c.nodes[id].h.ReadIndex(t.Context(), 0)
			var nl *NotLeaderError
			if !errors.As(err, &nl) || nl.LeaderID != 1 {
				t.Fatalf("ReadIndex on follower %d = %v, want NotLeaderError{1}", id, err)
			}
		}
	})

	t.Run("the leader's read index covers its acknowledged writes", func(t *testing.T) {
		l := leadByOne(t)
		c.proposeN(t, 0, 5)
		applied := l.h.Status(0).Applied
		idx, err := l.h.ReadIndex(t.Context(), 0)
		if err != nil || idx < applied {
			t.Fatalf("ReadIndex = %d, %v; want at least %d", idx, err, applied)
		}
	})

	t.Run("readers share rounds and are bounded", func(t *testing.T) {
		l := leadByOne(t)
		// Heartbeat responses to the leader wait: no round can finish.
		c.net.setHold(func(_ uint32, m *pb.Message) bool {
			return m.GetTo() == 1 && m.GetType() == pb.MsgHeartbeatResp
		})
		before := readRounds(l.h)
		first, rest := stuckReaders(t, l.h, waiters)
		if _, err := l.h.ReadIndex(t.Context(), 0); !errors.Is(err, ErrTooManyReads) {
			t.Fatalf("a reader beyond the bound got %v, want ErrTooManyReads", err)
		}
		c.net.release()
		a := <-first
		if a.err != nil {
			t.Fatalf("first reader: %v", a.err)
		}
		var shared uint64
		for i, ch := range rest {
			b := <-ch
			if b.err != nil || b.index < a.index || (i > 0 && b.index != shared) {
				t.Fatalf("reader %d of the second round got %d, %v (first round %d, shared %d)", i, b.index, b.err, a.index, shared)
			}
			shared = b.index
		}
		if got := readRounds(l.h) - before; got != 2 {
			t.Fatalf("%d readers took %d rounds, want 2", waiters+1, got)
		}
	})

	t.Run("an isolated leader answers no read and releases its readers", func(t *testing.T) {
		old := leadByOne(t)
		c.proposeN(t, 0, 1)
		c.net.setDown(1, true)
		first, rest := stuckReaders(t, old.h, waiters)
		readers := append(rest, first)
		// The others elect a leader and commit a write the old leader
		// never sees: any index it answered now would be stale.
		var newLeader uint64
		await.True(t, "a new leader among nodes 2 and 3", func() bool {
			for _, id := range []uint64{2, 3} {
				if st := c.nodes[id].h.Status(0); st.IsLeader {
					newLeader = id
					return true
				}
			}
			return false
		})
		if _, err := c.nodes[newLeader].h.Propose(t.Context(), 0, u64(1)); err != nil {
			t.Fatalf("write on the new leader: %v", err)
		}
		for i, ch := range readers {
			select {
			case a := <-ch:
				t.Fatalf("reader %d of the cut-off leader answered %d, %v", i, a.index, a.err)
			default:
			}
		}
		// Healed, the old leader meets the higher term and steps down:
		// every reader fails instead of hanging.
		c.net.setDown(1, false)
		for i, ch := range readers {
			a := <-ch
			var nl *NotLeaderError
			if !errors.As(a.err, &nl) {
				t.Fatalf("reader %d of the deposed leader got %d, %v; want NotLeaderError", i, a.index, a.err)
			}
		}
		if inflight, queued := readQueue(t, old.h, 0); inflight || queued != 0 {
			t.Fatalf("after the step-down: round in flight %v, %d queued", inflight, queued)
		}
		c.converged(t, 0)
	})

	t.Run("readers that gave up leave the queue", func(t *testing.T) {
		l := leadByOne(t)
		c.net.setHold(func(_ uint32, m *pb.Message) bool {
			return m.GetTo() == 1 && m.GetType() == pb.MsgHeartbeatResp
		})
		defer c.net.release()
		first := readAsync(l.h, 0)
		await.True(t, "the first reader's round", func() bool {
			inflight, _ := readQueue(t, l.h, 0)
			return inflight
		})
		ctx, cancel := context.WithCancel(t.Context())
		var gaveUp []<-chan readAnswer
		for range waiters {
			gaveUp = append(gaveUp, readAsyncCtx(ctx, l.h, 0))
		}
		await.True(t, "a full queue", func() bool {
			_, queued := readQueue(t, l.h, 0)
			return queued == waiters
		})
		cancel()
		for _, ch := range gaveUp {
			if a := <-ch; !errors.Is(a.err, context.Canceled) {
				t.Fatalf("a reader whose context ended got %d, %v", a.index, a.err)
			}
		}
		next := readAsync(l.h, 0)
		await.True(t, "the new reader to take an abandoned reader's place", func() bool {
			_, queued := readQueue(t, l.h, 0)
			return queued == 1
		})
		c.net.release()
		for _, ch := range []<-chan readAnswer{first, next} {
			if a := <-ch; a.err != nil {
				t.Fatalf("reader: %v", a.err)
			}
		}
	})

	t.Run("a stopping host releases its readers", func(t *testing.T) {
		l := leadByOne(t)
		c.net.setHold(func(_ uint32, m *pb.Message) bool {
			return m.GetTo() == 1 && m.GetType() == pb.MsgHeartbeatResp
		})
		defer c.net.release()
		first, rest := stuckReaders(t, l.h, waiters)
		c.stop(t, 1)
		for i, ch := range append(rest, first) {
			if a := <-ch; !errors.Is(a.err, ErrStopped) {
				t.Fatalf("reader %d of the stopped host got %d, %v; want ErrStopped", i, a.index, a.err)
			}
		}
	})
}
