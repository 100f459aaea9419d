package raftlog

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/storage/wal"
)

// ErrOutOfOrder reports an append that would leave a hole in the log.
var ErrOutOfOrder = errors.New("raftlog: entries out of order")

// Storage is the raft.Storage of one group. It is owned by one goroutine.
type Storage struct {
	group  uint32
	snaps  *SnapshotStore
	logger *slog.Logger

	hs   *pb.HardState
	snap *pb.SnapshotMetadata
	// ents are the entries after snap.Index, consecutive.
	ents []*pb.Entry
}

var _ raft.Storage = (*Storage)(nil)

// New returns the storage of a group from its recovered journal state (st may
// be nil for a group with no state). It returns the snapshot named by the
// journal (nil if none), whose data the caller restores into the state
// machine.
func New(group uint32, st *wal.GroupState, snaps *SnapshotStore, logger *slog.Logger) (*Storage, *pb.Snapshot, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Storage{group: group, snaps: snaps, logger: logger}
	s.snap = pb.EnsureSnapshotMetadata(nil)
	if st == nil {
		return s, nil, nil
	}
	var loaded *pb.Snapshot
	if st.Snapshot.Index > 0 {
		snap, err := snaps.Load(group, st.Snapshot.Term, st.Snapshot.Index)
		if err != nil {
			return nil, nil, fmt.Errorf("raftlog: group %d: load snapshot named by the wal: %w", group, err)
		}
		if snap.GetMetadata().GetTerm() != st.Snapshot.Term {
			return nil, nil, fmt.Errorf("%w: group %d: snapshot index %d has term %d, wal says %d",
				ErrSnapshotCorrupt, group, st.Snapshot.Index, snap.GetMetadata().GetTerm(), st.Snapshot.Term)
		}
		if err := snaps.Retain(group, st.Snapshot.Term, st.Snapshot.Index); err != nil {
			return nil, nil, err
		}
		loaded = snap
		s.snap = &pb.SnapshotMetadata{
			Index:     new(st.Snapshot.Index),
			Term:      new(st.Snapshot.Term),
			ConfState: cloneConfState(snap.GetMetadata().GetConfState()),
		}
	}
	s.ents = st.Entries
	if hs := st.HardState; hs != nil {
		commit := hs.GetCommit()
		if commit < s.snap.GetIndex() {
			commit = s.snap.GetIndex()
		}
		if last := s.lastIndex(); commit > last {
			logger.Warn("hard state commit beyond the recovered log; unsynced entries were lost",
				"commit", commit, "last_index", last)
			commit = last
		}
		s.hs = &pb.HardState{Term: new(hs.GetTerm()), Vote: new(hs.GetVote()), Commit: new(commit)}
	} else if s.snap.GetIndex() > 0 {
		s.hs = &pb.HardState{Term: new(s.snap.GetTerm()), Vote: new(uint64(0)), Commit: new(s.snap.GetIndex())}
	}
	return s, loaded, nil
}

// InitialState implements raft.Storage.
func (s *Storage) InitialState() (*pb.HardState, *pb.ConfState, error) {
	return s.hs, pb.EnsureConfState(s.snap.ConfState), nil
}

func (s *Storage) lastIndex() uint64 { return s.snap.GetIndex() + uint64(len(s.ents)) }

// Entries implements raft.Storage.
func (s *Storage) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	off := s.snap.GetIndex()
	if lo <= off {
		return nil, raft.ErrCompacted
	}
	if hi > s.lastIndex()+1 {
		return nil, raft.ErrUnavailable
	}
	if lo >= hi {
		return nil, nil
	}
	ents := s.ents[lo-off-1 : hi-off-1]
	var size uint64
	for i, e := range ents {
		size += uint64(len(e.GetData())) + 24
		if i > 0 && size > maxSize {
			ents = ents[:i]
			break
		}
	}
	return ents[:len(ents):len(ents)], nil
}

// Term implements raft.Storage.
func (s *Storage) Term(i uint64) (uint64, error) {
	off := s.snap.GetIndex()
	switch {
	case i == off:
		return s.snap.GetTerm(), nil
	case i < off:
		return 0, raft.ErrCompacted
	case i > s.lastIndex():
		return 0, raft.ErrUnavailable
	}
	return s.ents[i-off-1].GetTerm(), nil
}

// LastIndex implements raft.Storage.
func (s *Storage) LastIndex() (uint64, error) { return s.lastIndex(), nil }

// FirstIndex implements raft.Storage.
func (s *Storage) FirstIndex() (uint64, error) { return s.snap.GetIndex() + 1, nil }

// Snapshot implements raft.Storage. It reads the snapshot file.
func (s *Storage) Snapshot() (*pb.Snapshot, error) {
	if s.snap.GetIndex() == 0 {
		return &pb.Snapshot{Metadata: proto.Clone(s.snap).(*pb.SnapshotMetadata)}, nil
	}
	snap, err := s.snaps.Load(s.group, s.snap.GetTerm(), s.snap.GetIndex())
	if err != nil {
		s.logger.Error("cannot read snapshot", "index", s.snap.GetIndex(), "err", err)
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	return snap, nil
}

// LiveEntries returns the entries above the snapshot (shared: the caller
// must not modify them) and about how many journal bytes they take.
func (s *Storage) LiveEntries() ([]*pb.Entry, uint64) {
	var n uint64
	for _, e := range s.ents {
		n += uint64(len(e.GetData())) + 21
	}
	return s.ents, n
}

// SnapshotTerm returns the term of the latest snapshot.
func (s *Storage) SnapshotTerm() uint64 { return s.snap.GetTerm() }

// SnapshotIndex returns the index of the latest snapshot.
func (s *Storage) SnapshotIndex() uint64 { return s.snap.GetIndex() }

// HardState returns the latest hard state (nil if none).
func (s *Storage) HardState() *pb.HardState { return s.hs }

// Append adds entries that are already in the journal. An entry at or below
// the last index replaces it and everything after it.
func (s *Storage) Append(ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	off := s.snap.GetIndex()
	first := ents[0].GetIndex()
	if first <= off {
		skip := off + 1 - first
		if skip >= uint64(len(ents)) {
			return nil
		}
		ents = ents[skip:]
		first = off + 1
	}
	last := s.lastIndex()
	switch {
	case first == last+1:
		s.ents = append(s.ents, ents...)
	case first <= last:
		// Entries handed out by Entries may still be referenced: copy.
		keep := s.ents[:first-off-1]
		n := make([]*pb.Entry, 0, len(keep)+len(ents))
		n = append(n, keep...)
		s.ents = append(n, ents...)
	default:
		return fmt.Errorf("%w: group %d: append at %d after last index %d", ErrOutOfOrder, s.group, first, last)
	}
	return nil
}

// Truncate drops the entries above after, which must not be below the
// snapshot index; the journal already holds the cut.
func (s *Storage) Truncate(after uint64) error {
	off := s.snap.GetIndex()
	if after < off {
		return fmt.Errorf("raftlog: group %d: truncate after %d below the snapshot index %d", s.group, after, off)
	}
	if after < s.lastIndex() {
		s.ents = slices.Clone(s.ents[:after-off])
	}
	return nil
}

// SetHardState records a hard state that is already in the journal.
func (s *Storage) SetHardState(hs *pb.HardState) { s.hs = hs }

// Compact records a local snapshot at index (at or below the last index)
// whose file and journal marker are durable, and drops the entries up to it.
func (s *Storage) Compact(index uint64, cs *pb.ConfState) error {
	off := s.snap.GetIndex()
	if index <= off {
		return nil
	}
	term, err := s.Term(index)
	if err != nil {
		return fmt.Errorf("raftlog: group %d: compact at %d: %w", s.group, index, err)
	}
	s.snap = &pb.SnapshotMetadata{Index: new(index), Term: new(term), ConfState: cloneConfState(cs)}
	rest := s.ents[index-off:]
	s.ents = append(make([]*pb.Entry, 0, len(rest)+64), rest...)
	return nil
}

// ApplySnapshot records a snapshot received from a leader (durable in file
// and journal); it replaces the whole log.
func (s *Storage) ApplySnapshot(md *pb.SnapshotMetadata) {
	s.snap = &pb.SnapshotMetadata{
		Index:     new(md.GetIndex()),
		Term:      new(md.GetTerm()),
		ConfState: cloneConfState(md.GetConfState()),
	}
	s.ents = nil
}

// Snapshots returns the snapshot store.
func (s *Storage) Snapshots() *SnapshotStore { return s.snaps }

func cloneConfState(cs *pb.ConfState) *pb.ConfState {
	if cs == nil {
		return pb.EnsureConfState(nil)
	}
	return pb.EnsureConfState(proto.Clone(cs).(*pb.ConfState))
}
