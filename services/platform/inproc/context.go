package inproc

import (
	"context"
	"sync"
	"time"
)

// callContext is the root of a handler's context. It takes the deadline and
// the cancellation of the caller's context but its values from the server's
// connection context: over a network only the deadline, the cancellation and
// the metadata cross, so a handler must not see the caller's logger, span or
// anything else the caller put in its context. It also ends when the call
// ends, as a grpc.Server stream's context does.
//
// It is written out rather than built from context.WithCancel because a
// unary call should cost a few small allocations: the done channel is made
// only when someone asks for it (most unary handlers never do), and the
// caller's context is watched only from then on.
type callContext struct {
	caller context.Context
	values context.Context

	mu    sync.Mutex
	done  chan struct{} // made on first use
	err   error
	stop  func() bool // unregisters the watch on caller
	funcs map[*afterFunc]struct{}
}

// afterFunc is one registration of callContext.AfterFunc; its address is its
// identity.
type afterFunc struct{ f func() }

func (c *callContext) Deadline() (time.Time, bool) { return c.caller.Deadline() }

func (c *callContext) Value(key any) any { return c.values.Value(key) }

func (c *callContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchLocked()
	return c.done
}

// Err reports the caller's error as soon as the caller's context has one,
// even before the watch has fired, and then keeps it: Done and Err must
// agree.
func (c *callContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if err := c.caller.Err(); err != nil {
			c.cancelLocked(err)
		}
	}
	return c.err
}

// AfterFunc lets context.WithCancel, context.AfterFunc and friends on a
// handler's context register with it instead of each starting a goroutine
// that waits on Done (the context package looks for this method).
func (c *callContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	c.watchLocked()
	a := &afterFunc{f: f}
	if c.funcs == nil {
		c.funcs = make(map[*afterFunc]struct{})
	}
	c.funcs[a] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.funcs[a]
		delete(c.funcs, a)
		return ok
	}
}

func (c *callContext) String() string { return "inproc.callContext" }

// watchLocked makes the done channel and starts watching the caller's
// context, once.
func (c *callContext) watchLocked() {
	if c.done != nil {
		return
	}
	c.done = make(chan struct{})
	switch {
	case c.err != nil:
		close(c.done)
	case c.caller.Done() != nil:
		c.stop = context.AfterFunc(c.caller, func() { c.cancel(c.caller.Err()) })
	}
}

// cancel ends the context with err unless it has ended already.
func (c *callContext) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelLocked(err)
}

func (c *callContext) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	for a := range c.funcs {
		go a.f()
	}
	c.funcs = nil
}
