package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// BenchmarkAppend measures a producer's 256-byte append through the engine
// of one node (validation, proposal encoding, Raft, the WAL, apply), from
// 64 writers on 64 streams, one append in flight each, as the bench's
// multi-stream workload does. allocs/op and B/op are what to track; ns/op
// depends on the machine's load.
func BenchmarkAppend(b *testing.B) {
	for _, fsync := range []string{"never", "always"} {
		b.Run("fsync="+fsync, func(b *testing.B) { benchAppend(b, fsync) })
	}
}

func benchAppend(b *testing.B, fsync string) {
	cfg := testConfig(b.TempDir())
	cfg.Fsync = fsync
	cfg.SnapshotEntries, cfg.SnapshotBytes = 100_000, 64<<20 // no snapshot in a run: they are not the append path's cost
	e := startEngineAt(b, cfg, nil)
	const writers = 64
	for w := range writers {
		mustCreate(b, e, &streamv1.CreateStreamRequest{Ref: ref(fmt.Sprintf("s%d", w)), ContentType: "application/octet-stream"})
	}
	body := make([]byte, 256)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			r, id := ref(fmt.Sprintf("s%d", w)), fmt.Sprintf("w%d", w)
			for seq := uint64(0); next.Add(1) <= int64(b.N); seq++ {
				_, err := e.Append(b.Context(), &streamv1.AppendRequest{Ref: r, ContentType: "application/octet-stream", Body: body,
					Producer: &streamv1.Producer{Id: id, Epoch: 0, Seq: seq}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
