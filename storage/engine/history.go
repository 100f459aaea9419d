package engine

import (
	"context"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// StartHistory starts a new history of group g on this node, which must
// lead it, and returns the log index the event applied at: every stream of
// the group takes a new incarnation and remembers the one it had and its
// tail, and every producer epoch claimed before is closed (stream package
// doc, "New history"). planTerm is the term of the plan that asks for it
// (a recovery plan's term; a restore names its own), point the last index
// the plan kept, reason stream.HistoryAcceptLoss or stream.HistoryRestore.
//
// Proposing it again with the plan term the group's history records
// changes nothing and returns the recorded event index; a plan term below
// it is refused. It is proposed here only: a follower answers NOT_LEADER
// and never forwards it, and no client request reaches it.
func (e *Engine) StartHistory(ctx context.Context, g uint32, planTerm, point uint64, reason string) (uint64, error) {
	if int(g) >= e.groups.GroupCount() {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "group %d out of range [0, %d)", g, e.groups.GroupCount())
	}
	if reason != stream.HistoryAcceptLoss && reason != stream.HistoryRestore {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "a new history's reason is %q or %q, not %q", stream.HistoryAcceptLoss, stream.HistoryRestore, reason)
	}
	if !e.groups.Status(g).IsLeader {
		return 0, e.groups.NotLeader(g)
	}
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_StartHistory{StartHistory: &storagev1.StartHistory{
		PlanTerm: planTerm, Point: point, Reason: reason,
	}}})
	if err != nil {
		return 0, err
	}
	return res.EventIndex, nil
}

// History returns group g's latest history event as this node's replica
// applied it; ok is false when the group never started a new history (or
// g is out of range).
func (e *Engine) History(g uint32) (stream.HistoryInfo, bool) {
	if int(g) >= e.groups.GroupCount() {
		return stream.HistoryInfo{}, false
	}
	return e.groups.Machine(g).History()
}
