package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// Feature levels (storage/stream, "Feature levels"): the level lives in
// every group's replicated state, raised by a SetFeatureLevel entry in each
// group, so that a group's log orders the raise before every command it
// turns on. This file asks peers what they support, raises the level, and
// answers the peers' questions.

// peerLevelTimeout bounds one peer's answer to GetFeatureLevel.
const peerLevelTimeout = 3 * time.Second

// NodeFeatureLevel is what one node answered about feature levels.
type NodeFeatureLevel struct {
	NodeID uint64
	// MaxLevel is the highest level the node's build knows (0 when Err).
	MaxLevel uint32
	// GroupLevels[g] is the level of the node's replica of group g.
	GroupLevels []uint32
	// HaltedGroups are groups the node stopped applying.
	HaltedGroups []uint32
	// Err is why the node did not answer (nil when it did).
	Err error
}

// FeatureLevelRefusal is a raise that some node cannot take: it runs a
// build that does not know the level, or did not answer. Nothing was
// proposed.
type FeatureLevelRefusal struct {
	Level uint32
	// Nodes are the nodes that refuse, by node id.
	Nodes []NodeFeatureLevel
}

func (e *FeatureLevelRefusal) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "feature level %d is not known to every voter, nothing was raised:", e.Level)
	for i, n := range e.Nodes {
		if i > 0 {
			b.WriteString(";")
		}
		if n.Err != nil {
			fmt.Fprintf(&b, " node %d did not answer (%v)", n.NodeID, n.Err)
		} else {
			fmt.Fprintf(&b, " node %d knows levels up to %d", n.NodeID, n.MaxLevel)
		}
	}
	return b.String()
}

// Unwrap makes the refusal a FEATURE_LEVEL_UNSUPPORTED error.
func (e *FeatureLevelRefusal) Unwrap() error { return fault.ErrFeatureLevelUnsupported }

// LocalFeatureLevel is this node's answer: its build's highest level, its
// replicas' levels and the groups it halted.
func (c *Cluster) LocalFeatureLevel() NodeFeatureLevel {
	n := NodeFeatureLevel{NodeID: c.cfg.NodeID, MaxLevel: stream.MaxFeatureLevel, GroupLevels: make([]uint32, len(c.machines))}
	for g, m := range c.machines {
		n.GroupLevels[g] = m.FeatureLevel()
		if c.host.Status(uint32(g)).Halted != nil {
			n.HaltedGroups = append(n.HaltedGroups, uint32(g))
		}
	}
	return n
}

// FeatureLevelAnswer answers a peer's GetFeatureLevel (Local).
func (c *Cluster) FeatureLevelAnswer() *raftv1.GetFeatureLevelResponse {
	n := c.LocalFeatureLevel()
	return &raftv1.GetFeatureLevelResponse{MaxLevel: n.MaxLevel, GroupLevels: n.GroupLevels, HaltedGroups: n.HaltedGroups}
}

// Members are the nodes a raise must ask: the configured voters and every
// voter or learner of any group as this node knows it, sorted.
func (c *Cluster) Members() []uint64 {
	ids := slices.Clone(c.cfg.Voters())
	for g := range c.machines {
		st := c.host.Status(uint32(g))
		ids = append(ids, st.Voters...)
		ids = append(ids, st.Learners...)
		ids = append(ids, st.VotersOutgoing...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// FeatureLevels asks every member (Members) about feature levels: this
// node answers itself, the others over the cluster plane (each within
// peerLevelTimeout; a node that does not answer has Err set).
func (c *Cluster) FeatureLevels(ctx context.Context) []NodeFeatureLevel {
	members := c.Members()
	out := make([]NodeFeatureLevel, len(members))
	done := make(chan struct{}, len(members))
	for i, id := range members {
		if id == c.cfg.NodeID {
			out[i] = c.LocalFeatureLevel()
			done <- struct{}{}
			continue
		}
		go func() {
			defer func() { done <- struct{}{} }()
			out[i] = NodeFeatureLevel{NodeID: id}
			if c.net == nil {
				out[i].Err = fault.Errorf(fault.ErrUnavailable, "no cluster plane to reach node %d", id)
				return
			}
			pctx, cancel := context.WithTimeout(ctx, peerLevelTimeout)
			defer cancel()
			resp, err := c.net.FeatureLevel(pctx, id)
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].MaxLevel, out[i].GroupLevels, out[i].HaltedGroups = resp.GetMaxLevel(), resp.GetGroupLevels(), resp.GetHaltedGroups()
		}()
	}
	for range members {
		<-done
	}
	return out
}

// RaiseFeatureLevel raises every group to level, after every member
// (Members) answered that its build knows the level: otherwise it proposes
// nothing and returns a *FeatureLevelRefusal naming the nodes that do not
// (or did not answer). Each group's raise is a SetFeatureLevel entry,
// proposed through the group's leader (forwarded when another node leads
// it); a group already at level or above changes nothing, so a raise that
// failed part way is completed by running it again. It returns the groups
// it raised (not those already there).
func (c *Cluster) RaiseFeatureLevel(ctx context.Context, level uint32) ([]uint32, error) {
	if level < stream.BaselineFeatureLevel {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "feature levels start at %d", stream.BaselineFeatureLevel)
	}
	refusal := &FeatureLevelRefusal{Level: level}
	for _, n := range c.FeatureLevels(ctx) {
		if n.Err != nil || n.MaxLevel < level {
			refusal.Nodes = append(refusal.Nodes, n)
		}
	}
	if len(refusal.Nodes) > 0 {
		return nil, refusal
	}
	var raised []uint32
	var failed []string
	var firstErr error
	for g := range c.machines {
		res, err := c.Propose(ctx, uint32(g), &storagev1.Command{Op: &storagev1.Command_SetFeatureLevel{SetFeatureLevel: &storagev1.SetFeatureLevel{Level: level}}})
		switch {
		case err == nil && !res.Duplicate:
			raised = append(raised, uint32(g))
		case err == nil:
		default:
			failed = append(failed, fmt.Sprintf("group %d: %v", g, err))
			if firstErr == nil {
				firstErr = err
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(failed) > 0 {
		c.logger.Warn("feature level raise incomplete", "level", level, "raised", len(raised), "failed", len(failed))
		k := fault.KindOf(firstErr)
		if k == nil {
			k = fault.ErrUnavailable
		}
		return raised, fault.Errorf(k, "feature level %d: %d of %d groups not raised (run the raise again): %s", level, len(failed), len(c.machines), strings.Join(failed, "; "))
	}
	c.logger.Info("raised the feature level", "level", level, "groups_raised", len(raised))
	return raised, nil
}

// RequireFeatureLevel refuses (FEATURE_LEVEL_UNSUPPORTED) an operation
// that needs level in group g while this node's replica of g is below it.
// A leader asks before proposing a gated command.
func (c *Cluster) RequireFeatureLevel(g uint32, level uint32, what string) error {
	if err := c.checkGroup(g); err != nil {
		return err
	}
	if err := c.machines[g].RequireFeatureLevel(level, what); err != nil {
		return err
	}
	return nil
}
