package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// Cluster is one node's view of the Raft groups and of its peers: it
// proposes (forwarding to a remote leader what must run there), answers
// the cluster plane, and keeps leaderships and memberships healthy.
type Cluster struct {
	cfg      Config
	host     *multiraft.Host
	machines []*stream.Machine
	// historyProposals holds the groups whose new history this node is
	// proposing as a recovery plan's leader (plan.go).
	historyProposals sync.Map
	net              Network // nil on a single node
	logger           *slog.Logger
	now              func() time.Time

	rejoined sync.Map // group → leader id: joined with a vote floor, awaiting rebuild
	rebuilds sync.Map // rebuildKey → true: replicas to remove and add back
	// commitStalls counts watchdog interventions.
	commitStalls atomic.Uint64
	// gates runs the openers of the recovery gates (gate.go).
	gates gates
	// installRaised is closed once a fresh install's groups are at the
	// release's feature level, or no raise is due (init.go).
	installRaised chan struct{}
}

// New builds the cluster side of a node over its Raft host and state
// machines, and attaches net (nil on a single node) to it. It starts
// nothing.
func New(cfg Config, host *multiraft.Host, machines []*stream.Machine, net Network, now func() time.Time, logger *slog.Logger) (*Cluster, error) {
	cfg.setDefaults()
	if cfg.MultiNode() && net == nil {
		return nil, errors.New("cluster: a multi-node cluster needs a network")
	}
	if now == nil {
		now = time.Now
	}
	c := &Cluster{cfg: cfg, host: host, machines: machines, net: net, logger: logger, now: now, installRaised: make(chan struct{})}
	if cfg.DataDir != "" {
		c.restoreMaintenanceDrain()
	}
	if net != nil {
		// The network and the node need each other: the Raft host
		// sends through the network (it was built with it), and the
		// network delivers peers' messages and calls here. This is
		// where that cycle closes, once.
		net.Attach(c)
	}
	return c, nil
}

// Run runs the cluster's work until ctx ends: the network, the startup
// initializer of groups without state, and the leadership upkeep. A
// failure of the network ends it with an error.
func (c *Cluster) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	netErr := make(chan error, 1)
	if c.net != nil {
		wg.Go(func() {
			if err := c.net.Run(ctx); err != nil && ctx.Err() == nil {
				netErr <- fmt.Errorf("cluster network: %w", err)
				cancel()
			}
		})
	}
	wg.Go(func() {
		fresh, err := c.initializeGroups(ctx)
		fresh = fresh || c.host.BootstrappedAll()
		switch {
		case err != nil && ctx.Err() == nil:
			c.logger.Error("group initializer stopped", "err", err)
		case fresh:
			c.raiseAtInstall(ctx)
			return
		}
		close(c.installRaised)
	})
	wg.Go(func() { c.leadershipLoop(ctx) })
	<-ctx.Done()
	wg.Wait()
	select {
	case err := <-netErr:
		return err
	default:
		return nil
	}
}

// GroupCount is the number of Raft groups.
func (c *Cluster) GroupCount() int { return len(c.machines) }

// Machine is group g's state machine on this node (read it; apply goes
// through Propose).
func (c *Cluster) Machine(g uint32) *stream.Machine { return c.machines[g] }

// Status is group g's Raft status on this node.
func (c *Cluster) Status(g uint32) multiraft.GroupStatus { return c.host.Status(g) }

// LeadsLive reports whether this node leads group g with a quorum that
// answered it within the last 3 seconds.
func (c *Cluster) LeadsLive(ctx context.Context, g uint32) bool {
	live, err := c.host.LeadsLive(ctx, g)
	return err == nil && live
}

// MultiNode reports a cluster of more than one voter.
func (c *Cluster) MultiNode() bool { return c.cfg.MultiNode() }

// NodeID is this node's id.
func (c *Cluster) NodeID() uint64 { return c.cfg.NodeID }

// Voters are the configured voters.
func (c *Cluster) Voters() []uint64 { return c.cfg.Voters() }

// Peers are the configured voters with their addresses.
func (c *Cluster) Peers() []Peer { return c.cfg.Peers }

// Leads reports whether this node answers for the tail of group g: a
// single node always; in a cluster only the group's leader.
func (c *Cluster) Leads(g uint32) bool {
	return !c.MultiNode() || c.host.Status(g).IsLeader
}

// NotLeader is the answer of a node that must not serve a request of
// group g: it names the leader it knows of.
func (c *Cluster) NotLeader(g uint32) error {
	return notLeader(c.host.Status(g).LeaderID, "this node does not lead the group; ask its leader")
}

func notLeader(leader uint64, msg string) error {
	fe := fault.Errorf(fault.ErrNotLeader, "%s", msg).With(fault.DetailRetryAfterMS, "200")
	if leader != 0 {
		fe.With(fault.DetailLeaderID, strconv.FormatUint(leader, 10))
	}
	return fe
}

// forwardable returns the leader to forward cmd to after Propose failed
// with err, or 0 when it is not forwarded. It is apart from Propose so that
// the error target errors.As needs is allocated on failures only.
func forwardable(err error, g uint32, cmd *storagev1.Command) uint64 {
	var nl *multiraft.NotLeaderError
	if errors.As(err, &nl) && nl.LeaderID != 0 && forwardRequest(g, cmd) != nil {
		return nl.LeaderID
	}
	return 0
}

// WaitApplied waits until this node's replica of g applied index.
func (c *Cluster) WaitApplied(ctx context.Context, g uint32, index uint64) error {
	if err := c.host.WaitApplied(ctx, g, index); err != nil {
		return raftError(err)
	}
	return nil
}

// Propose replicates cmd through group g and returns its applied result;
// a command the state machine rejected returns its error together with the
// result. Commands the node issues on its own behalf in a group it may not
// lead (forwardable) run on the group's remote leader.
func (c *Cluster) Propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error) {
	cmd.NowMs = c.now().UnixMilli()
	// Marshalled straight into the log entry's buffer (no second copy).
	out, err := c.host.ProposeEncoded(ctx, g, proto.Size(cmd), func(dst []byte) ([]byte, error) {
		// The Size call above filled the cache UseCachedSize reads.
		b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(dst, cmd)
		if err != nil {
			return nil, fmt.Errorf("cluster: encode command: %w", err)
		}
		return b, nil
	})
	var res *stream.Result
	switch {
	case err == nil:
		var ok bool
		if res, ok = out.(*stream.Result); !ok {
			return nil, fault.Errorf(fault.ErrInternal, "unexpected apply result %T", out)
		}
	case forwardable(err, g, cmd) != 0:
		if res, err = c.forward(ctx, forwardable(err, g, cmd), forwardRequest(g, cmd)); err != nil {
			return nil, err
		}
	default:
		return nil, raftError(err)
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// WaitReady blocks until every group has a leader, a fresh install's
// feature level is raised (init.go), and every group this node leads has
// applied its whole log: a barrier entry proposed in the leader's term
// applies only after every entry before it.
func (c *Cluster) WaitReady(ctx context.Context) error {
	if err := c.host.WaitReady(ctx); err != nil {
		return err
	}
	select {
	case <-c.installRaised:
	case <-ctx.Done():
		return ctx.Err()
	}
	for g := range c.machines {
		for c.host.Status(uint32(g)).IsLeader {
			changed := c.host.StatusChanged()
			_, err := c.Propose(ctx, uint32(g), &storagev1.Command{Op: &storagev1.Command_Barrier{Barrier: &storagev1.Barrier{}}})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Refused while leadership moves (a transfer, a new term):
			// look again once something changes.
			select {
			case <-changed:
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// raftError is the one translation of the Raft host's errors into the
// storage vocabulary, for proposals and the admin API alike.
func raftError(err error) error {
	var nl *multiraft.NotLeaderError
	switch {
	case err == nil:
		return nil
	case fault.KindOf(err) != nil:
		return err
	case errors.As(err, &nl):
		return notLeader(nl.LeaderID, "not the leader of this group")
	case errors.Is(err, multiraft.ErrOutcomeUnknown):
		return fault.Errorf(fault.ErrOutcomeUnknown, "leadership changed after the write was proposed; it may or may not have been applied")
	case errors.Is(err, multiraft.ErrNotVoter):
		return fault.Errorf(fault.ErrNotAVoter, "%v", err)
	case errors.Is(err, multiraft.ErrPlanHeld):
		return fault.Errorf(fault.ErrTransferTargetNotEligible, "%v: leadership stays until it applied", err)
	case errors.Is(err, multiraft.ErrSnapshotFailed):
		return fault.Errorf(fault.ErrInternal, "%v", err)
	case errors.Is(err, multiraft.ErrUnknownGroup):
		return fault.Errorf(fault.ErrInvalidArgument, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	default:
		// Stopped, a dropped proposal, a request the shard worker did not
		// start in time, a refused membership change: retry later.
		return fault.Errorf(fault.ErrUnavailable, "%v", err).With(fault.DetailRetryAfterMS, "1000")
	}
}

// confChange is a one-step membership change.
func confChange(t pb.ConfChangeType, node uint64) *pb.ConfChangeV2 {
	return &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: t.Enum(), NodeId: proto.Uint64(node)}}}
}

// ProbeAnswer reports this node's state of groups to a probing peer
// (Local).
func (c *Cluster) ProbeAnswer(groups []uint32) []*raftv1.ProbeResponse_GroupState {
	out := make([]*raftv1.ProbeResponse_GroupState, 0, len(groups))
	for _, g := range groups {
		if int(g) >= len(c.machines) {
			continue
		}
		st := c.host.Status(g)
		out = append(out, &raftv1.ProbeResponse_GroupState{GroupId: g, HasState: st.HasState, LeaderId: st.LeaderID, Term: st.Term})
	}
	return out
}

// Step, ReportUnreachable and ReportSnapshot hand the Raft messages and
// reports a network received to the host (Local).
func (c *Cluster) Step(g uint32, m *pb.Message) error { return c.host.Step(g, m) }

// ReportUnreachable implements Local.
func (c *Cluster) ReportUnreachable(g uint32, to uint64) error {
	return c.host.ReportUnreachable(g, to)
}

// ReportSnapshot implements Local.
func (c *Cluster) ReportSnapshot(g uint32, to uint64, failed bool) error {
	return c.host.ReportSnapshot(g, to, failed)
}
