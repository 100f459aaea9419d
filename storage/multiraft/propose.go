package multiraft

import (
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
)

// A shard worker proposes the proposals of one mailbox batch to each group
// together, as one raft MsgProp of several entries, instead of one
// Propose per entry. Raft appends them at once and sends each follower
// one MsgApp carrying all of them (or nothing new, when the follower's
// pipeline is full): under load, where a batch holds tens of proposals
// per group, that is one message per follower and one answer back
// instead of tens, each decoded, stepped and answered by the follower.
// The entries and their order are the same as one Propose each.

// proposeBatch proposes g's batched proposals.
func (s *shard) proposeBatch(g *group) {
	batch := g.batch
	g.batch = g.batch[:0]
	if len(batch) == 0 {
		return
	}
	if g.halted != nil {
		err := fmt.Errorf("%w: %v", ErrGroupHalted, g.halted)
		for _, p := range batch {
			p.finish(nil, err)
		}
		clear(batch)
		return
	}
	ents := make([]pb.Entry, len(batch))
	ptrs := make([]*pb.Entry, len(batch))
	for i, p := range batch {
		ents[i].Data = p.data
		ptrs[i] = &ents[i]
	}
	from := s.h.cfg.NodeID
	if err := g.rn.Step(&pb.Message{Type: pb.MessageType_MsgProp.Enum(), From: &from, Entries: ptrs}); err != nil {
		for _, p := range batch {
			if !g.holdDuringTransfer(p) {
				p.finish(nil, fmt.Errorf("%w: %v", ErrProposalDropped, err))
			}
		}
		clear(batch)
		return
	}
	for _, p := range batch {
		g.pending[p.id] = p
	}
	clear(batch)
}

// proposeBatches proposes every group's batched proposals.
func (s *shard) proposeBatches() {
	for _, g := range s.proposing {
		s.proposeBatch(g)
	}
	clear(s.proposing)
	s.proposing = s.proposing[:0]
}
