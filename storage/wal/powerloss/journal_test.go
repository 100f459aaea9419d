package powerloss_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
	"github.com/ursula/ursula/storage/wal/powerloss"
)

func entry(i uint64) *pb.Entry {
	return &pb.Entry{Index: new(i), Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: fmt.Appendf(nil, "entry %d", i)}
}

// TestJournal runs the real journal on the model: what a synced Flush
// wrote survives every loss; what an unsynced one wrote survives as a
// prefix, or not at all.
func TestJournal(t *testing.T) {
	const synced, written = 40, 100
	for _, loss := range []powerloss.Loss{
		{},
		{Writeback: true},
		{Writeback: true, Tear: powerloss.TearZeros},
		{Tear: powerloss.TearZeros},
	} {
		// Nothing syncs the log directory after RecoverJournal created
		// the shard directory in it (MkdirAll): a strict loss would take
		// the whole shard directory, synced segments included. The loss
		// keeps new directories, as ext4 and XFS do in practice.
		loss.KeepNewDirs = true
		loss.Seed = powerloss.Seed(t)
		t.Run(loss.String(), func(t *testing.T) {
			logDir := filepath.Join(t.TempDir(), "raft-log")
			fsys := powerloss.New(filepath.Dir(logDir))
			j, _, err := wal.OpenJournal(wal.Options{FS: fsys, LogDir: logDir, SegmentBytes: 2 << 10})
			if err != nil {
				t.Fatal(err)
			}
			for i := uint64(1); i <= written; i++ {
				j.AppendEntries(7, []*pb.Entry{entry(i)})
				j.SetHardState(7, &pb.HardState{Term: new(uint64(1)), Commit: new(i)})
				if err := j.Flush(i <= synced); err != nil {
					t.Fatal(err)
				}
			}
			mustLose(t, fsys, loss)
			if err := j.Close(); !errors.Is(err, powerloss.ErrPowerLost) {
				t.Fatalf("Close after the loss: %v, want ErrPowerLost", err)
			}

			j2, states, err := wal.OpenJournal(wal.Options{FS: powerloss.New(filepath.Dir(logDir)), LogDir: logDir, SegmentBytes: 2 << 10})
			if err != nil {
				t.Fatalf("reopen after the loss: %v", err)
			}
			defer j2.Close()
			st := states[7]
			if st == nil {
				t.Fatal("group 7 lost")
			}
			n := uint64(len(st.Entries))
			if n < synced || n > written {
				t.Fatalf("recovered %d entries, want between %d and %d", n, synced, written)
			}
			for k, e := range st.Entries {
				if e.GetIndex() != uint64(k)+1 || string(e.GetData()) != fmt.Sprintf("entry %d", k+1) {
					t.Fatalf("entry %d recovered as %v", k+1, e)
				}
			}
			if c := st.HardState.GetCommit(); c < synced || c > n {
				t.Fatalf("recovered commit %d with %d entries (synced %d)", c, n, synced)
			}
		})
	}
}

// TestJournalWriteCutShortInItsZerosIsNoDamage: the journal writes zeros
// ahead of its frames, so a write the power cut short leaves a frame of
// full length whose end is still zeros. Recovery must cut it as the
// incomplete write it is, not gate the shard's groups as if an
// acknowledged frame had been damaged.
func TestJournalWriteCutShortInItsZerosIsNoDamage(t *testing.T) {
	base := powerloss.Seed(t)
	for k := range uint64(64) {
		loss := powerloss.Loss{Seed: base + k, Writeback: true, KeepNewDirs: true}
		logDir := filepath.Join(t.TempDir(), "raft-log")
		fsys := powerloss.New(filepath.Dir(logDir))
		j, _, err := wal.OpenJournal(wal.Options{FS: fsys, LogDir: logDir})
		if err != nil {
			t.Fatal(err)
		}
		big := func(i uint64) *pb.Entry {
			e := entry(i)
			e.Data = bytes.Repeat([]byte{byte(i)}, 6000) // frames across several sectors
			return e
		}
		for i := uint64(1); i <= 3; i++ {
			j.AppendEntries(7, []*pb.Entry{big(i)})
			j.SetHardState(7, &pb.HardState{Term: new(uint64(1)), Commit: new(i)})
			if err := j.Flush(i <= 2); err != nil {
				t.Fatal(err)
			}
		}
		r := mustLose(t, fsys, loss)
		_ = j.Close()
		j2, states, err := wal.OpenJournal(wal.Options{FS: powerloss.New(filepath.Dir(logDir)), LogDir: logDir})
		if err != nil {
			t.Fatalf("%v: reopen after the loss: %v", loss, err)
		}
		if j2.DamagedTail() {
			t.Fatalf("%v (%v): a write cut short in the zeros ahead of the frames counted as damage", loss, r)
		}
		if n := len(states[7].Entries); n < 2 || n > 3 {
			t.Fatalf("%v: recovered %d entries, want the 2 synced and perhaps the third", loss, n)
		}
		_ = j2.Close()
	}
}
