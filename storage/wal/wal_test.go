package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

func ents(term uint64, lo, hi uint64) []*pb.Entry {
	var out []*pb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &pb.Entry{Index: new(i), Term: new(term), Type: pb.EntryNormal.Enum(), Data: []byte(fmt.Sprintf("e%d-t%d", i, term))})
	}
	return out
}

func hs(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

func openJournal(tb testing.TB, opts Options) (*Journal, map[uint32]*GroupState) {
	tb.Helper()
	j, st, err := OpenJournal(opts)
	if err != nil {
		tb.Fatalf("OpenJournal: %v", err)
	}
	return j, st
}

func mustFlush(tb testing.TB, j *Journal, sync bool) {
	tb.Helper()
	if err := j.Flush(sync); err != nil {
		tb.Fatalf("Flush: %v", err)
	}
}

func mustClose(tb testing.TB, j *Journal) {
	tb.Helper()
	if err := j.Close(); err != nil {
		tb.Fatalf("Close: %v", err)
	}
}

func checkEntries(tb testing.TB, got []*pb.Entry, want []*pb.Entry) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].GetIndex() != want[i].GetIndex() || got[i].GetTerm() != want[i].GetTerm() ||
			string(got[i].GetData()) != string(want[i].GetData()) || got[i].GetType() != want[i].GetType() {
			tb.Fatalf("entry %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

func segmentFiles(tb testing.TB, dir string, shard int) []string {
	tb.Helper()
	m, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("shard-%03d", shard), "*.wal"))
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir, Shard: 1}
	j, st := openJournal(t, opts)
	if len(st) != 0 {
		t.Fatalf("fresh journal recovered %d groups", len(st))
	}
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}, AutoLeave: new(false)}
	j.AppendEntries(1, ents(1, 1, 10))
	j.AppendEntries(3, ents(2, 1, 3))
	j.SetHardState(1, hs(1, 1, 8))
	mustFlush(t, j, false)
	j.AppendEntries(1, ents(3, 7, 12)) // truncates 7..10
	j.SetHardState(1, hs(3, 2, 9))
	j.SetSnapshot(3, SnapshotMarker{Index: 2, Term: 2, ConfState: cs})
	j.SetHardState(3, hs(2, 0, 3))
	mustFlush(t, j, true)
	mustClose(t, j)

	j, st = openJournal(t, opts)
	defer mustClose(t, j)
	tests := []struct {
		name  string
		group uint32
		hs    *pb.HardState
		snap  uint64
		ents  []*pb.Entry
	}{
		{"truncated tail", 1, hs(3, 2, 9), 0, append(ents(1, 1, 6), ents(3, 7, 12)...)},
		{"snapshot compacts", 3, hs(2, 0, 3), 2, ents(2, 3, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := st[tt.group]
			if g == nil {
				t.Fatalf("group %d not recovered", tt.group)
			}
			if g.HardState.String() != tt.hs.String() {
				t.Fatalf("hard state %v, want %v", g.HardState, tt.hs)
			}
			if g.Snapshot.Index != tt.snap {
				t.Fatalf("snapshot index %d, want %d", g.Snapshot.Index, tt.snap)
			}
			checkEntries(t, g.Entries, tt.ents)
		})
	}
	if got := st[3].Snapshot.ConfState; fmt.Sprint(got.GetVoters(), got.GetLearners()) != fmt.Sprint(cs.Voters, cs.Learners) {
		t.Fatalf("conf state %v, want %v", got, cs)
	}
}

func TestDiscardSnapshotDropsLog(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir}
	j, _ := openJournal(t, opts)
	j.AppendEntries(0, ents(1, 1, 10))
	j.SetSnapshot(0, SnapshotMarker{Index: 5, Term: 4, ConfState: &pb.ConfState{Voters: []uint64{1}}, Discard: true})
	j.AppendEntries(0, ents(4, 6, 7))
	mustClose(t, j)
	j, st := openJournal(t, opts)
	defer mustClose(t, j)
	checkEntries(t, st[0].Entries, ents(4, 6, 7))
}

// writeJournal writes a journal with two flushes of group 0 and returns the
// path of its last (active) segment and the entries written.
func writeJournal(tb testing.TB, opts Options) (string, []*pb.Entry) {
	tb.Helper()
	j, _ := openJournal(tb, opts)
	j.AppendEntries(0, ents(1, 1, 5))
	j.SetHardState(0, hs(1, 1, 5))
	mustFlush(tb, j, false)
	j.AppendEntries(0, ents(1, 6, 8))
	mustFlush(tb, j, false)
	mustClose(tb, j)
	files := segmentFiles(tb, opts.LogDir, opts.Shard)
	return files[len(files)-1], ents(1, 1, 8)
}

func appendBytes(tb testing.TB, path string, b []byte) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		tb.Fatal(err)
	}
}

func flipByte(tb testing.TB, path string, off int64) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
}

func TestTornTailIsCut(t *testing.T) {
	frame := appendFrame(nil, RecordEntries, func(b []byte) []byte { return appendEntries(b, 0, ents(1, 9, 9)) })
	tests := []struct {
		name   string
		damage func(tb testing.TB, path string)
		want   []*pb.Entry
	}{
		{"incomplete header", func(tb testing.TB, p string) { appendBytes(tb, p, frame[:5]) }, ents(1, 1, 8)},
		{"incomplete payload", func(tb testing.TB, p string) { appendBytes(tb, p, frame[:len(frame)-3]) }, ents(1, 1, 8)},
		{"bad crc on last frame", func(tb testing.TB, p string) { flipByte(tb, p, -2) }, ents(1, 1, 5)},
		{"zero tail", func(tb testing.TB, p string) { appendBytes(tb, p, make([]byte, 64)) }, ents(1, 1, 8)},
		{"bad crc on last frame, then a garbage sector", func(tb testing.TB, p string) {
			flipByte(tb, p, -2)
			appendBytes(tb, p, []byte("torn sector: no frame in here at all"))
		}, ents(1, 1, 5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{LogDir: t.TempDir()}
			path, _ := writeJournal(t, opts)
			tt.damage(t, path)
			j, st := openJournal(t, opts)
			checkEntries(t, st[0].Entries, tt.want)
			// The cut segment is now sealed and must read back cleanly.
			j.AppendEntries(0, ents(2, uint64(len(tt.want)+1), uint64(len(tt.want)+1)))
			mustClose(t, j)
			j, st = openJournal(t, opts)
			defer mustClose(t, j)
			checkEntries(t, st[0].Entries, append(tt.want, ents(2, uint64(len(tt.want)+1), uint64(len(tt.want)+1))...))
		})
	}
}

func TestDamageRefusesToStart(t *testing.T) {
	tests := []struct {
		name string
		// damage returns the damaged file and the offset the error must name.
		damage func(tb testing.TB, opts Options, active string) (string, int64)
	}{
		{"bad crc in sealed segment", func(tb testing.TB, opts Options, active string) (string, int64) {
			// Reopen so that the written segment is sealed.
			j, _ := openJournal(tb, opts)
			mustClose(tb, j)
			b, _ := os.ReadFile(active)
			_, _, n, _ := DecodeFrame(b) // checkpoint
			flipByte(tb, active, int64(n+frameHeaderSize+3))
			return active, int64(n)
		}},
		{"torn tail in sealed segment", func(tb testing.TB, opts Options, active string) (string, int64) {
			j, _ := openJournal(tb, opts)
			mustClose(tb, j)
			fi, _ := os.Stat(active)
			appendBytes(tb, active, []byte{1, 2, 3})
			return active, fi.Size()
		}},
		{"length past end mid active segment", func(tb testing.TB, opts Options, active string) (string, int64) {
			b, _ := os.ReadFile(active)
			_, _, n, _ := DecodeFrame(b)
			flipByte(tb, active, int64(n+3)) // high byte of the length
			return active, int64(n)
		}},
		{"bad crc mid active segment", func(tb testing.TB, opts Options, active string) (string, int64) {
			b, _ := os.ReadFile(active)
			_, _, n, _ := DecodeFrame(b)
			flipByte(tb, active, int64(n+frameHeaderSize+3))
			return active, int64(n)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{LogDir: t.TempDir()}
			active, _ := writeJournal(t, opts)
			path, off := tt.damage(t, opts, active)
			_, _, err := OpenJournal(opts)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("OpenJournal error %v, want ErrCorrupt", err)
			}
			if want := fmt.Sprintf("%s at offset %d", path, off); !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name %q", err, want)
			}
		})
	}
}

func TestTopology(t *testing.T) {
	dir := t.TempDir()
	if err := CheckTopology(OSFS{}, dir, 64, 4); err != nil {
		t.Fatalf("create: %v", err)
	}
	tests := []struct {
		name   string
		g, s   int
		damage bool
		want   error
	}{
		{"same", 64, 4, false, nil},
		{"group count differs", 32, 4, false, ErrTopologyMismatch},
		{"shard count differs", 64, 2, false, ErrTopologyMismatch},
		{"damaged", 64, 4, true, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			if err := CheckTopology(OSFS{}, d, 64, 4); err != nil {
				t.Fatal(err)
			}
			if tt.damage {
				flipByte(t, filepath.Join(d, topologyFile), 13)
			}
			err := CheckTopology(OSFS{}, d, tt.g, tt.s)
			if !errors.Is(err, tt.want) {
				t.Fatalf("CheckTopology = %v, want %v", err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), filepath.Join(d, topologyFile)) {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
}

// TestTopologyMissingBesideRecords: a journal that holds records without
// its topology.bin refuses, naming both, and recreates nothing; an empty
// journal directory (a fresh node, or one whose segments are empty) gets a
// new one.
func TestTopologyMissingBesideRecords(t *testing.T) {
	d := t.TempDir()
	shard := filepath.Join(d, "shard-000")
	if err := os.MkdirAll(shard, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(shard, "0000000000000001.wal")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckTopology(OSFS{}, d, 64, 4); err != nil {
		t.Fatalf("empty segments: %v", err)
	}
	if err := os.Remove(filepath.Join(d, topologyFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shard, "0000000000000002.wal"), []byte("records"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := CheckTopology(OSFS{}, d, 64, 4)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), topologyFile) || !strings.Contains(err.Error(), "0000000000000002.wal") {
		t.Fatalf("CheckTopology = %v, want a refusal naming topology.bin and the segment", err)
	}
	if _, err := os.Stat(filepath.Join(d, topologyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused start wrote topology.bin: %v", err)
	}
}

func TestRolloverPurgeKeepsHardState(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir, SegmentBytes: 4 << 10}
	j, _ := openJournal(t, opts)
	cs := &pb.ConfState{Voters: []uint64{1}}
	// Group 0 writes a lot; group 2 writes once early and then only hard
	// states. Both get snapshots that cover their entries.
	j.AppendEntries(2, ents(1, 1, 3))
	j.SetHardState(2, hs(1, 1, 3))
	mustFlush(t, j, false)
	var idx uint64
	for range 200 {
		idx++
		j.AppendEntries(0, ents(1, idx, idx))
		j.SetHardState(0, hs(1, 1, idx))
		mustFlush(t, j, false)
	}
	if j.Segments() < 5 {
		t.Fatalf("expected rollovers, have %d segments", j.Segments())
	}
	if n, err := j.Purge(); err != nil || n != 0 {
		t.Fatalf("Purge before snapshots = %d, %v; want 0", n, err)
	}
	pins := j.Pinning()
	if _, ok := pins[2]; !ok {
		t.Fatalf("group 2 should pin the oldest segment: %v", pins)
	}
	j.SetSnapshot(2, SnapshotMarker{Index: 3, Term: 1, ConfState: cs})
	j.SetSnapshot(0, SnapshotMarker{Index: 190, Term: 1, ConfState: cs})
	j.SetHardState(2, hs(5, 1, 3))
	n, err := j.Purge()
	if err != nil || n == 0 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	left := j.Segments()
	mustClose(t, j)
	if got := len(segmentFiles(t, dir, 0)); got != left {
		t.Fatalf("%d segment files on disk, journal says %d", got, left)
	}

	j, st := openJournal(t, opts)
	defer mustClose(t, j)
	if got := st[2].HardState; got.String() != hs(5, 1, 3).String() {
		t.Fatalf("group 2 hard state %v after purge", got)
	}
	if got := st[0].HardState; got.String() != hs(1, 1, 200).String() {
		t.Fatalf("group 0 hard state %v after purge", got)
	}
	if st[2].Snapshot.Index != 3 || len(st[2].Entries) != 0 {
		t.Fatalf("group 2: snapshot %d, %d entries", st[2].Snapshot.Index, len(st[2].Entries))
	}
	checkEntries(t, st[0].Entries, ents(1, 191, 200))
}

func TestMissingEntriesRefused(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir, SegmentBytes: 1 << 10}
	j, _ := openJournal(t, opts)
	for i := uint64(1); i <= 60; i++ {
		j.AppendEntries(0, ents(1, i, i))
		mustFlush(t, j, false)
	}
	mustClose(t, j)
	files := segmentFiles(t, dir, 0)
	if len(files) < 3 {
		t.Fatalf("want at least 3 segments, have %d", len(files))
	}
	if err := os.Remove(files[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenJournal(opts); !errors.Is(err, ErrMissingEntries) {
		t.Fatalf("OpenJournal = %v, want ErrMissingEntries", err)
	}
}

// countingFS counts writes and syncs of segment files.
type countingFS struct {
	OSFS
	writes, syncs atomic.Int64
	failWrite     atomic.Bool
}

type countingFile struct {
	File
	fs *countingFS
}

func (c *countingFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := c.OSFS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return &countingFile{File: f, fs: c}, nil
}

// WriteAt counts the writes that carry frames, not the zeros written
// ahead of them.
func (f *countingFile) WriteAt(b []byte, off int64) (int, error) {
	if f.fs.failWrite.Load() {
		return 0, errors.New("injected write failure")
	}
	if slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		f.fs.writes.Add(1)
	}
	return f.File.WriteAt(b, off)
}

func (f *countingFile) Sync() error {
	f.fs.syncs.Add(1)
	return f.File.Sync()
}

func TestGroupCommitOneWritePerBatch(t *testing.T) {
	cfs := &countingFS{}
	j, _ := openJournal(t, Options{FS: cfs, LogDir: t.TempDir()})
	defer mustClose(t, j)
	w0, s0 := cfs.writes.Load(), cfs.syncs.Load()
	for batch := range uint64(10) {
		for g := range uint32(8) {
			j.AppendEntries(g, ents(1, batch*3+1, batch*3+3))
			j.SetHardState(g, hs(1, 1, batch*3))
		}
		mustFlush(t, j, true)
	}
	if got := cfs.writes.Load() - w0; got != 10 {
		t.Fatalf("%d writes for 10 batches", got)
	}
	if got := cfs.syncs.Load() - s0; got != 10 {
		t.Fatalf("%d syncs for 10 batches", got)
	}
	mustFlush(t, j, true) // nothing new: no write, no sync
	if got := cfs.syncs.Load() - s0; got != 10 {
		t.Fatalf("%d syncs after an empty flush", got)
	}
}

func TestWriteFailureIsSticky(t *testing.T) {
	cfs := &countingFS{}
	j, _ := openJournal(t, Options{FS: cfs, LogDir: t.TempDir()})
	cfs.failWrite.Store(true)
	j.AppendEntries(0, ents(1, 1, 1))
	if err := j.Flush(false); err == nil {
		t.Fatal("Flush succeeded despite a write failure")
	}
	cfs.failWrite.Store(false)
	if err := j.Flush(true); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("second Flush = %v, want the sticky write error", err)
	}
	_ = j.Close()
}

func TestTornNewSegmentIsRemoved(t *testing.T) {
	opts := Options{LogDir: t.TempDir()}
	active, want := writeJournal(t, opts)
	// A crash while starting the next segment leaves a few bytes of its
	// checkpoint.
	next := filepath.Join(filepath.Dir(active), fmt.Sprintf("%016d.wal", 3))
	if err := os.WriteFile(next, []byte{7, 0, 0}, 0o644); err != nil {
		t.Fatal(err)
	}
	j, st := openJournal(t, opts)
	defer mustClose(t, j)
	checkEntries(t, st[0].Entries, want)
	if _, err := os.Stat(next); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("torn empty segment still present: %v", err)
	}
}

// TestTruncateRecord: a truncate record drops a group's entries above its
// index at recovery, leaves other groups alone, and later entries append
// after it.
func TestTruncateRecord(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir, Shard: 0}
	j, _ := openJournal(t, opts)
	j.AppendEntries(1, ents(2, 1, 10))
	j.AppendEntries(2, ents(2, 1, 4))
	j.TruncateEntries(1, 6)
	mustFlush(t, j, true)
	mustClose(t, j)
	j, st := openJournal(t, opts)
	checkEntries(t, st[1].Entries, ents(2, 1, 6))
	checkEntries(t, st[2].Entries, ents(2, 1, 4))
	j.AppendEntries(1, ents(3, 7, 8))
	j.TruncateEntries(2, 0)
	mustFlush(t, j, true)
	mustClose(t, j)
	_, st = openJournal(t, opts)
	checkEntries(t, st[1].Entries, append(ents(2, 1, 6), ents(3, 7, 8)...))
	if len(st[2].Entries) != 0 {
		t.Fatalf("group 2 kept %d entries after a truncate to 0", len(st[2].Entries))
	}
}

// TestRewriteFreesDirtySegments frees segments that hold purged entries by
// copying the live log of the groups that keep them forward: the purged
// entries' bytes leave every file, and recovery finds every live entry.
func TestRewriteFreesDirtySegments(t *testing.T) {
	dir := t.TempDir()
	clock := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	opts := Options{LogDir: dir, SegmentBytes: 4 << 10, Now: func() time.Time { return clock }}
	j, _ := openJournal(t, opts)
	cs := &pb.ConfState{Voters: []uint64{1}}
	// Group 1 is quiet: its live entries 1..3 sit in the first segment.
	// Group 0 writes through several segments, then snapshots.
	live := ents(1, 1, 3)
	j.AppendEntries(1, live)
	for i := uint64(1); i <= 400; i++ {
		j.AppendEntries(0, ents(1, i, i))
		mustFlush(t, j, false)
	}
	if j.Segments() < 3 {
		t.Fatalf("expected rollovers, have %d segments", j.Segments())
	}
	if _, ok := j.DueThrough(clock); ok {
		t.Fatal("a segment is due before any entry was purged")
	}
	j.SetSnapshot(0, SnapshotMarker{Index: 400, Term: 1, ConfState: cs})
	mustFlush(t, j, false)
	if n, err := j.Purge(); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v: group 1's live entries keep the oldest segment", n, err)
	}
	if got := j.Stats().DirtySegments; got != uint64(j.Segments()) {
		t.Fatalf("%d dirty segments of %d: every one holds purged entries of group 0", got, j.Segments())
	}
	if _, ok := j.DueThrough(clock.Add(-time.Second)); ok {
		t.Fatal("a segment is due before its purged entries aged")
	}
	through, ok := j.DueThrough(clock)
	if !ok {
		t.Fatal("no segment due")
	}
	if err := j.SealThrough(through); err != nil {
		t.Fatal(err)
	}
	if got := j.LiveThrough(through); len(got) != 1 || got[0] != 1 {
		t.Fatalf("LiveThrough = %v, want [1]", got)
	}
	if n := j.RewriteEntries(1, live); n == 0 {
		t.Fatal("RewriteEntries wrote nothing")
	}
	if got := j.LiveThrough(through); len(got) != 0 {
		t.Fatalf("LiveThrough after the copy = %v", got)
	}
	if n, err := j.Purge(); err != nil || n == 0 {
		t.Fatalf("Purge after the copy = %d, %v", n, err)
	}
	if j.HoldsThrough(0, 400) {
		t.Fatal("a segment still holds group 0's purged entries")
	}
	st := j.Stats()
	if st.DirtySegments != 0 || st.RewrittenBytes == 0 {
		t.Fatalf("stats after freeing: %+v", st)
	}
	mustClose(t, j)
	for _, f := range segmentFiles(t, dir, 0) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(1); i <= 400; i++ {
			if strings.Contains(string(data), fmt.Sprintf("e%d-t1", i)) && i > 3 {
				t.Fatalf("%s still holds group 0's purged entry %d", f, i)
			}
		}
	}
	j, states := openJournal(t, opts)
	defer mustClose(t, j)
	checkEntries(t, states[1].Entries, live)
	if states[0].Snapshot.Index != 400 || len(states[0].Entries) != 0 {
		t.Fatalf("group 0: snapshot %d, %d entries", states[0].Snapshot.Index, len(states[0].Entries))
	}
}

// TestDirtyAgeSurvivesRestart: purged entries keep their age across a
// restart (read from the segment's last change); segments without purged
// entries are not dirty.
func TestDirtyAgeSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogDir: dir, SegmentBytes: 4 << 10}
	j, _ := openJournal(t, opts)
	j.AppendEntries(0, ents(1, 1, 5))
	j.AppendEntries(1, ents(1, 1, 5))
	j.SetSnapshot(0, SnapshotMarker{Index: 5, Term: 1, ConfState: &pb.ConfState{Voters: []uint64{1}}})
	mustClose(t, j)
	j, _ = openJournal(t, opts)
	defer mustClose(t, j)
	if got := j.Stats().DirtySegments; got != 1 {
		t.Fatalf("%d dirty segments after a restart, want 1", got)
	}
	if _, ok := j.DueThrough(time.Now().Add(-time.Hour)); ok {
		t.Fatal("a restart made old purged entries' age start in the past")
	}
	if _, ok := j.DueThrough(time.Now()); !ok {
		t.Fatal("the purged entries' age was not read from the segment")
	}
}

func fileSize(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Size()
}

// TestZerosAheadOfTheFrames: the active segment is filled with zeros ahead
// of its frames (so that an fsync does not also commit a new size); a
// crash leaves them, recovery cuts them, and a segment sealed or closed
// cleanly ends with its last frame.
func TestZerosAheadOfTheFrames(t *testing.T) {
	t.Run("a crash leaves them and recovery cuts them", func(t *testing.T) {
		opts := Options{LogDir: t.TempDir()}
		j, _ := openJournal(t, opts)
		j.AppendEntries(0, ents(1, 1, 5))
		j.SetHardState(0, hs(1, 1, 5))
		mustFlush(t, j, true)
		path := segmentFiles(t, opts.LogDir, 0)[0]
		frames := j.Tail().Size
		if got := fileSize(t, path); got != preallocChunk {
			t.Fatalf("active segment is %d bytes with %d of frames, want zeros up to %d", got, frames, preallocChunk)
		}
		// The crash: j is never closed.
		j2, st := openJournal(t, opts)
		defer mustClose(t, j2)
		checkEntries(t, st[0].Entries, ents(1, 1, 5))
		if j2.DamagedTail() {
			t.Fatal("zeros ahead of the frames counted as damage")
		}
		if got := fileSize(t, path); got != frames {
			t.Fatalf("recovered segment is %d bytes, want its %d bytes of frames", got, frames)
		}
	})
	t.Run("sealed and cleanly closed segments end with their last frame", func(t *testing.T) {
		opts := Options{LogDir: t.TempDir(), SegmentBytes: 8 << 10}
		j, _ := openJournal(t, opts)
		for i := uint64(1); i <= 400; i++ {
			j.AppendEntries(0, ents(1, i, i))
			mustFlush(t, j, i%7 == 0)
		}
		mustClose(t, j)
		files := segmentFiles(t, opts.LogDir, 0)
		if len(files) < 3 {
			t.Fatalf("%d segments, want several", len(files))
		}
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < len(b); {
				_, _, n, err := DecodeFrame(b[off:])
				if err != nil {
					t.Fatalf("%s at offset %d of %d: %v", p, off, len(b), err)
				}
				off += n
			}
		}
		if got, want := fileSize(t, files[len(files)-1]), j.Tail().Size; got != want {
			t.Fatalf("closed active segment is %d bytes, its tail says %d", got, want)
		}
	})
	t.Run("a damaged last frame before the zeros is still damage", func(t *testing.T) {
		opts := Options{LogDir: t.TempDir()}
		j, _ := openJournal(t, opts)
		j.AppendEntries(0, ents(1, 1, 5))
		mustFlush(t, j, true)
		j.SetHardState(0, hs(1, 1, 5)) // a small frame that ends in zero bytes
		mustFlush(t, j, true)
		path := segmentFiles(t, opts.LogDir, 0)[0]
		flipByte(t, path, j.Tail().Size-20)
		j2, st := openJournal(t, opts)
		defer mustClose(t, j2)
		checkEntries(t, st[0].Entries, ents(1, 1, 5))
		if !j2.DamagedTail() {
			t.Fatal("a damaged last frame followed by the zeros ahead of the frames was cut as a torn write")
		}
	})
}
