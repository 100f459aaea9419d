package coldgc

import (
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// outcomeUnknown reports an error after which a command may have
// committed.
func outcomeUnknown(err error) bool {
	de := grpcerr.FromStatus(err)
	return de == nil || de.Code == errcode.OutcomeUnknown || de.Code == errcode.Unavailable || de.Code == errcode.Internal
}

// gcHeld reports a node's answer that a backup holds the cold GC: the
// sweep stops, and that is no error.
func gcHeld(err error) bool {
	de := grpcerr.FromStatus(err)
	return de != nil && de.Code == errcode.ColdGCHeld
}
