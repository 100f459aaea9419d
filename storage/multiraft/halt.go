package multiraft

import (
	"errors"
	"fmt"
)

// ErrGroupHalted is returned for a group this node stopped applying: its
// state machine met a committed entry or snapshot it must not apply (a
// feature level this build does not know, see HaltGroup).
var ErrGroupHalted = errors.New("multiraft: group halted on this node")

// groupHalter is an error of StateMachine.Apply or Restore that stops
// applying the group on this node instead of stopping the node.
type groupHalter interface{ HaltGroup() bool }

// haltsGroup reports whether err asks to halt the group.
func haltsGroup(err error) bool {
	if err == nil {
		return false // the usual answer, without errors.As's allocation
	}
	var h groupHalter
	return errors.As(err, &h) && h.HaltGroup()
}

// halt freezes the group on this node: it applies nothing more, takes no
// Raft message, proposal, read or tick, and campaigns no more, so its
// replica stays at the last entry it applied, unchanged, until the node
// restarts with a build that applies what it refused (or, after a restart
// with the same build, halts again at the same entry). The other replicas
// go on without it. Pending proposals end with ErrOutcomeUnknown (they may
// commit elsewhere), waiting readers with ErrGroupHalted.
func (g *group) halt(cause error) {
	if g.halted != nil {
		return
	}
	g.halted = cause
	g.isLeader, g.leader = false, 0
	g.failPending(ErrOutcomeUnknown)
	g.failHeld(ErrOutcomeUnknown)
	g.failReads(fmt.Errorf("%w: %v", ErrGroupHalted, cause))
	g.logger.Error("stopped applying the group: this build cannot apply what the group committed; the node stays up, unready, and the other replicas go on (restart it with a build that knows it)",
		"applied", g.applied, "err", cause)
}

// refuseHalted answers an op for a halted group.
func refuseHalted(o *op) {
	err := fmt.Errorf("%w: %v", ErrGroupHalted, o.g.halted)
	switch o.kind {
	case opPropose:
		o.p.finish(nil, err)
	case opFunc:
		o.done <- err
	case opSnapshot, opPurgeLog:
		if o.req.start() {
			o.req.finish(0, err)
		}
	case opReadIndex:
		o.read.finish(0, err)
	}
}

// Halted lists the groups this node stopped applying, each with the
// error that halted it.
func (h *Host) Halted() map[uint32]error {
	out := map[uint32]error{}
	for _, g := range h.groups {
		if err := g.getStatus().Halted; err != nil {
			out[g.id] = err
		}
	}
	return out
}
