package placement

import (
	"hash/fnv"
	"testing"
)

func TestGroupMatchesFNV1a64(t *testing.T) {
	tests := []struct{ bucket, stream string }{
		{"b", "s"}, {"__ds", "events/a/b"}, {"", ""}, {"bucket", "ünïcode"},
	}
	for _, tc := range tests {
		t.Run(tc.bucket+"/"+tc.stream, func(t *testing.T) {
			h := fnv.New64a()
			h.Write([]byte(tc.bucket + "/" + tc.stream))
			for _, g := range []int{1, 7, 64} {
				if got, want := Group(tc.bucket, tc.stream, g), uint32(h.Sum64()%uint64(g)); got != want {
					t.Fatalf("Group(G=%d) = %d, want %d", g, got, want)
				}
			}
		})
	}
}
