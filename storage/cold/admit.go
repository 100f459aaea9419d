package cold

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// admitRecheck is how often the write waiting longest looks at the node's
// hot bytes without being woken: this node's flushes wake it, but the hot
// bytes of the groups led elsewhere go with their leaders' flushes, which
// it only sees by looking.
const admitRecheck = 50 * time.Millisecond

// AdmitWrite admits a write to group g while flushes keep up. It refuses
// it at once while the group holds its cap of hot bytes. While the node
// holds its cap, the write waits up to AdmitWait for flushes to make room,
// in a queue: writers slow down to what the cold store takes, first come
// first admitted, before any is refused. (Without the queue every flush
// woke every waiter, the first to run took the room, and the unlucky ones
// were refused after AdmitWait while others went through in milliseconds.)
func (t *Tier) AdmitWrite(ctx context.Context, g uint32) error {
	if t.store == nil {
		return nil
	}
	if hot := uint64(t.groups.Machine(g).HotBytes()); hot >= t.cfg.HotCapBytes {
		return t.refuseWrite(fmt.Sprintf("group %d holds %d hot bytes, at or above its cap of %d", g, hot, t.cfg.HotCapBytes))
	}
	if t.admit.empty() && t.nodeHotBytes() < t.cfg.NodeHotCapBytes {
		return nil
	}
	t.stats.AdmitWaits.Add(1)
	t.kickFlush()
	w := t.admit.enqueue()
	defer t.admit.leave(w)
	timeout := time.NewTimer(t.cfg.AdmitWait)
	defer timeout.Stop()
	var recheck <-chan time.Time
	for {
		if t.admit.isHead(w) {
			hot := t.nodeHotBytes()
			if hot < t.cfg.NodeHotCapBytes {
				return nil // leave hands the head to the next waiter
			}
			if recheck == nil {
				tick := time.NewTicker(admitRecheck)
				defer tick.Stop()
				recheck = tick.C
			}
		}
		select {
		case <-w.wake:
		case <-recheck:
		case <-timeout.C:
			return t.refuseWrite(fmt.Sprintf("the node holds %d hot bytes, at or above its cap of %d", t.nodeHotBytes(), t.cfg.NodeHotCapBytes))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// admitQueue is the queue of writes waiting for room, oldest first. Only
// its head looks at the room; it is woken when a flush made some, and when
// it becomes the head.
type admitQueue struct {
	mu      sync.Mutex
	waiters list.List    // of *admitWaiter
	n       atomic.Int64 // waiters: every write reads it, without the lock
}

type admitWaiter struct {
	wake chan struct{} // buffered: a wake is never lost nor blocks
	elem *list.Element
}

func (q *admitQueue) empty() bool { return q.n.Load() == 0 }

func (q *admitQueue) enqueue() *admitWaiter {
	w := &admitWaiter{wake: make(chan struct{}, 1)}
	q.mu.Lock()
	w.elem = q.waiters.PushBack(w)
	q.n.Add(1)
	q.mu.Unlock()
	return w
}

func (q *admitQueue) isHead(w *admitWaiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Front() == w.elem
}

// leave removes w (admitted, refused or gone) and wakes the new head.
func (q *admitQueue) leave(w *admitWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiters.Remove(w.elem)
	q.n.Add(-1)
	q.wakeHeadLocked()
}

// wakeHead wakes the write waiting longest, if any.
func (q *admitQueue) wakeHead() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.wakeHeadLocked()
}

func (q *admitQueue) wakeHeadLocked() {
	if f := q.waiters.Front(); f != nil {
		select {
		case f.Value.(*admitWaiter).wake <- struct{}{}:
		default:
		}
	}
}
