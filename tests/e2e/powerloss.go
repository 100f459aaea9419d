package e2e

import (
	"os"
	"path/filepath"
	"slices"

	raftpb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal"
)

// JournalSyncedFloor is the end of the last frame of a journal segment
// that the node synced before it went on, under fsync "never": a
// checkpoint, a snapshot marker (older snapshot files are deleted once it
// is durable), a recovery plan's truncation, a membership entry, a hard
// state with a new term or vote. A power loss takes only what the page
// cache held, so a test that simulates one never cuts below it; what the
// same fsync carried after that frame is kept too, conservatively, for the
// cut to stay a loss the node could suffer.
func JournalSyncedFloor(data []byte) int {
	floor, _ := journalFloorAndEnd(data)
	return floor
}

// journalFloorAndEnd returns JournalSyncedFloor and the end of the
// segment's frames: the zeros the journal writes ahead of them follow it.
func journalFloorAndEnd(data []byte) (floor, end int) {
	type termVote struct{ term, vote uint64 }
	last := map[uint32]termVote{}
	off := 0
	for off < len(data) {
		typ, payload, n, err := wal.DecodeFrame(data[off:])
		if err != nil {
			break
		}
		off += n
		rec, err := wal.DecodeRecord(typ, payload)
		if err != nil {
			break
		}
		synced := false
		switch rec.Type {
		case wal.RecordCheckpoint:
			synced = true
			for _, g := range rec.Checkpoint {
				last[g.Group] = termVote{g.HardState.GetTerm(), g.HardState.GetVote()}
			}
		case wal.RecordSnapshot, wal.RecordTruncate:
			synced = true
		case wal.RecordEntries:
			for _, e := range rec.Entries {
				if e.GetType() != raftpb.EntryNormal {
					synced = true
				}
			}
		case wal.RecordHardState:
			now := termVote{rec.HardState.GetTerm(), rec.HardState.GetVote()}
			if prev, ok := last[rec.Group]; !ok || prev != now {
				synced = true
			}
			last[rec.Group] = now
		}
		if synced {
			floor = off
		}
	}
	return floor, off
}

// CutJournalTail truncates the newest segment of every journal shard in
// dataDir to drop(room) bytes short of the end of its frames, where room
// is what a power loss could take (the bytes above JournalSyncedFloor, at
// most maxFraction of the frames), and returns the frame bytes cut.
//
// A power loss also reboots the host: the node's running record, which
// names the boot it ran in, is removed, as its next start could not match
// it (a record of another boot and none are the same to it).
func CutJournalTail(dataDir string, maxFraction float64, drop func(room int64) int64) (int64, error) {
	var cut int64
	if err := os.Remove(filepath.Join(wal.LogDir(dataDir), wal.RunningFile)); err != nil && !os.IsNotExist(err) {
		return 0, err
	}
	shards, _ := filepath.Glob(filepath.Join(dataDir, "raft-log", "shard-*"))
	for _, sh := range shards {
		segs, _ := filepath.Glob(filepath.Join(sh, "*.wal"))
		if len(segs) == 0 {
			continue
		}
		slices.Sort(segs)
		last := segs[len(segs)-1]
		data, err := os.ReadFile(last)
		if err != nil {
			return cut, err
		}
		floor, end := journalFloorAndEnd(data)
		size := int64(end) // the zeros past the frames go with the cut
		room := min(int64(float64(size)*maxFraction), size-int64(floor))
		if room < 1 {
			continue
		}
		d := drop(room)
		if err := os.Truncate(last, size-d); err != nil {
			return cut, err
		}
		cut += d
	}
	return cut, nil
}
