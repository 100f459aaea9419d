package ursulactl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Drain puts node id into maintenance drain and moves every leadership it
// holds to other voters, then waits (up to Options.Timeout) until it leads
// nothing:
//
//  1. It observes every node once. Every other node must be reachable and
//     ready, and every group the node is a voter of must keep a quorum of
//     ready voters without it; otherwise it aborts.
//  2. It pins the node's process incarnation from that observation and
//     sends POST /__ursula/leadership-shed/maintenance.
//  3. For each group the node still leads, it picks a voter that is
//     ready and not draining (GET /__ursula/leadership-shed), leading the
//     fewest groups, and sends POST /__ursula/raft/{g}/leader/transfer/{to}
//     to the node, again after transferRetry if the group has not moved.
//     A group with no eligible voter aborts.
//
// Every mutation carries the pinned incarnation; a node that restarted
// (412), or whose metrics show another incarnation, stops the drain.
func (c *Controller) Drain(ctx context.Context, id uint64) error {
	_, _, err := c.drain(ctx, id)
	return err
}

// DrainResult is what a drain did (drain's --json document).
type DrainResult struct {
	Node    uint64 `json:"node"`
	Drained bool   `json:"drained"`
	// Shed is the node's answer to the drain mark (its shed state).
	Shed any `json:"shed"`
	// Transfers are the leadership transfers sent, in order.
	Transfers []Handoff `json:"transfers"`
}

// Handoff is one leadership transfer a drain asked for.
type Handoff struct {
	Group uint32 `json:"group"`
	To    uint64 `json:"to"`
}

// drain is Drain; it returns the pinned incarnation and what it did.
func (c *Controller) drain(ctx context.Context, id uint64) (*Pinned, *DrainResult, error) {
	if _, err := c.client(id); err != nil {
		return nil, nil, err
	}
	views := c.observe(ctx)
	self := viewOf(views, id)
	if !self.Reachable() {
		return nil, nil, fmt.Errorf("drain node %d: unreachable: %w", id, self.Err)
	}
	if err := c.checkIdentity(id, self.Metrics); err != nil {
		return nil, nil, err
	}
	if err := drainPrecondition(c.m, views, id); err != nil {
		return nil, nil, err
	}
	p, err := c.pin(ctx, id, self.Metrics)
	if err != nil {
		return nil, nil, err
	}
	body, err := p.Do(ctx, http.MethodPost, "/__ursula/leadership-shed/maintenance")
	if err != nil {
		return p, nil, fmt.Errorf("drain node %d: %w", id, err)
	}
	res := &DrainResult{Node: id, Shed: bodyDocument(body), Transfers: []Handoff{}}
	c.printf("node %d: maintenance drain on (%s); %d leaderships to move", id, shedSummary(body), len(self.Metrics.Led(id)))
	if err := c.moveLeaderships(ctx, p, &res.Transfers); err != nil {
		return p, nil, fmt.Errorf("drain node %d: %w", id, err)
	}
	res.Drained = true
	c.printf("node %d: drained: it leads no group", id)
	return p, res, nil
}

// drainPrecondition refuses to drain node id while another node is
// unreachable or unready, or when a group it is a voter of would be left
// without a quorum of ready voters.
func drainPrecondition(m *Manifest, views []*NodeView, id uint64) error {
	for _, v := range views {
		if v.Node.ID != id && !v.IsReady() {
			return abortf("node %d is not ready (%s); refusing to drain node %d", v.Node.ID, v.NotReadyReason(), id)
		}
	}
	self := viewOf(views, id)
	for _, gm := range self.Metrics.Groups {
		if !slices.Contains(gm.Voters, id) {
			continue
		}
		ready := 0
		for _, v := range gm.Voters {
			if nv := viewOf(views, v); v != id && nv != nil && nv.IsReady() {
				ready++
			}
		}
		if ready <= len(gm.Voters)/2 {
			return abortf("group %d would be left without a quorum: voters %s, %d ready without node %d; refusing to drain it",
				gm.GroupID, joinIDs(gm.Voters), ready, id)
		}
	}
	return nil
}

// moveLeaderships hands away every group p's node leads and waits until it
// leads none.
func (c *Controller) moveLeaderships(ctx context.Context, p *Pinned, moved *[]Handoff) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	id := p.Node().ID
	self := c.clients[id]
	prog := c.newProgress(fmt.Sprintf("draining node %d", id), true)
	defer prog.finish()
	asked := map[uint32]time.Time{}
	initial := -1
	var lastErr error
	for {
		m, err := self.Metrics(ctx)
		if err != nil {
			lastErr = err
			if !c.sleep(ctx) {
				return fmt.Errorf("metrics of node %d: %w", id, err)
			}
			continue
		}
		if err := checkSameProcess(p, m); err != nil {
			return err
		}
		led := m.Led(id)
		if initial < 0 {
			initial = len(led)
		}
		prog.set(initial-len(led), initial, fmt.Sprintf("node %d: %d groups still led", id, len(led)))
		if len(led) == 0 {
			return nil
		}
		if slices.ContainsFunc(led, func(g uint32) bool { return time.Since(asked[g]) >= transferRetry }) {
			if err := c.transferRound(ctx, p, m, led, asked, prog, moved); err != nil {
				return err
			}
		}
		if !c.sleep(ctx) {
			msg := fmt.Sprintf("node %d still leads %d groups %s when the wait ended (%v)", id, len(led), joinIDs(led), ctx.Err())
			if lastErr != nil {
				msg += "; last error: " + lastErr.Error()
			}
			return errors.New(msg)
		}
	}
}

// transferRound sends one transfer for each group in led that was not
// asked for within transferRetry, to targets spread by leadership count.
func (c *Controller) transferRound(ctx context.Context, p *Pinned, m *Metrics, led []uint32, asked map[uint32]time.Time, prog *progress, moved *[]Handoff) error {
	id := p.Node().ID
	views := c.observe(ctx)
	sheds := c.shedStates(ctx, id)
	counts := map[uint64]int{}
	for _, g := range m.Groups {
		if g.LeaderID != 0 {
			counts[g.LeaderID]++
		}
	}
	for _, g := range led {
		if time.Since(asked[g]) < transferRetry {
			continue
		}
		gm := m.Group(g)
		eligible, why := eligibleVoters(gm, id, views, sheds, m.ClusterID)
		to := pickTarget(eligible, counts, g)
		if to == 0 {
			return abortf("group %d: no voter may take its leadership from node %d: %s", g, id, summarize(why, 5))
		}
		_, err := p.Do(ctx, http.MethodPost, fmt.Sprintf("/__ursula/raft/%d/leader/transfer/%d", g, to))
		var se *StatusError
		switch {
		case err == nil:
			prog.clear()
			c.printf("node %d: group %d: leadership transfer to node %d", id, g, to)
			*moved = append(*moved, Handoff{Group: g, To: to})
		case errors.Is(err, ErrAborted):
			return err
		case errors.As(err, &se) && se.Status == http.StatusConflict:
			// The group moved meanwhile; the next observation shows where.
		case errors.As(err, &se) && se.Status == http.StatusBadRequest:
			return &abortError{msg: fmt.Sprintf("node %d refused to hand group %d to node %d (not eligible)", id, g, to), cause: err}
		default:
			return err
		}
		asked[g] = time.Now()
		counts[to]++
		counts[id]--
	}
	return nil
}

// shedStates reads GET /__ursula/leadership-shed of every manifest node
// but except; a node that does not answer is left out (not eligible).
func (c *Controller) shedStates(ctx context.Context, except uint64) map[uint64]*ShedState {
	var mu sync.Mutex
	out := map[uint64]*ShedState{}
	var wg sync.WaitGroup
	for _, n := range c.m.Nodes {
		if n.ID == except {
			continue
		}
		wg.Go(func() {
			if s, err := c.clients[n.ID].Shed(ctx); err == nil {
				mu.Lock()
				out[n.ID] = s
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// shedSummary renders a leadership-shed answer for a result line.
func shedSummary(body []byte) string {
	var s struct {
		State                string `json:"state"`
		ShouldAcceptTransfer bool   `json:"should_accept_transfer"`
		ShouldCampaign       bool   `json:"should_campaign"`
	}
	if json.Unmarshal(body, &s) != nil || s.State == "" {
		return "state unknown"
	}
	return fmt.Sprintf("state %s, accepts transfers %t, campaigns %t", s.State, s.ShouldAcceptTransfer, s.ShouldCampaign)
}

// Undrain lifts node id's maintenance drain (DELETE
// /__ursula/leadership-shed/maintenance) with its incarnation pinned from
// one metrics read.
func (c *Controller) Undrain(ctx context.Context, id uint64) error {
	_, err := c.undrain(ctx, id)
	return err
}

// undrain is Undrain; it returns the node's answer (its shed state).
func (c *Controller) undrain(ctx context.Context, id uint64) ([]byte, error) {
	p, _, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("undrain: %w", err)
	}
	body, err := p.Do(ctx, http.MethodDelete, "/__ursula/leadership-shed/maintenance")
	if err != nil {
		return nil, fmt.Errorf("undrain node %d: %w", id, err)
	}
	c.printf("node %d: maintenance drain off (%s)", id, shedSummary(body))
	return body, nil
}

// WaitNode waits, up to Options.Timeout, until node id answers 200 on
// /__ursula/ready, is a voter (not a learner) of every group in the
// membership of the group's leader, and has applied, in every group, up to
// within MaxLag entries of the commit index in the leader's metrics.
func (c *Controller) WaitNode(ctx context.Context, id uint64) error {
	_, err := c.waitNode(ctx, id)
	return err
}

// waitNode is WaitNode; it returns the number of groups.
func (c *Controller) waitNode(ctx context.Context, id uint64) (int, error) {
	if _, err := c.client(id); err != nil {
		return 0, err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	prog := c.newProgress(fmt.Sprintf("waiting for node %d", id), true)
	defer prog.finish()
	last := ""
	for {
		// Leaders first, then the node: its applied index is compared with
		// commit indexes read before it.
		views := c.observe(ctx)
		if v := viewOf(views, id); v.Reachable() {
			v.Metrics, v.Err = c.clients[id].Metrics(ctx)
			if v.Err != nil {
				v.Metrics = nil
			}
		}
		done, total, why := nodeCaughtUp(views, id, c.opts.MaxLag)
		if ctx.Err() != nil && last != "" {
			break // an observation cut short by the deadline says nothing
		}
		last = why
		if why == "" {
			prog.finish()
			c.printf("node %d: ready, a voter of all %d groups and caught up", id, total)
			return total, nil
		}
		prog.set(done, total, fmt.Sprintf("node %d: %s", id, why))
		if !c.sleep(ctx) {
			break
		}
	}
	return 0, fmt.Errorf("wait node %d: not back when the wait ended (%v): %s", id, ctx.Err(), last)
}

// nodeCaughtUp reports how many groups node id is caught up in, of how
// many, and what it still waits for ("" when done).
func nodeCaughtUp(views []*NodeView, id uint64, maxLag uint64) (int, int, string) {
	self := viewOf(views, id)
	if !self.Reachable() {
		return 0, 0, "unreachable: " + self.Err.Error()
	}
	total := groupCount(views)
	if total == 0 {
		return 0, 0, "no group reported yet"
	}
	done := 0
	var first string
	for g := range uint32(total) {
		why := ""
		leader, _ := leaderOf(views, g)
		mine := self.Metrics.Group(g)
		switch {
		case mine == nil:
			why = fmt.Sprintf("group %d not reported by the node", g)
		case leader == 0:
			why = fmt.Sprintf("group %d has no leader", g)
		default:
			lm := viewOf(views, leader).Metrics.Group(g)
			switch {
			case !lm.IsVoter(id):
				why = fmt.Sprintf("group %d: not a voter yet (leader %d: voters %s, learners %s)", g, leader, joinIDs(lm.Voters), joinIDs(lm.Learners))
			case mine.AppliedIndex+maxLag < lm.CommitIndex:
				why = fmt.Sprintf("group %d: applied %d, leader %d committed %d", g, mine.AppliedIndex, leader, lm.CommitIndex)
			}
		}
		if why == "" {
			done++
		} else if first == "" {
			first = why
		}
	}
	if first != "" {
		return done, total, fmt.Sprintf("%d of %d groups caught up; %s", done, total, first)
	}
	if !self.IsReady() {
		return done, total, "not ready: " + self.NotReadyReason()
	}
	return done, total, ""
}
