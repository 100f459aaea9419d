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
			b := MakeBuffer(tc.base)
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

func TestBufferSliceIsStable(t *testing.T) {
	b := MakeBuffer(100)
	var want []byte
	type held struct {
		from, to uint64
		p        []byte
	}
	var slices []held
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 3000; i++ {
		n := 1 + r.IntN(2000)
		if i%500 == 0 {
			n = maxChunk + 3 // an append larger than a chunk
		}
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(r.Uint32())
		}
		start := b.End()
		b.Append(p)
		want = append(want, p...)
		if b.ChunkEnd(start) < start+uint64(n) {
			t.Fatalf("append %d straddles chunks", i)
		}
		from := 100 + uint64(r.IntN(len(want)))
		to := from + uint64(r.IntN(int(b.End()-from)+1))
		if s, ok := b.Slice(from, to); ok {
			if cap(s) != len(s) {
				t.Fatalf("Slice capacity %d > length %d", cap(s), len(s))
			}
			slices = append(slices, held{from, to, s})
		} else if to <= b.ChunkEnd(from) {
			t.Fatalf("Slice(%d, %d) within one chunk was refused", from, to)
		}
	}
	for _, h := range slices {
		if !bytes.Equal(h.p, want[h.from-100:h.to-100]) {
			t.Fatalf("slice [%d, %d) changed after later appends", h.from, h.to)
		}
	}
}

func TestBufferGrowth(t *testing.T) {
	b := MakeBuffer(0)
	for range 1000 {
		b.Append(make([]byte, 200))
	}
	if len(b.chunks) != 1 {
		t.Fatalf("200 kB of small appends use %d chunks, want 1", len(b.chunks))
	}
	if c := cap(b.chunks[0].buf); c > 200*1000*5/4+pageSize {
		t.Fatalf("chunk capacity %d for 200 kB", c)
	}
	for range 5000 {
		b.Append(make([]byte, 1000))
	}
	for i, c := range b.chunks {
		if len(c.buf) > maxChunk {
			t.Fatalf("chunk %d holds %d bytes", i, len(c.buf))
		}
	}
}

func TestBufferHolesAndTrim(t *testing.T) {
	b := MakeBuffer(10)
	b.Append([]byte("abcdef"))
	b.AppendHole(100, "ext")
	b.Append([]byte("xyz"))
	if b.End() != 119 || b.Bytes() != 9 || b.Len() != 109 {
		t.Fatalf("end %d bytes %d len %d", b.End(), b.Bytes(), b.Len())
	}
	if got := b.NextHole(10, 200); got != 16 {
		t.Fatalf("NextHole = %d, want 16", got)
	}
	if got := b.NextHole(116, 119); got != 119 {
		t.Fatalf("NextHole past the hole = %d, want 119", got)
	}
	if s, e, tag, ok := b.Hole(50); !ok || s != 16 || e != 116 || tag != "ext" {
		t.Fatalf("Hole(50) = %d %d %v %v", s, e, tag, ok)
	}
	if _, _, _, ok := b.Hole(12); ok {
		t.Fatal("Hole(12) found a hole in bytes")
	}
	if got := string(bytes.Join(b.AppendHeld(nil), nil)); got != "abcdefxyz" {
		t.Fatalf("held bytes %q, want the bytes around the hole", got)
	}
	old, _ := b.Slice(12, 16)
	if freed := b.TrimTo(12); freed != 2 {
		t.Fatalf("TrimTo(12) freed %d, want 2", freed)
	}
	if string(old) != "cdef" {
		t.Fatalf("a slice taken before the trim changed: %q", old)
	}
	if got := string(b.ReadAt(nil, 12, 16)); got != "cdef" {
		t.Fatalf("after trim ReadAt = %q", got)
	}
	if freed := b.TrimTo(116); freed != 4 {
		t.Fatalf("TrimTo(116) freed %d, want 4", freed)
	}
	if got := string(bytes.Join(b.AppendHeld(nil), nil)); got != "xyz" {
		t.Fatalf("held bytes after trimming the hole %q", got)
	}
	if b.Base() != 116 || b.Bytes() != 3 || string(b.ReadAt(nil, 116, 119)) != "xyz" {
		t.Fatalf("after trimming the hole: base %d bytes %d", b.Base(), b.Bytes())
	}
	b.Append([]byte("!"))
	if got := string(b.ReadAt(nil, 116, 120)); got != "xyz!" {
		t.Fatalf("append after trim: %q", got)
	}
	if freed := b.TrimTo(120); freed != 4 || b.Len() != 0 {
		t.Fatalf("TrimTo(End) freed %d, len %d", freed, b.Len())
	}
}
