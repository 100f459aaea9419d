package upstream

import (
	"hash/fnv"
	"testing"
)

// TestGroupOfVectors pins the placement rule (storage/stream has the same
// vectors).
func TestGroupOfVectors(t *testing.T) {
	for _, v := range []struct {
		bucket, stream string
		groups         int
		want           uint32
	}{
		{"__ds", "orders", 64, 14},
		{"tenant-a", "s17", 7, 1},
	} {
		if got := groupOf(v.bucket, v.stream, v.groups); got != v.want {
			t.Errorf("groupOf(%q, %q, %d) = %d, want %d", v.bucket, v.stream, v.groups, got, v.want)
		}
		h := fnv.New64a()
		h.Write([]byte(v.bucket + "/" + v.stream))
		if got := groupOf(v.bucket, v.stream, v.groups); got != uint32(h.Sum64()%uint64(v.groups)) {
			t.Errorf("groupOf(%q, %q) is not FNV-1a 64", v.bucket, v.stream)
		}
	}
}
