package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	pb "go.etcd.io/raft/v3/raftpb"
)

// FormatEpoch is the on-disk format epoch of topology.bin and checkpoints.
const FormatEpoch = 1

// Record types.
const (
	RecordCheckpoint byte = 1
	RecordEntries    byte = 2
	RecordHardState  byte = 3
	RecordSnapshot   byte = 4
	// RecordTruncate drops a group's entries above an index (a recovery
	// plan's cut back to the committed entry).
	RecordTruncate byte = 5
)

const (
	frameHeaderSize = 9
	// maxPayload bounds a frame's payload; a larger length is damage.
	maxPayload = 1 << 30
	// snapshotFlagDiscard marks a snapshot received from a leader.
	snapshotFlagDiscard = 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt reports damage in a segment or in topology.bin.
	ErrCorrupt = errors.New("wal: corrupt")
	// errShortFrame reports a frame that ends past the end of the input.
	errShortFrame = errors.New("wal: incomplete frame")
	// errFrameCRC reports a frame whose CRC does not match.
	errFrameCRC = errors.New("wal: frame crc mismatch")
)

// appendFrame appends a frame with the given type whose payload is produced
// by fill (which appends to its argument).
func appendFrame(buf []byte, typ byte, fill func([]byte) []byte) []byte {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0, typ)
	buf = fill(buf)
	payload := buf[start+frameHeaderSize:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(payload)))
	crc := crc32.Update(0, crcTable, buf[start+8:])
	binary.LittleEndian.PutUint32(buf[start+4:], crc)
	return buf
}

// DecodeFrame decodes the frame at the start of b. It returns the record type,
// the payload (aliasing b) and the frame's total size.
func DecodeFrame(b []byte) (typ byte, payload []byte, n int, err error) {
	if len(b) < frameHeaderSize {
		return 0, nil, 0, errShortFrame
	}
	size := binary.LittleEndian.Uint32(b[0:4])
	if size > maxPayload {
		return 0, nil, 0, fmt.Errorf("%w: payload length %d", errShortFrame, size)
	}
	total := frameHeaderSize + int(size)
	if len(b) < total {
		return 0, nil, 0, errShortFrame
	}
	want := binary.LittleEndian.Uint32(b[4:8])
	if got := crc32.Update(0, crcTable, b[8:total]); got != want {
		return 0, nil, total, errFrameCRC
	}
	return b[8], b[frameHeaderSize:total], total, nil
}

func putU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func putU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendConfState(b []byte, cs *pb.ConfState) []byte {
	if cs.GetAutoLeave() {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	for _, l := range [][]uint64{cs.GetVoters(), cs.GetLearners(), cs.GetVotersOutgoing(), cs.GetLearnersNext()} {
		b = putU32(b, uint32(len(l)))
		for _, id := range l {
			b = putU64(b, id)
		}
	}
	return b
}

func appendEntries(b []byte, group uint32, ents []*pb.Entry) []byte {
	b = putU32(b, group)
	b = putU32(b, uint32(len(ents)))
	for _, e := range ents {
		b = putU64(b, e.GetIndex())
		b = putU64(b, e.GetTerm())
		b = append(b, byte(e.GetType()))
		b = putU32(b, uint32(len(e.GetData())))
		b = append(b, e.GetData()...)
	}
	return b
}

func appendHardState(b []byte, hs *pb.HardState) []byte {
	b = putU64(b, hs.GetTerm())
	b = putU64(b, hs.GetVote())
	return putU64(b, hs.GetCommit())
}

// reader decodes fixed-width fields and remembers the first failure.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("%w: record truncated", ErrCorrupt)
	}
	r.b = nil
}

func (r *reader) u8() byte {
	if len(r.b) < 1 {
		r.fail()
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u32() uint32 {
	if len(r.b) < 4 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64() uint64 {
	if len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes(n uint32) []byte {
	if uint64(len(r.b)) < uint64(n) {
		r.fail()
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) ids() []uint64 {
	n := r.u32()
	if uint64(n)*8 > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.u64()
	}
	return out
}

func (r *reader) confState() *pb.ConfState {
	cs := &pb.ConfState{}
	auto := r.u8()
	if auto > 1 {
		r.err = fmt.Errorf("%w: bad auto_leave %d", ErrCorrupt, auto)
	}
	cs.AutoLeave = new(auto == 1)
	cs.Voters = r.ids()
	cs.Learners = r.ids()
	cs.VotersOutgoing = r.ids()
	cs.LearnersNext = r.ids()
	return cs
}

func (r *reader) hardState() *pb.HardState {
	return &pb.HardState{Term: new(r.u64()), Vote: new(r.u64()), Commit: new(r.u64())}
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes in record", ErrCorrupt, len(r.b))
	}
	return r.err
}

// Record is a decoded journal record. Only the fields of its Type are set.
type Record struct {
	Type  byte
	Group uint32
	// Checkpoint fields.
	Epoch      uint32
	Shard      uint32
	Seq        uint64
	Checkpoint []CheckpointGroup
	// Entries.
	Entries []*pb.Entry
	// HardState.
	HardState *pb.HardState
	// Snapshot marker.
	Snapshot SnapshotMarker
	// Truncate: the last index kept.
	After uint64
}

// CheckpointGroup is one group's state in a checkpoint record.
type CheckpointGroup struct {
	Group     uint32
	HardState *pb.HardState
	Snapshot  SnapshotMarker
}

// SnapshotMarker records that a snapshot of a group at (Index, Term) is
// durable.
type SnapshotMarker struct {
	Index     uint64
	Term      uint64
	ConfState *pb.ConfState
	// Discard is set for a snapshot received from a leader: it replaces the
	// whole log.
	Discard bool
}

// DecodeRecord decodes a record payload of the given type. The returned
// records do not alias payload.
func DecodeRecord(typ byte, payload []byte) (Record, error) {
	r := reader{b: payload}
	rec := Record{Type: typ}
	switch typ {
	case RecordCheckpoint:
		rec.Epoch = r.u32()
		rec.Shard = r.u32()
		rec.Seq = r.u64()
		n := r.u32()
		// each group takes at least 4+40+1+16 bytes.
		if uint64(n)*61 > uint64(len(r.b)) {
			r.fail()
			break
		}
		rec.Checkpoint = make([]CheckpointGroup, 0, n)
		for i := uint32(0); i < n && r.err == nil; i++ {
			g := CheckpointGroup{Group: r.u32(), HardState: r.hardState()}
			g.Snapshot.Index = r.u64()
			g.Snapshot.Term = r.u64()
			g.Snapshot.ConfState = r.confState()
			rec.Checkpoint = append(rec.Checkpoint, g)
		}
		if r.err == nil && rec.Epoch != FormatEpoch {
			r.err = fmt.Errorf("%w: format epoch %d, want %d", ErrCorrupt, rec.Epoch, FormatEpoch)
		}
	case RecordEntries:
		rec.Group = r.u32()
		n := r.u32()
		// each entry takes at least 21 bytes.
		if uint64(n)*21 > uint64(len(r.b)) {
			r.fail()
			break
		}
		rec.Entries = make([]*pb.Entry, 0, n)
		var prev uint64
		for i := uint32(0); i < n && r.err == nil; i++ {
			idx, term, typ := r.u64(), r.u64(), r.u8()
			data := r.bytes(r.u32())
			if r.err != nil {
				break
			}
			if _, ok := pb.EntryType_name[int32(typ)]; !ok {
				r.err = fmt.Errorf("%w: bad entry type %d", ErrCorrupt, typ)
				break
			}
			if i > 0 && idx != prev+1 {
				r.err = fmt.Errorf("%w: entry index %d after %d", ErrCorrupt, idx, prev)
				break
			}
			prev = idx
			e := &pb.Entry{Index: new(idx), Term: new(term), Type: pb.EntryType(typ).Enum()}
			if len(data) > 0 {
				e.Data = append([]byte(nil), data...)
			}
			rec.Entries = append(rec.Entries, e)
		}
	case RecordHardState:
		rec.Group = r.u32()
		rec.HardState = r.hardState()
	case RecordSnapshot:
		rec.Group = r.u32()
		flags := r.u8()
		if flags&^snapshotFlagDiscard != 0 {
			r.err = fmt.Errorf("%w: bad snapshot flags %#x", ErrCorrupt, flags)
		}
		rec.Snapshot.Discard = flags&snapshotFlagDiscard != 0
		rec.Snapshot.Index = r.u64()
		rec.Snapshot.Term = r.u64()
		rec.Snapshot.ConfState = r.confState()
	case RecordTruncate:
		rec.Group = r.u32()
		rec.After = r.u64()
	default:
		return rec, fmt.Errorf("%w: unknown record type %d", ErrCorrupt, typ)
	}
	return rec, r.done()
}

// EncodeConfState encodes a ConfState in the journal's confstate layout
// (shared with the snapshot files of package raftlog).
func EncodeConfState(b []byte, cs *pb.ConfState) []byte { return appendConfState(b, cs) }

// DecodeConfState decodes a confstate from the start of b and returns the
// number of bytes it used.
func DecodeConfState(b []byte) (*pb.ConfState, int, error) {
	r := reader{b: b}
	cs := r.confState()
	if r.err != nil {
		return nil, 0, r.err
	}
	return cs, len(b) - len(r.b), nil
}
