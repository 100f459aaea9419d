package wal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
)

func TestCleanShutdownRecord(t *testing.T) {
	dir := t.TempDir()
	if cs, err := ReadCleanShutdown(OSFS{}, dir); err != nil || cs != nil {
		t.Fatalf("no record: %v, %v", cs, err)
	}
	tails := map[int]SegmentTail{0: {Seq: 3, Size: 4096}, 2: {Seq: 1, Size: 57}, 1: {Seq: 9, Size: 0}}
	if err := RecordCleanShutdown(OSFS{}, dir, tails); err != nil {
		t.Fatal(err)
	}
	cs, err := ReadCleanShutdown(OSFS{}, dir)
	if err != nil || cs == nil || fmt.Sprint(cs.Tails) != fmt.Sprint(tails) {
		t.Fatalf("read %v, %v; want %v", cs, err, tails)
	}
	path := filepath.Join(dir, CleanShutdownFile)
	good, _ := os.ReadFile(path)
	for name, b := range map[string][]byte{
		"flipped byte": func() []byte { b := bytes.Clone(good); b[20] ^= 1; return b }(),
		"truncated":    good[:len(good)-3],
		"empty":        {},
		"foreign":      []byte("2026-11-29T10:00:00Z\n"),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadCleanShutdown(OSFS{}, dir)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadCleanShutdown = %v, want ErrCorrupt naming %s", err, path)
			}
		})
	}
	if err := ConsumeCleanShutdown(OSFS{}, dir); err != nil {
		t.Fatal(err)
	}
	if cs, err := ReadCleanShutdown(OSFS{}, dir); err != nil || cs != nil {
		t.Fatalf("after consume: %v, %v", cs, err)
	}
	if err := ConsumeCleanShutdown(OSFS{}, dir); err != nil {
		t.Fatalf("consume without a record: %v", err)
	}
}

// cleanJournal writes a journal like writeJournal, closes it cleanly and
// returns its active segment and the tail a clean shutdown records.
func cleanJournal(tb testing.TB, opts Options) (string, SegmentTail) {
	tb.Helper()
	j, _ := openJournal(tb, opts)
	j.AppendEntries(0, ents(1, 1, 5))
	j.SetHardState(0, hs(1, 1, 5))
	mustFlush(tb, j, false)
	j.AppendEntries(0, ents(1, 6, 8))
	mustClose(tb, j)
	files := segmentFiles(tb, opts.LogDir, opts.Shard)
	tail := j.Tail()
	if want := filepath.Join(opts.LogDir, fmt.Sprintf("shard-%03d", opts.Shard), fmt.Sprintf("%016d.wal", tail.Seq)); files[len(files)-1] != want {
		tb.Fatalf("Tail names segment %d, the newest file is %s", tail.Seq, files[len(files)-1])
	}
	if fi, err := os.Stat(files[len(files)-1]); err != nil || fi.Size() != tail.Size {
		tb.Fatalf("Tail says %d bytes, the file: %v, %v", tail.Size, fi, err)
	}
	return files[len(files)-1], tail
}

// dirState is every directory and file under dir, with the files' bytes.
func dirState(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			out[p] = "directory"
			return nil
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestCleanShutdownRefusesDamagedTail: after a clean shutdown the active
// segment is exactly as it was synced, so a tail that is cut, extended or
// damaged is refused (naming the file and the offset) and nothing on disk
// changes, where after a crash the same damage is a torn write that is cut
// (TestTornTailIsCut). The issue: a cut active segment was "repaired" and
// the acknowledged appends in it vanished, the node ready and
// wal_recovery false.
// TestRunningRecord: the record names the boot it was written in; one that
// does not decode names none (it proves no crash spared the host); a run
// whose boot cannot be told, and ForgetRunning, leave none.
func TestRunningRecord(t *testing.T) {
	dir := t.TempDir()
	if got := ReadRunning(OSFS{}, dir); got != "" {
		t.Fatalf("no record names %q", got)
	}
	const boot = "6f1c2a9e-0d51-4c0e-9a57-1d2f0b7c3e42"
	if err := RecordRunning(OSFS{}, dir, boot); err != nil {
		t.Fatal(err)
	}
	if got := ReadRunning(OSFS{}, dir); got != boot {
		t.Fatalf("record names %q, want %q", got, boot)
	}
	path := filepath.Join(dir, RunningFile)
	good, _ := os.ReadFile(path)
	for name, b := range map[string][]byte{
		"flipped byte": func() []byte { b := bytes.Clone(good); b[12] ^= 1; return b }(),
		"truncated":    good[:len(good)-3],
		"empty":        {},
		"foreign":      []byte(boot + "\n"),
	} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := ReadRunning(OSFS{}, dir); got != "" {
			t.Errorf("%s: record names %q, want none", name, got)
		}
	}
	if err := RecordRunning(OSFS{}, dir, boot); err != nil {
		t.Fatal(err)
	}
	if err := RecordRunning(OSFS{}, dir, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a run without a boot id left a record: %v", err)
	}
	if err := ForgetRunning(OSFS{}, dir); err != nil {
		t.Fatalf("forgetting no record: %v", err)
	}
	if id := BootID(OSFS{}); id == "" {
		t.Log("this kernel publishes no boot id: every crash counts as the host's")
	}
}

func TestCleanShutdownRefusesDamagedTail(t *testing.T) {
	frame := appendFrame(nil, RecordEntries, func(b []byte) []byte { return appendEntries(b, 0, ents(1, 9, 9)) })
	lastFrame := func(tb testing.TB, path string) int64 {
		b, _ := os.ReadFile(path)
		off := 0
		for {
			_, _, n, err := DecodeFrame(b[off:])
			if err != nil {
				tb.Fatal(err)
			}
			if off+n == len(b) {
				return int64(off)
			}
			off += n
		}
	}
	tests := []struct {
		name string
		// damage returns the file and the offset the error must name.
		damage func(tb testing.TB, active string, tail SegmentTail) (string, int64)
		// torn: without the record the same damage is a crash's torn
		// tail, which recovery cuts.
		torn bool
	}{
		{"cut inside the last frame", func(tb testing.TB, p string, tail SegmentTail) (string, int64) {
			truncate(tb, p, tail.Size-3)
			return p, tail.Size - 3
		}, true},
		{"cut at a frame boundary", func(tb testing.TB, p string, _ SegmentTail) (string, int64) {
			at := lastFrame(tb, p)
			truncate(tb, p, at)
			return p, at
		}, false},
		{"cut to nothing", func(tb testing.TB, p string, _ SegmentTail) (string, int64) {
			truncate(tb, p, 0)
			return p, 0
		}, false},
		{"bad crc on the last frame", func(tb testing.TB, p string, _ SegmentTail) (string, int64) {
			at := lastFrame(tb, p)
			flipByte(tb, p, -2)
			return p, at
		}, true},
		{"zero bytes appended", func(tb testing.TB, p string, tail SegmentTail) (string, int64) {
			appendBytes(tb, p, make([]byte, 64))
			return p, tail.Size
		}, true},
		{"half a frame appended", func(tb testing.TB, p string, tail SegmentTail) (string, int64) {
			appendBytes(tb, p, frame[:5])
			return p, tail.Size
		}, true},
		{"active segment removed", func(tb testing.TB, p string, _ SegmentTail) (string, int64) {
			if err := os.Remove(p); err != nil {
				tb.Fatal(err)
			}
			return p, 0
		}, false},
		{"shard directory removed", func(tb testing.TB, p string, _ SegmentTail) (string, int64) {
			if err := os.RemoveAll(filepath.Dir(p)); err != nil {
				tb.Fatal(err)
			}
			return p, 0
		}, false},
		{"a newer segment", func(tb testing.TB, p string, tail SegmentTail) (string, int64) {
			next := filepath.Join(filepath.Dir(p), fmt.Sprintf("%016d.wal", tail.Seq+1))
			if err := os.WriteFile(next, []byte{7, 0, 0}, 0o644); err != nil {
				tb.Fatal(err)
			}
			return next, 0
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{LogDir: t.TempDir()}
			active, tail := cleanJournal(t, opts)
			path, off := tt.damage(t, active, tail)
			before := dirState(t, opts.LogDir)
			opts.CleanShutdown = &tail
			_, _, err := RecoverJournal(opts)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("RecoverJournal error %v, want ErrCorrupt", err)
			}
			if want := fmt.Sprintf("%s at offset %d", path, off); !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name %q", err, want)
			}
			if after := dirState(t, opts.LogDir); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatal("the refused recovery changed the journal's files")
			}
			opts.CleanShutdown = nil
			if tt.torn {
				j, _, err := OpenJournal(opts)
				if err != nil {
					t.Fatalf("crash recovery of the same damage: %v", err)
				}
				mustClose(t, j)
			}
		})
	}
}

// TestCleanShutdownIntact: a journal left as the clean shutdown recorded
// it recovers everything, and a rollover's fresh segment is the recorded
// one.
func TestCleanShutdownIntact(t *testing.T) {
	opts := Options{LogDir: t.TempDir(), SegmentBytes: 256}
	j, _ := openJournal(t, opts)
	for i := uint64(1); i <= 20; i++ {
		j.AppendEntries(0, ents(1, i, i))
		mustFlush(t, j, false)
	}
	mustClose(t, j)
	tail := j.Tail()
	if n := len(segmentFiles(t, opts.LogDir, 0)); n < 3 {
		t.Fatalf("%d segments: the test wants rollovers", n)
	}
	opts.CleanShutdown = &tail
	j, st, err := RecoverJournal(opts)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, st[0].Entries, ents(1, 1, 20))
	if err := j.Start(); err != nil {
		t.Fatal(err)
	}
	j.AppendEntries(0, []*pb.Entry{ents(1, 21, 21)[0]})
	mustClose(t, j)
}

func truncate(tb testing.TB, path string, size int64) {
	tb.Helper()
	if err := os.Truncate(path, size); err != nil {
		tb.Fatal(err)
	}
}
