package hot

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestBufferMatchesContiguousCopy(t *testing.T) {
	tests := []struct {
		name  string
		base  uint64
		sizes []int
	}{
		{"small appends", 0, []int{1, 2, 3, 100, 5000}},
		{"chunk-sized appends", 10, []int{chunkSize, chunkSize - 1, 2, chunkSize + 7}},
		{"one huge append", 7, []int{3 * chunkSize}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuffer(tc.base)
			var want []byte
			r := rand.New(rand.NewPCG(1, 2))
			for _, n := range tc.sizes {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(r.Uint32())
				}
				b.Append(p)
				want = append(want, p...)
			}
			if b.End() != tc.base+uint64(len(want)) {
				t.Fatalf("End = %d, want %d", b.End(), tc.base+uint64(len(want)))
			}
			for i := 0; i < 200; i++ {
				from := r.IntN(len(want) + 1)
				to := from + r.IntN(len(want)-from+1)
				got := b.ReadAt(nil, tc.base+uint64(from), tc.base+uint64(to))
				if !bytes.Equal(got, want[from:to]) {
					t.Fatalf("ReadAt(%d,%d) mismatch", from, to)
				}
				if to > from && b.ByteAt(tc.base+uint64(from)) != want[from] {
					t.Fatalf("ByteAt(%d) mismatch", from)
				}
			}
		})
	}
}
