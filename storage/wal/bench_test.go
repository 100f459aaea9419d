package wal

import (
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
)

// BenchmarkBatch measures what a shard worker asks of its journal per
// Ready of one group under fsync "never": one entry of a 300-byte
// proposal, the hard state, and the write. allocs/op is what to track.
func BenchmarkBatch(b *testing.B) { benchBatch(b, false) }

// BenchmarkSyncedBatch is BenchmarkBatch under fsync "always": one fsync
// per batch, into the zeros written ahead of the frames.
func BenchmarkSyncedBatch(b *testing.B) { benchBatch(b, true) }

func benchBatch(b *testing.B, sync bool) {
	j, _ := openJournal(b, Options{LogDir: b.TempDir()})
	defer mustClose(b, j)
	data := make([]byte, 300)
	ent := []*pb.Entry{{Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: data}}
	st := hs(1, 1, 0)
	b.ReportAllocs()
	var i uint64
	for b.Loop() {
		i++
		ent[0].Index = &i
		st.Commit = &i
		j.AppendEntries(3, ent)
		j.SetHardState(3, st)
		mustFlush(b, j, sync)
	}
}
