package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Role is one part of a process. Run blocks until ctx ends, then stops
// the role and returns nil; it returns early, with the cause, when the
// role fails.
type Role struct {
	Name string
	Run  func(ctx context.Context) error
}

// ErrStoppedOnItsOwn is the cause of a role that returned nil before it
// was asked to stop.
var ErrStoppedOnItsOwn = errors.New("stopped on its own")

// Run runs roles until ctx ends or one fails, and returns the first
// failure (nil after a clean stop).
//
// Roles start in the order given and stop in reverse: each role's context
// is cancelled only after every role after it has returned, so a front
// (the gateway) drains before what it calls (the node) stops, and the node
// before its storage. When a role fails, the others are stopped in that
// same order, and its failure, named, is returned; a failure while
// stopping is returned too when nothing failed before.
func Run(ctx context.Context, logger *slog.Logger, roles ...Role) error {
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
		err    error
	}
	rs := make([]*running, len(roles))
	returned := make(chan int, len(roles))
	for i, role := range roles {
		// A role stops only when Run says so, never with ctx directly.
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := &running{cancel: cancel, done: make(chan struct{})}
		rs[i] = r
		go func() {
			defer close(r.done)
			r.err = role.Run(rctx)
			returned <- i
		}()
	}
	var first error
	select {
	case <-ctx.Done():
	case i := <-returned:
		<-rs[i].done
		cause := rs[i].err
		if cause == nil {
			cause = ErrStoppedOnItsOwn
		}
		first = fmt.Errorf("%s: %w", roles[i].Name, cause)
		logger.Error("a role failed: stopping the process", "role", roles[i].Name, "err", cause)
	}
	for i := len(rs) - 1; i >= 0; i-- {
		rs[i].cancel()
		<-rs[i].done
		if err := rs[i].err; err != nil && first == nil {
			first = fmt.Errorf("%s: %w", roles[i].Name, err)
			logger.Error("a role failed while stopping", "role", roles[i].Name, "err", err)
		}
	}
	return first
}
