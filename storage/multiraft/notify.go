package multiraft

import (
	"context"
	"sync"
)

// appliedWaits lets callers wait until a group has applied an index, the
// idea of etcd's wait.WaitTime: the shard worker triggers it after every
// batch it applies, and a waiter gets a channel closed once the applied
// index reaches its own. No caller polls.
type appliedWaits struct {
	mu      sync.Mutex
	applied uint64
	waits   map[uint64]chan struct{}
}

// closedChan is returned for an index already applied.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// wait returns a channel closed once index is applied.
func (w *appliedWaits) wait(index uint64) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if index <= w.applied {
		return closedChan
	}
	if w.waits == nil {
		w.waits = make(map[uint64]chan struct{})
	}
	ch, ok := w.waits[index]
	if !ok {
		ch = make(chan struct{})
		w.waits[index] = ch
	}
	return ch
}

// trigger records the applied index and releases the waiters it reached.
func (w *appliedWaits) trigger(applied uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if applied <= w.applied {
		return
	}
	w.applied = applied
	for index, ch := range w.waits {
		if index <= applied {
			close(ch)
			delete(w.waits, index)
		}
	}
}

// broadcast wakes every waiter whenever something changes (a group's
// leader, term or membership): waiters take the current channel, look at
// the state, and wait for the channel to close before looking again.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed returns the channel the next change closes.
func (b *broadcast) changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// WaitApplied blocks until this node's replica of the group has applied
// index, ctx ends (its error), or the host stops (ErrStopped).
func (h *Host) WaitApplied(ctx context.Context, groupID uint32, index uint64) error {
	if int(groupID) >= len(h.groups) {
		return ErrUnknownGroup
	}
	select {
	case <-h.groups[groupID].appliedWaits.wait(index):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-h.stopped:
		return ErrStopped
	}
}

// StatusChanged returns a channel closed at the next change of any group's
// leader, term or membership. Callers read Status, and wait on a channel
// taken before they read it.
func (h *Host) StatusChanged() <-chan struct{} { return h.statusChanged.changed() }
