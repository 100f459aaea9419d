package raftlog

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
)

func ents(term, lo, hi uint64) []*pb.Entry {
	var out []*pb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &pb.Entry{Index: new(i), Term: new(term), Data: []byte("x")})
	}
	return out
}

func newStorage(tb testing.TB, st *wal.GroupState) (*Storage, *SnapshotStore) {
	tb.Helper()
	snaps := NewSnapshotStore(nil, tb.TempDir())
	s, _, err := New(3, st, snaps, nil)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s, snaps
}

func TestStorageLog(t *testing.T) {
	s, _ := newStorage(t, &wal.GroupState{Entries: ents(1, 1, 10), HardState: &pb.HardState{Term: new(uint64(1)), Commit: new(uint64(8))}})
	if err := s.Append(ents(2, 8, 12)); err != nil { // truncates 8..10
		t.Fatal(err)
	}
	if err := s.Compact(5, &pb.ConfState{Voters: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		lo, hi  uint64
		max     uint64
		wantN   int
		wantErr error
	}{
		{"all", 6, 13, 1 << 20, 7, nil},
		{"size limited returns at least one", 6, 13, 1, 1, nil},
		{"compacted", 5, 8, 1 << 20, 0, raft.ErrCompacted},
		{"beyond last", 6, 14, 1 << 20, 0, raft.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Entries(tt.lo, tt.hi, tt.max)
			if !errors.Is(err, tt.wantErr) || len(got) != tt.wantN {
				t.Fatalf("Entries(%d,%d) = %d entries, %v; want %d, %v", tt.lo, tt.hi, len(got), err, tt.wantN, tt.wantErr)
			}
		})
	}
	terms := []struct {
		i       uint64
		want    uint64
		wantErr error
	}{{4, 0, raft.ErrCompacted}, {5, 1, nil}, {7, 1, nil}, {8, 2, nil}, {12, 2, nil}, {13, 0, raft.ErrUnavailable}}
	for _, tt := range terms {
		if got, err := s.Term(tt.i); got != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("Term(%d) = %d, %v; want %d, %v", tt.i, got, err, tt.want, tt.wantErr)
		}
	}
	if fi, _ := s.FirstIndex(); fi != 6 {
		t.Errorf("FirstIndex = %d, want 6", fi)
	}
	if li, _ := s.LastIndex(); li != 12 {
		t.Errorf("LastIndex = %d, want 12", li)
	}
	if err := s.Append(ents(2, 20, 21)); !errors.Is(err, ErrOutOfOrder) {
		t.Errorf("Append with a hole = %v, want ErrOutOfOrder", err)
	}
	s.ApplySnapshot(&pb.SnapshotMetadata{Index: new(uint64(30)), Term: new(uint64(3))})
	if fi, _ := s.FirstIndex(); fi != 31 {
		t.Errorf("FirstIndex after ApplySnapshot = %d, want 31", fi)
	}
	if li, _ := s.LastIndex(); li != 30 {
		t.Errorf("LastIndex after ApplySnapshot = %d, want 30", li)
	}
}

func TestSnapshotFiles(t *testing.T) {
	dir := t.TempDir()
	snaps := NewSnapshotStore(nil, dir)
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	for i, idx := range []uint64{10, 20, 30} {
		snap := &pb.Snapshot{Data: []byte{byte(i), 1, 2}, Metadata: &pb.SnapshotMetadata{Index: new(idx), Term: new(uint64(2)), ConfState: cs}}
		if err := snaps.Save(3, snap); err != nil {
			t.Fatal(err)
		}
	}
	// A file a lost history left at the retained index, with another term
	// (its journal marker went with a power loss): never loaded, and
	// removed by the retention.
	stale := &pb.Snapshot{Data: []byte{9}, Metadata: &pb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(1)), ConfState: cs}}
	if err := snaps.Save(3, stale); err != nil {
		t.Fatal(err)
	}
	if got, err := snaps.Load(3, 2, 20); err != nil || got.GetData()[0] != 1 {
		t.Fatalf("Load(term 2, index 20) = %v, %v", got, err)
	}
	if err := snaps.Retain(3, 2, 20); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "snapshots", "group-0003", "*.snap"))
	// Only the current snapshot stays: an older one may hold streams
	// removed since (the deleted-data bound).
	if len(files) != 1 || filepath.Base(files[0]) != snapName(2, 20) {
		t.Fatalf("kept %v, want only the snapshot at term 2 index 20", files)
	}
	if _, err := snaps.Load(3, 1, 20); !errors.Is(err, ErrSnapshotMissing) {
		t.Fatalf("the stale file was kept: %v", err)
	}

	st := &wal.GroupState{
		Snapshot:  wal.SnapshotMarker{Index: 20, Term: 2, ConfState: cs},
		HardState: &pb.HardState{Term: new(uint64(2)), Commit: new(uint64(25))},
		Entries:   ents(2, 21, 22),
	}
	s, snap, err := New(3, st, snaps, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if snap.GetMetadata().GetIndex() != 20 || snap.GetData()[0] != 1 {
		t.Fatalf("loaded snapshot %v", snap)
	}
	hs, gotCS, _ := s.InitialState()
	if hs.GetCommit() != 22 {
		t.Errorf("commit %d beyond the log was not clamped to 22", hs.GetCommit())
	}
	if len(gotCS.GetVoters()) != 3 {
		t.Errorf("conf state %v", gotCS)
	}
	if got, err := s.Snapshot(); err != nil || got.GetMetadata().GetIndex() != 20 {
		t.Fatalf("Snapshot() = %v, %v", got, err)
	}

	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   error
	}{
		{"flipped data byte", func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1
			_ = os.WriteFile(p, b, 0o644)
		}, ErrSnapshotCorrupt},
		{"truncated", func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			_ = os.WriteFile(p, b[:20], 0o644)
		}, ErrSnapshotCorrupt},
		{"missing", func(t *testing.T, p string) { _ = os.Remove(p) }, ErrSnapshotMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			ss := NewSnapshotStore(nil, d)
			snap := &pb.Snapshot{Data: []byte("state"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(2)), ConfState: cs}}
			if err := ss.Save(3, snap); err != nil {
				t.Fatal(err)
			}
			tt.damage(t, filepath.Join(d, "snapshots", "group-0003", snapName(2, 20)))
			if _, _, err := New(3, st, ss, nil); !errors.Is(err, tt.want) {
				t.Fatalf("New = %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(EncodeSnapshot(1, &pb.Snapshot{Data: []byte("abc"), Metadata: &pb.SnapshotMetadata{
		Index: new(uint64(5)), Term: new(uint64(1)), ConfState: &pb.ConfState{Voters: []uint64{1}},
	}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = DecodeSnapshot(b)
	})
}
