package cluster

import (
	"context"
	"errors"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/stream"

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

// drivePlans, on each leadership tick, clears the plans whose new history
// applied on this replica, and makes a plan's leader that leads above the
// plan term propose the new history (one proposal per group at a time; a
// repeat of the same plan term changes nothing, so a retry is safe).
func (c *Cluster) drivePlans(ctx context.Context) {
	for g, p := range c.host.Plans() {
		if h, ok := c.machines[g].History(); ok && h.PlanTerm == p.Term {
			if err := c.host.PlanSatisfied(ctx, g, p.Term); err != nil {
				c.logger.Error("recovery plan: could not clear the satisfied plan", "group_id", g, "err", err)
			}
			continue
		}
		st := c.host.Status(g)
		if p.Role != multiraft.PlanLead || !st.IsLeader || st.Term <= p.Term {
			continue
		}
		if _, busy := c.historyProposals.LoadOrStore(g, true); busy {
			continue
		}
		c.gates.wg.Add(1)
		go func() {
			defer c.gates.wg.Done()
			defer c.historyProposals.Delete(g)
			ctx, cancel := context.WithTimeout(ctx, gateBarrierWait+2*time.Second)
			defer cancel()
			res, err := c.Propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_StartHistory{StartHistory: &storagev1.StartHistory{
				PlanTerm: p.Term, Point: p.Point, Reason: stream.HistoryAcceptLoss,
			}}})
			if err != nil {
				c.logger.Warn("recovery plan: the new history was not proposed yet", "group_id", g, "plan_term", p.Term, "err", err)
				return
			}
			c.logger.Warn("recovery plan: the group's new history started; every stream has a new incarnation and every producer epoch before it is closed",
				"group_id", g, "plan_term", p.Term, "point", p.Point, "event_index", res.EventIndex)
		}()
	}
}
