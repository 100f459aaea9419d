package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"strings"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
)

// FormatEpoch is the snapshot file format epoch.
const FormatEpoch = 1

var (
	// ErrSnapshotCorrupt reports a damaged snapshot file.
	ErrSnapshotCorrupt = errors.New("raftlog: snapshot corrupt")
	// ErrSnapshotMissing reports that the snapshot named by the journal is
	// not on disk.
	ErrSnapshotMissing = errors.New("raftlog: snapshot missing")
)

var (
	snapMagic = []byte("URSSNAP\x00")
	crcTable  = crc32.MakeTable(crc32.Castagnoli)
)

// SnapshotStore reads and writes the snapshot files of every group.
type SnapshotStore struct {
	fs  wal.FS
	dir string
}

// NewSnapshotStore returns the store under dataDir/snapshots.
func NewSnapshotStore(fsys wal.FS, dataDir string) *SnapshotStore {
	if fsys == nil {
		fsys = wal.OSFS{}
	}
	return &SnapshotStore{fs: fsys, dir: filepath.Join(dataDir, "snapshots")}
}

func (s *SnapshotStore) groupDir(group uint32) string {
	return filepath.Join(s.dir, fmt.Sprintf("group-%04d", group))
}

func snapName(term, index uint64) string { return fmt.Sprintf("%016x-%016x.snap", term, index) }

// EncodeSnapshot encodes a snapshot file.
func EncodeSnapshot(group uint32, snap *pb.Snapshot) []byte {
	return append(snapshotHeader(group, snap), snap.GetData()...)
}

// snapshotHeader is a snapshot file up to its data.
func snapshotHeader(group uint32, snap *pb.Snapshot) []byte {
	md := snap.GetMetadata()
	data := snap.GetData()
	cs := wal.EncodeConfState(nil, md.GetConfState())
	b := make([]byte, 0, 48+len(cs))
	b = append(b, snapMagic...)
	b = binary.LittleEndian.AppendUint32(b, FormatEpoch)
	b = binary.LittleEndian.AppendUint32(b, group)
	b = binary.LittleEndian.AppendUint64(b, md.GetIndex())
	b = binary.LittleEndian.AppendUint64(b, md.GetTerm())
	b = binary.LittleEndian.AppendUint32(b, uint32(len(cs)))
	b = append(b, cs...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(data, crcTable))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// DecodeSnapshot decodes a snapshot file and returns its group id.
func DecodeSnapshot(b []byte) (uint32, *pb.Snapshot, error) {
	bad := func(why string) (uint32, *pb.Snapshot, error) {
		return 0, nil, fmt.Errorf("%w: %s", ErrSnapshotCorrupt, why)
	}
	if len(b) < 36 || !bytes.Equal(b[:8], snapMagic) {
		return bad("bad magic")
	}
	if e := binary.LittleEndian.Uint32(b[8:]); e != FormatEpoch {
		return bad(fmt.Sprintf("format epoch %d, want %d", e, FormatEpoch))
	}
	group := binary.LittleEndian.Uint32(b[12:])
	index := binary.LittleEndian.Uint64(b[16:])
	term := binary.LittleEndian.Uint64(b[24:])
	csLen := uint64(binary.LittleEndian.Uint32(b[32:]))
	if uint64(len(b)) < 36+csLen+16 {
		return bad("truncated header")
	}
	hdrEnd := 36 + int(csLen) + 12
	dataLen := binary.LittleEndian.Uint64(b[36+csLen:])
	dataCRC := binary.LittleEndian.Uint32(b[36+csLen+8:])
	if binary.LittleEndian.Uint32(b[hdrEnd:]) != crc32.Checksum(b[:hdrEnd], crcTable) {
		return bad("header crc mismatch")
	}
	data := b[hdrEnd+4:]
	if uint64(len(data)) != dataLen {
		return bad(fmt.Sprintf("data length %d, header says %d", len(data), dataLen))
	}
	if crc32.Checksum(data, crcTable) != dataCRC {
		return bad("data crc mismatch")
	}
	cs, n, err := wal.DecodeConfState(b[36 : 36+csLen])
	if err != nil || uint64(n) != csLen {
		return bad("bad confstate")
	}
	return group, &pb.Snapshot{
		Data:     data,
		Metadata: &pb.SnapshotMetadata{Index: new(index), Term: new(term), ConfState: cs},
	}, nil
}

// Save writes a group's snapshot durably.
func (s *SnapshotStore) Save(group uint32, snap *pb.Snapshot) error {
	dir := s.groupDir(group)
	if err := wal.MkdirDurable(s.fs, dir); err != nil {
		return fmt.Errorf("raftlog: create %s: %w", dir, err)
	}
	md := snap.GetMetadata()
	path := filepath.Join(dir, snapName(md.GetTerm(), md.GetIndex()))
	// The header and the data are written as they are: a group of many
	// streams has a snapshot of megabytes, not worth one more copy.
	if err := wal.WriteFileAtomic(s.fs, dir, path, snapshotHeader(group, snap), snap.GetData()); err != nil {
		return fmt.Errorf("raftlog: save snapshot: %w", err)
	}
	return nil
}

type snapFile struct {
	name        string
	term, index uint64
}

func (s *SnapshotStore) list(group uint32) ([]snapFile, error) {
	des, err := s.fs.ReadDir(s.groupDir(group))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("raftlog: list snapshots: %w", err)
	}
	var out []snapFile
	for _, de := range des {
		var f snapFile
		f.name = de.Name()
		if !strings.HasSuffix(f.name, ".snap") {
			continue
		}
		if _, err := fmt.Sscanf(f.name, "%016x-%016x.snap", &f.term, &f.index); err != nil {
			continue
		}
		out = append(out, f)
	}
	return out, nil
}

// Load reads the snapshot of a group at index.
func (s *SnapshotStore) Load(group uint32, term, index uint64) (*pb.Snapshot, error) {
	files, err := s.list(group)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		// The term too: after a power loss took a journal's tail, a file a
		// lost history left at the same index may still be there.
		if f.index != index || f.term != term {
			continue
		}
		path := filepath.Join(s.groupDir(group), f.name)
		b, err := wal.ReadFile(s.fs, path)
		if err != nil {
			return nil, fmt.Errorf("raftlog: read %s: %w", path, err)
		}
		g, snap, err := DecodeSnapshot(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if g != group || snap.GetMetadata().GetIndex() != index || snap.GetMetadata().GetTerm() != f.term {
			return nil, fmt.Errorf("%w: %s holds group %d index %d term %d", ErrSnapshotCorrupt, path,
				g, snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm())
		}
		return snap, nil
	}
	return nil, fmt.Errorf("%w: group %d index %d term %d in %s", ErrSnapshotMissing, group, index, term, s.groupDir(group))
}

// Retain deletes a group's snapshot files other than the one at (term,
// index), and leftover temporary files. Only the current snapshot is kept:
// an older one may hold streams removed since (the deleted-data bound).
func (s *SnapshotStore) Retain(group uint32, term, index uint64) error {
	files, err := s.list(group)
	if err != nil {
		return err
	}
	dir := s.groupDir(group)
	removed := false
	for _, f := range files {
		if f.index == index && f.term == term {
			continue
		}
		if err := s.fs.Remove(filepath.Join(dir, f.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("raftlog: remove snapshot: %w", err)
		}
		removed = true
	}
	if des, err := s.fs.ReadDir(dir); err == nil {
		for _, de := range des {
			if strings.HasSuffix(de.Name(), ".tmp") {
				_ = s.fs.Remove(filepath.Join(dir, de.Name()))
				removed = true
			}
		}
	}
	if removed {
		if err := wal.SyncDir(s.fs, dir); err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
	}
	return nil
}
