package upstream

import (
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// BenchmarkAppend routes appends to a fake 3-node cluster over loopback
// gRPC: the router's and the gRPC client's cost per call (the fake node's
// server side is in the same process and counted too).
func BenchmarkAppend(b *testing.B) {
	c := newFakeCluster(b, 3, 4)
	r, err := New(Config{Nodes: c.addrs(), DialTimeout: time.Second, RefreshInterval: time.Hour}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	req := &streamv1.AppendRequest{Ref: ref("b", "s"), Body: make([]byte, 256)}
	if _, err := r.Append(b.Context(), req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.Append(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
