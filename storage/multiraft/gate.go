package multiraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
)

// The recovery gate. A replica that may have lost the unsynced tail of its
// journal (a crash under fsync "never", or a damaged final frame) may have
// lost entries it acknowledged, and its hard state (its vote) may have gone
// back too. Until it has applied a fresh barrier of the group's leader it
// must not help elect anyone: a gated group does not tick (so it never
// campaigns), does not campaign at start, drops vote and pre-vote requests
// and leadership-transfer orders, and still takes appends from a leader.
// The gated set is recorded in <logDir>/recovery_gates before the node
// serves, so a restart keeps it; OpenGate removes a group once the cluster
// side has seen the barrier applied.

// gatesFile lists the gated groups: magic, u32 count, u32 group ids,
// u32 CRC-32C of the rest.
const gatesFile = "recovery_gates"

var gatesMagic = []byte("URSGATE\x00")

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// ErrGateFile reports a recovery_gates file that does not decode.
var ErrGateFile = errors.New("multiraft: recovery_gates is damaged")

func readGates(fsys wal.FS, logDir string) (map[uint32]bool, error) {
	path := filepath.Join(logDir, gatesFile)
	b, err := wal.ReadFile(fsys, path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[uint32]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("multiraft: read %s: %w", path, err)
	}
	if len(b) < 16 || string(b[:8]) != string(gatesMagic) ||
		crc32.Checksum(b[:len(b)-4], crc32c) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, fmt.Errorf("%w: %s", ErrGateFile, path)
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if len(b) != 12+4*n+4 {
		return nil, fmt.Errorf("%w: %s", ErrGateFile, path)
	}
	out := make(map[uint32]bool, n)
	for i := range n {
		out[binary.LittleEndian.Uint32(b[12+4*i:])] = true
	}
	return out, nil
}

func writeGates(fsys wal.FS, logDir string, gated map[uint32]bool) error {
	ids := make([]uint32, 0, len(gated))
	for g := range gated {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	b := append([]byte(nil), gatesMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, g := range ids {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32c))
	return wal.WriteFileAtomic(fsys, logDir, filepath.Join(logDir, gatesFile), b)
}

// gateAfterRecovery decides, once every journal was recovered and before
// anything is written, which groups go behind the gate: those recorded in
// the gate file, and, in a cluster of several voters, every group holding
// state after a crash under fsync "never" (its unsynced tail may be gone)
// and every group of a shard whose recovery cut a damaged complete frame.
// The new set is recorded before the node serves.
func (h *Host) gateAfterRecovery(logDir string, crashed bool) error {
	gated, err := readGates(h.cfg.FS, logDir)
	if err != nil {
		return err
	}
	before := len(gated)
	if len(h.cfg.Voters) > 1 {
		for _, s := range h.shards {
			lost := s.journal.DamagedTail() || (crashed && h.cfg.Fsync == FsyncNever)
			for _, g := range s.groups {
				if lost && g.recovered {
					gated[g.id] = true
				}
			}
		}
	}
	if len(gated) != before {
		if err := writeGates(h.cfg.FS, logDir, gated); err != nil {
			return fmt.Errorf("multiraft: record the recovery gates: %w", err)
		}
		h.logger.Warn("the previous run may have lost the unsynced tail of its journals: groups stay behind the recovery gate until they apply a barrier of their leader",
			"gated_groups", len(gated), "fsync", h.cfg.Fsync)
	}
	for g := range gated {
		if int(g) < len(h.groups) && h.groups[g] != nil {
			h.groups[g].gated = true
			h.groups[g].updateStatus()
		}
	}
	h.gated = gated
	return nil
}

// gatedMessage reports the messages a gated replica drops: it elects no
// one and takes no leadership.
func gatedMessage(t pb.MessageType) bool {
	switch t {
	case pb.MessageType_MsgVote, pb.MessageType_MsgPreVote, pb.MessageType_MsgTimeoutNow:
		return true
	}
	return false
}

// checkHeartbeat guards a follower against a leader that believes it holds
// more than it does: a heartbeat carries min(the follower's match, the
// commit index), and a follower whose log lost acknowledged entries (a
// lost tail) would be told to commit past its last index, which Raft
// treats as a corrupted log and panics on. The commit is clamped to the
// last index (a follower never commits what it does not hold), and the
// replica is marked as having lost entries, so that it asks its leader
// for a rebuild (only a fresh progress, through a membership change, makes
// the leader send the lost entries again).
func (g *group) checkHeartbeat(m *pb.Message) {
	last, _ := g.st.LastIndex()
	if m.GetCommit() <= last {
		return
	}
	if !g.lostEntries {
		g.lostEntries = true
		g.logger.Warn("the leader's heartbeat commits past this replica's log: it lost entries it had acknowledged; asking for a rebuild",
			"leader", m.GetFrom(), "commit", m.GetCommit(), "last_index", last)
		defer g.updateStatus()
	}
	m.Commit = &last
}

// GateDropped counts the vote, pre-vote and transfer messages gated groups
// dropped.
func (h *Host) GateDropped() uint64 { return h.gateDropped.Load() }

// Gated lists the groups behind the recovery gate.
func (h *Host) Gated() []uint32 {
	h.gateMu.Lock()
	defer h.gateMu.Unlock()
	out := make([]uint32, 0, len(h.gated))
	for g := range h.gated {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// OpenGate opens group groupID's recovery gate: the caller has seen the
// replica apply a barrier of its leader taken after this node started (a
// read index the leader confirmed with a quorum, and the leader's last
// index), so it holds every entry committed before (the leader's own log
// supplied those it lost), and may vote and campaign again. The gate file is
// rewritten first; a failure leaves the group gated.
func (h *Host) OpenGate(ctx context.Context, groupID uint32) error {
	h.gateMu.Lock()
	if !h.gated[groupID] {
		h.gateMu.Unlock()
		return nil
	}
	next := make(map[uint32]bool, len(h.gated))
	for g := range h.gated {
		if g != groupID {
			next[g] = true
		}
	}
	if err := writeGates(h.cfg.FS, wal.LogDir(h.cfg.Dir), next); err != nil {
		h.gateMu.Unlock()
		return fmt.Errorf("multiraft: open the recovery gate of group %d: %w", groupID, err)
	}
	h.gated = next
	h.gateMu.Unlock()
	return h.do(ctx, groupID, func(g *group) error {
		g.gated = false
		g.updateStatus()
		g.logger.Info("recovery gate opened: the replica applied its leader's barrier")
		return nil
	})
}

// overwritesCommitted guards a replica whose committed entries a recovery
// plan replaced (it was down, or no plan reached it, while the others
// started a new history below its commit marker): the new leader's appends
// would replace entries at or below its commit index, which Raft treats as
// a corrupted log and panics on. The append is refused instead, and the
// replica waits for an operator to rejoin its node as a wiped one.
//
// A message of an earlier term is not one: Raft drops it (a deposed
// leader's appends, delivered after a newer leader committed other entries
// at those indexes, are the common case under load and were reported as
// overwrites).
func (g *group) overwritesCommitted(m *pb.Message) bool {
	st := g.rn.BasicStatus()
	if m.GetTerm() < st.GetTerm() {
		return false
	}
	commit := st.GetCommit()
	for _, e := range m.GetEntries() {
		if e.GetIndex() > commit {
			break
		}
		if t, err := g.st.Term(e.GetIndex()); err == nil && t != e.GetTerm() {
			if !g.committedOverwrite {
				g.committedOverwrite = true
				g.logger.Error("CommittedOverwrite: refusing the leader's appends, which replace entries this replica knows committed; the group's history was replaced (a recovery plan that did not reach this replica): rejoin this node as a wiped node",
					"leader", m.GetFrom(), "message_term", m.GetTerm(), "index", e.GetIndex(), "term", t, "leader_term", e.GetTerm(), "commit", commit)
			}
			return true
		}
	}
	return false
}
