package cluster

import (
	"context"
	"errors"

	"github.com/ursula/ursula/storage/multiraft"
)

// Recovery plans (accept-unsynced-loss; multiraft/plan.go holds them on
// each replica). The operator's tool sends a plan to every replica of a
// stalled group, the plan's leader first; this node's replica takes it or
// refuses it with a *multiraft.PlanRefusal. Once the plan's leader leads
// above the plan term, it proposes the group's new history before anything
// else (drivePlans), and every replica drops its plan once that event
// applied there.

// AcceptPlan hands a plan to this node's replica of group g; the cluster
// side adds what only it knows (whether the replica's gate reports the
// group stalled). It returns the plan term.
func (c *Cluster) AcceptPlan(ctx context.Context, g uint32, req multiraft.PlanRequest) (uint64, error) {
	if err := c.checkGroup(g); err != nil {
		return 0, err
	}
	req.Stalled = c.GateStates()[g] == GateStalled
	term, err := c.host.AcceptPlan(ctx, g, req)
	var refusal *multiraft.PlanRefusal
	if err != nil && !errors.As(err, &refusal) {
		err = raftError(err)
	}
	return term, err
}
