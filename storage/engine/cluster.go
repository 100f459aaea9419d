package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// Transport carries Raft messages to peers (storage/transport implements
// it). The engine hands it to multiraft once set.
type Transport interface {
	Send(groupID uint32, msgs []*pb.Message)
}

// Forwarder runs an encoded command on the leader of a group this node does
// not lead, over the cluster plane.
type Forwarder interface {
	Forward(ctx context.Context, leaderID uint64, groupID uint32, cmd []byte) (*storagev1.ApplyResult, error)
}

// Prober asks a peer about the state of groups.
type Prober interface {
	Probe(ctx context.Context, peerID uint64, groups []uint32) (*raftv1.ProbeResponse, error)
}

// Rebuilder asks a group's leader to rebuild this replica.
type Rebuilder interface {
	RequestRebuild(ctx context.Context, leaderID uint64, groupID uint32, nodeID uint64) (bool, error)
}

// ClusterDeps connects the engine to its peers.
type ClusterDeps struct {
	Transport Transport
	Forwarder Forwarder
	Prober    Prober
	Rebuilder Rebuilder
}

// SetCluster connects the engine to its peers; call it before Run.
func (e *Engine) SetCluster(d ClusterDeps) { e.cluster.Store(&d) }

// Send implements multiraft.Transport by handing messages to the
// configured transport (dropped until one is set).
func (e *Engine) Send(groupID uint32, msgs []*pb.Message) {
	if d := e.cluster.Load(); d != nil && d.Transport != nil {
		d.Transport.Send(groupID, msgs)
	}
}

func (e *Engine) multiNode() bool { return len(e.cfg.Peers) > 1 }

// clusterIDFile binds the WAL to a cluster id.
func clusterIDFile(dataDir string) string { return filepath.Join(dataDir, "raft-log", "cluster_id") }

// checkClusterID records the cluster id at first start and refuses a WAL
// that holds another.
func checkClusterID(dataDir, id string) error {
	path := clusterIDFile(dataDir)
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(lines) != 3 || lines[0] != "ursula-cluster-id v1" {
			return fmt.Errorf("engine: %s is damaged", path)
		}
		if sum := strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(lines[1]))), 16); sum != lines[2] {
			return fmt.Errorf("engine: %s fails its checksum", path)
		}
		if lines[1] != id {
			return fmt.Errorf("engine: the WAL in %s belongs to cluster %q, not the configured server.cluster_id %q; give this node an empty data directory to join %q", dataDir, lines[1], id, id)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		body := fmt.Sprintf("ursula-cluster-id v1\n%s\n%s\n", id, strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(id))), 16))
		tmp := path + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("engine: record cluster id: %w", err)
		}
		if _, err := f.WriteString(body); err != nil {
			f.Close()
			return fmt.Errorf("engine: record cluster id: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("engine: record cluster id: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("engine: record cluster id: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("engine: record cluster id: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("engine: read cluster id: %w", err)
	}
}

// ProbeAnswer reports this node's state of groups to a probing peer.
func (e *Engine) ProbeAnswer(groups []uint32) []*raftv1.ProbeResponse_GroupState {
	out := make([]*raftv1.ProbeResponse_GroupState, 0, len(groups))
	for _, g := range groups {
		if int(g) >= len(e.machines) {
			continue
		}
		st := e.host.Status(g)
		out = append(out, &raftv1.ProbeResponse_GroupState{GroupId: g, HasState: st.HasState, LeaderId: st.LeaderID, Term: st.Term})
	}
	return out
}

// initializeGroups brings every group without state into the cluster: it
// initializes a group only when every other configured voter answers that
// it holds nothing and sees no leader; when the group exists elsewhere it
// waits until a quorum of the other voters report the same leader and term,
// and records that as its vote floor (a wiped replica).
func (e *Engine) initializeGroups(ctx context.Context) error {
	voters := e.cfg.Voters()
	quorum := len(voters)/2 + 1
	waitingLogged := false
	for {
		var pending []uint32
		for g := range e.machines {
			if !e.host.Status(uint32(g)).HasState {
				pending = append(pending, uint32(g))
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if len(voters) == 1 {
			for _, g := range pending {
				if err := e.host.Bootstrap(ctx, g); err != nil && !errors.Is(err, multiraft.ErrHasState) {
					return err
				}
			}
			continue
		}
		d := e.cluster.Load()
		if d == nil || d.Prober == nil {
			return errors.New("engine: a multi-node cluster needs a prober")
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
			if peer == e.cfg.NodeID {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := d.Prober.Probe(pctx, peer, pending)
			cancel()
			if err != nil {
				continue
			}
			for _, gs := range resp.GetGroups() {
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
				if gs.GetLeaderId() != 0 && gs.GetLeaderId() != e.cfg.NodeID {
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
				if err := e.host.Bootstrap(ctx, g); err != nil && !errors.Is(err, multiraft.ErrHasState) {
					return err
				}
			case r.empty < r.answered:
				for lt, n := range r.leaders {
					if n >= quorum {
						e.logger.Warn("group exists on the other voters: joining with a vote floor", "group_id", g, "leader_id", lt[0], "term", lt[1])
						if err := e.host.SetVoteFloor(ctx, g, lt[1], lt[0]); err != nil && !errors.Is(err, multiraft.ErrHasState) {
							return err
						}
						e.rejoined.Store(g, lt[0])
						break
					}
				}
			}
		}
		if !waitingLogged {
			e.logger.Info("waits for every voter before initializing", "groups", len(pending))
			waitingLogged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// forward runs cmd on the group's remote leader.
func (e *Engine) forward(ctx context.Context, leader uint64, g uint32, cmd *storagev1.Command) (*stream.Result, error) {
	d := e.cluster.Load()
	if d == nil || d.Forwarder == nil || leader == 0 || leader == e.cfg.NodeID {
		return nil, errcode.New(errcode.Unavailable, "group %d has no reachable leader", g).With(errcode.KeyRetryAfterMS, "500")
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	ar, err := d.Forwarder.Forward(ctx, leader, g, data)
	if err != nil {
		return nil, err
	}
	return stream.DecodeResult(ar), nil
}

// ProposeForwarded applies a command forwarded by a peer on this node, the
// group's leader. Fork releases are left to the forwarding node.
func (e *Engine) ProposeForwarded(ctx context.Context, g uint32, data []byte) (*storagev1.ApplyResult, error) {
	if int(g) >= len(e.machines) {
		return nil, errcode.New(errcode.InvalidArgument, "group %d out of range", g)
	}
	out, err := e.host.Propose(ctx, g, data)
	if err != nil {
		return nil, raftError(err)
	}
	res, ok := out.(*stream.Result)
	if !ok {
		return nil, errcode.New(errcode.Internal, "unexpected apply result %T", out)
	}
	return stream.EncodeResult(res), nil
}

// syncGroup makes this node's replica of group g at least as current as the
// group's leader was when called (a read barrier): on a follower it runs a
// barrier on the leader and waits until the local replica applied it.
func (e *Engine) syncGroup(ctx context.Context, g uint32) error {
	if !e.multiNode() || e.host.Status(g).IsLeader {
		return nil
	}
	leader := e.host.Status(g).LeaderID
	res, err := e.forward(ctx, leader, g, &storagev1.Command{NowMs: e.nowMs(), Op: &storagev1.Command_Barrier{Barrier: &storagev1.Barrier{}}})
	if err != nil {
		return err
	}
	return e.waitApplied(ctx, g, res.Index)
}

// waitApplied waits until the local replica of g applied index.
func (e *Engine) waitApplied(ctx context.Context, g uint32, index uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for e.machines[g].Applied() < index {
		select {
		case <-ctx.Done():
			return errcode.New(errcode.Unavailable, "replica of group %d is behind its leader", g).With(errcode.KeyRetryAfterMS, "500")
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}
