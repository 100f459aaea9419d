package multiraft

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkPropose measures concurrent proposals through the whole host
// (WAL write, commit, apply) on one node.
func BenchmarkPropose(b *testing.B) {
	for _, fsync := range []string{FsyncNever, FsyncAlways} {
		b.Run("fsync="+fsync, func(b *testing.B) { benchPropose(b, fsync) })
	}
}

func benchPropose(b *testing.B, fsync string) {
	cfg := baseConfig(b.TempDir())
	cfg.Fsync = fsync
	cfg.GroupCount, cfg.ShardCount = 16, 2
	n := startNode(b, cfg, nil)
	waitReady(b, n.h)
	payload := make([]byte, 128)
	var next atomic.Int64
	readies, fsyncs := shardTotals(n.h)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range 128 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if _, err := n.h.Propose(context.Background(), uint32(w%cfg.GroupCount), payload); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	r, f := shardTotals(n.h)
	b.ReportMetric(float64(r-readies)/float64(b.N), "readies/op")
	b.ReportMetric(float64(f-fsyncs)/float64(b.N), "fsyncs/op")
}

// shardTotals sums the Ready rounds and fsyncs of every shard worker.
func shardTotals(h *Host) (readies, fsyncs uint64) {
	for _, st := range h.ShardStats() {
		readies += st.ReadyBatches
		fsyncs += st.WAL.Fsyncs
	}
	return readies, fsyncs
}
