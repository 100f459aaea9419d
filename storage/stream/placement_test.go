package stream

import (
	"hash/fnv"
	"testing"
)

func TestGroupOfIsFNV1a64(t *testing.T) {
	tests := []struct{ bucket, stream string }{
		{"b", "s"}, {"__ds", "events/a/b"}, {"", ""}, {"bucket", "ünïcode"},
	}
	for _, tc := range tests {
		t.Run(tc.bucket+"/"+tc.stream, func(t *testing.T) {
			h := fnv.New64a()
			h.Write([]byte(tc.bucket + "/" + tc.stream))
			for _, g := range []int{1, 7, 64} {
				if got, want := GroupOf(tc.bucket, tc.stream, g), uint32(h.Sum64()%uint64(g)); got != want {
					t.Fatalf("GroupOf(G=%d) = %d, want %d", g, got, want)
				}
			}
		})
	}
}

// TestGroupOfVectors pins the rule gateways route by
// (gateway/upstream has the same vectors).
func TestGroupOfVectors(t *testing.T) {
	for _, v := range []struct {
		bucket, stream string
		groups         int
		want           uint32
	}{
		{"__ds", "orders", 64, 14},
		{"tenant-a", "s17", 7, 1},
	} {
		if got := GroupOf(v.bucket, v.stream, v.groups); got != v.want {
			t.Errorf("GroupOf(%q, %q, %d) = %d, want %d", v.bucket, v.stream, v.groups, got, v.want)
		}
	}
}
