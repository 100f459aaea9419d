package hot

import "sync"

// Signal wakes every waiter each time Notify is called. Waiters take the
// current channel with C (under the same lock that guards the state they
// inspected) and block until it closes.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel that is closed by the next Notify.
func (s *Signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Notify wakes everyone waiting on a channel returned by C.
func (s *Signal) Notify() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}
