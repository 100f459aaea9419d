package tier

import (
	"context"
	"strings"
	"testing"

	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

func TestBoundary(t *testing.T) {
	ctx := context.Background()
	s := objstore.NewMemory()
	r := NewReader(NewCache(s, 4, 64))
	bin := putChunk(t, s, "b/c/1", 10, "aaaa", "bbbbbb", "cc") // records at 14, 20, 22
	js := putChunk(t, s, "b/c/2", 0, "{\"a\":1}\n{\"b\":2}\n", "{\"c\":3}\n")
	tests := []struct {
		name string
		pos  uint64
		json bool
		want bool
		err  bool
	}{
		{"bytes: record end", 14, false, true, false},
		{"bytes: inside an append", 15, false, false, false},
		{"bytes: chunk end", 22, false, true, false},
		{"bytes: at the start (not inside)", 10, false, false, true},
		{"bytes: past the end", 23, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Boundary(ctx, bin, tt.pos, tt.json)
			if got != tt.want || (err != nil) != tt.err {
				t.Fatalf("Boundary(%d) = %v, %v", tt.pos, got, err)
			}
		})
	}
	for pos, want := range map[uint64]bool{3: false, 8: true, 12: false, 16: true, 24: true} {
		if got, err := r.Boundary(ctx, js, pos, true); got != want || err != nil {
			t.Fatalf("json Boundary(%d) = %v, %v; want %v", pos, got, err, want)
		}
	}
	k1, k2 := coldfmt.SnapshotKey("b/x/1/", 8, "d"), coldfmt.SnapshotKey("b/x/1/", 8, "d")
	if !strings.HasPrefix(k1, "b/x/1/s/00000000000000000008-d-") || k1 == k2 {
		t.Fatalf("snapshot keys %q, %q: want the prefix, position and digest, and a nonce", k1, k2)
	}
}
