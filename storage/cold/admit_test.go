package cold

import "testing"

// TestAdmitQueueWakesInArrivalOrder: only the head is woken by room, and
// each leaving head wakes the next, whatever order the others leave in.
func TestAdmitQueueWakesInArrivalOrder(t *testing.T) {
	var q admitQueue
	a, b, c := q.enqueue(), q.enqueue(), q.enqueue()
	if q.empty() || !q.isHead(a) || q.isHead(b) {
		t.Fatal("the first to wait is not the head")
	}
	q.wakeHead()
	q.wakeHead() // a second wake before the head ran is not lost, nor blocks
	if len(a.wake) != 1 || len(b.wake) != 0 || len(c.wake) != 0 {
		t.Fatalf("room woke %d, %d, %d waiters in order, want only the head", len(a.wake), len(b.wake), len(c.wake))
	}
	q.leave(c) // refused or gone: not the head, wakes the head again at most
	if len(b.wake) != 0 {
		t.Fatal("a waiter leaving from the middle woke a waiter behind the head")
	}
	q.leave(a)
	if !q.isHead(b) || len(b.wake) != 1 {
		t.Fatal("the next waiter is not the head, or was not woken")
	}
	q.leave(b)
	if !q.empty() {
		t.Fatal("the queue is not empty after everyone left")
	}
	q.wakeHead() // nobody waits: nothing to do
}
