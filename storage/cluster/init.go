package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// initializeGroups brings every group without state into the cluster: it
// initializes a group only when every other configured voter answers that
// it holds nothing and sees no leader; when the group exists elsewhere it
// waits until a quorum of the other voters report the same leader and term,
// and records that as its vote floor (a wiped replica).
//
// It reports whether this node initialized every group (a fresh install).
func (c *Cluster) initializeGroups(ctx context.Context) (fresh bool, err error) {
	voters := c.cfg.Voters()
	quorum := len(voters)/2 + 1
	waitingLogged := false
	initialized := 0
	for {
		var pending []uint32
		for g := range c.machines {
			if !c.host.Status(uint32(g)).HasState {
				pending = append(pending, uint32(g))
			}
		}
		if len(pending) == 0 {
			return initialized == len(c.machines), nil
		}
		if len(voters) == 1 {
			for _, g := range pending {
				if err := c.host.Bootstrap(ctx, g); err != nil && !errors.Is(err, multiraft.ErrHasState) {
					return false, err
				} else if err == nil {
					initialized++
				}
			}
			continue
		}
		type report struct {
			answered int
			empty    int
			// fresh counts peers that hold only the initial membership: they
			// initialized (term 1) but no election has completed anywhere.
			fresh   int
			leaders map[[2]uint64]int // (leader, term) → peers reporting it
		}
		reports := make(map[uint32]*report, len(pending))
		for _, g := range pending {
			reports[g] = &report{leaders: map[[2]uint64]int{}}
		}
		for _, peer := range voters {
			if peer == c.cfg.NodeID {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			states, err := c.net.Probe(pctx, peer, pending)
			cancel()
			if err != nil {
				continue
			}
			for _, gs := range states {
				r := reports[gs.GetGroupId()]
				if r == nil {
					continue
				}
				r.answered++
				if !gs.GetHasState() && gs.GetLeaderId() == 0 {
					r.empty++
				} else if gs.GetLeaderId() == 0 && gs.GetTerm() <= 1 {
					r.fresh++
				}
				if gs.GetLeaderId() != 0 && gs.GetLeaderId() != c.cfg.NodeID {
					r.leaders[[2]uint64{gs.GetLeaderId(), gs.GetTerm()}]++
				}
			}
		}
		others := len(voters) - 1
		for _, g := range pending {
			r := reports[g]
			switch {
			case r.answered == others && r.empty+r.fresh == others && len(r.leaders) == 0:
				// Every other voter is empty or holds only the initial
				// membership this node would write too: a fresh install.
				if err := c.host.Bootstrap(ctx, g); err != nil && !errors.Is(err, multiraft.ErrHasState) {
					return false, err
				} else if err == nil {
					initialized++
				}
			case r.empty < r.answered:
				for lt, n := range r.leaders {
					if n >= quorum {
						c.logger.Warn("group exists on the other voters: joining with a vote floor", "group_id", g, "leader_id", lt[0], "term", lt[1])
						if err := c.host.SetVoteFloor(ctx, g, lt[1], lt[0]); err != nil && !errors.Is(err, multiraft.ErrHasState) {
							return false, err
						}
						c.rejoined.Store(g, lt[0])
						break
					}
				}
			}
		}
		if !waitingLogged {
			c.logger.Info("waits for every voter before initializing", "groups", len(pending))
			waitingLogged = true
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// raiseAtInstall raises a fresh install's groups to the release's feature
// level (stream.ReleaseFeatureLevel): nothing older has to apply them.
// Every node that initialized every group tries, until the raise completes
// (it needs every member to answer that it knows the level: a mixed-release
// install stays at the baseline until an operator raises it, which the
// log says). A node that stops before it is done leaves the groups below
// until the operator raises them (ursulactl cluster enable-feature).
func (c *Cluster) raiseAtInstall(ctx context.Context) {
	defer close(c.installRaised)
	for attempt := 0; ; attempt++ {
		_, err := c.RaiseFeatureLevel(ctx, stream.ReleaseFeatureLevel)
		if err == nil || ctx.Err() != nil {
			return
		}
		var refusal *FeatureLevelRefusal
		if errors.As(err, &refusal) && attempt >= 50 {
			c.logger.Warn("a fresh install stays at the baseline feature level: raise it once every node runs this release",
				"level", stream.ReleaseFeatureLevel, "err", err)
			return
		}
		c.logger.Debug("raising a fresh install's feature level", "level", stream.ReleaseFeatureLevel, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}
