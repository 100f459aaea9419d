package hot

// Chunk sizes. The last chunk grows by reallocation (from firstChunk, see
// grownCap) up to maxChunk, so that thousands of mostly idle streams do
// not each hold a large, mostly empty chunk (a million streams appended
// to once with 256 bytes held twice that in 512-byte first chunks), while a stream of up to
// maxChunk bytes is contiguous and reads of it need no copy. An append
// never straddles two chunks; one that does not fit starts a new chunk (of
// maxChunk, or of its own size when larger).
const (
	firstChunk = 64
	maxChunk   = 1 << 20
	chunkSize  = maxChunk
)

// Buffer is an append-only byte sequence starting at a base position.
//
// Stored bytes are never modified: appends write only past the end of the
// last chunk, and growing a chunk copies it to a new array, leaving the old
// one untouched for readers that still hold slices of it. So slices
// returned by Slice stay valid and unchanged after the lock that guarded
// the call is released.
//
// A buffer may also hold holes: ranges whose bytes live elsewhere (an
// external payload object), recorded with a caller's tag. Holes count
// towards positions but not towards Bytes; reads of bytes must not cross
// one (NextHole finds them).
type Buffer struct {
	base   uint64
	size   uint64 // positions covered, holes included
	bytes  uint64 // bytes held in memory
	chunks []chunk
}

type chunk struct {
	start uint64 // absolute position of buf[0]
	buf   []byte
	hole  uint64 // length of a hole chunk (buf is nil)
	tag   any
}

func (c *chunk) length() uint64 {
	if c.hole > 0 {
		return c.hole
	}
	return uint64(len(c.buf))
}

// MakeBuffer returns an empty buffer whose first byte will be at base (a
// stream holds it by value: one object less per stream).
func MakeBuffer(base uint64) Buffer { return Buffer{base: base} }

// Base is the absolute position of the first byte.
func (b *Buffer) Base() uint64 { return b.base }

// End is the absolute position just past the last byte.
func (b *Buffer) End() uint64 { return b.base + b.size }

// Len is the number of positions covered, holes included.
func (b *Buffer) Len() uint64 { return b.size }

// Bytes is the number of bytes held in memory (holes excluded).
func (b *Buffer) Bytes() uint64 { return b.bytes }

// Append copies p to the end of the buffer.
func (b *Buffer) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	b.size += uint64(len(p))
	b.bytes += uint64(len(p))
	if n := len(b.chunks); n > 0 && b.chunks[n-1].hole == 0 {
		last := &b.chunks[n-1]
		l := len(last.buf)
		switch {
		case cap(last.buf)-l >= len(p):
			last.buf = append(last.buf, p...)
			return
		case l+len(p) <= maxChunk:
			grown := make([]byte, l+len(p), grownCap(cap(last.buf), l+len(p)))
			copy(grown, last.buf)
			copy(grown[l:], p)
			last.buf = grown
			return
		}
	}
	size := firstChunk
	if len(b.chunks) > 0 && b.chunks[len(b.chunks)-1].hole == 0 {
		size = maxChunk
	}
	c := make([]byte, len(p), max(len(p), size))
	copy(c, p)
	b.chunks = append(b.chunks, chunk{start: b.End() - uint64(len(p)), buf: c})
}

// AppendHole adds n positions whose bytes are held elsewhere, described
// by tag.
func (b *Buffer) AppendHole(n uint64, tag any) {
	if n == 0 {
		return
	}
	b.chunks = append(b.chunks, chunk{start: b.End(), hole: n, tag: tag})
	b.size += n
}

// Hole reports the hole holding pos, if any.
func (b *Buffer) Hole(pos uint64) (start, end uint64, tag any, ok bool) {
	if pos < b.base || pos >= b.End() {
		return 0, 0, nil, false
	}
	c := b.chunks[b.chunkIndex(pos)]
	if c.hole == 0 {
		return 0, 0, nil, false
	}
	return c.start, c.start + c.hole, c.tag, true
}

// NextHole returns the start of the first hole at or after from and before
// to, or to when there is none.
func (b *Buffer) NextHole(from, to uint64) uint64 {
	if from >= to || from >= b.End() {
		return to
	}
	for i := b.chunkIndex(max(from, b.base)); i < len(b.chunks); i++ {
		c := &b.chunks[i]
		if c.start >= to {
			break
		}
		if c.hole > 0 {
			return max(c.start, from)
		}
	}
	return to
}

// Holes calls fn for every hole, in position order.
func (b *Buffer) Holes(fn func(start, end uint64, tag any)) {
	for i := range b.chunks {
		if c := &b.chunks[i]; c.hole > 0 {
			fn(c.start, c.start+c.hole, c.tag)
		}
	}
}

// TrimTo drops everything before pos (Base <= pos <= End) and returns the
// number of bytes it freed. A chunk that straddles pos is copied, so that
// slices handed out before stay unchanged; a hole must not straddle pos.
func (b *Buffer) TrimTo(pos uint64) uint64 {
	if pos <= b.base {
		return 0
	}
	var freed uint64
	i := 0
	for ; i < len(b.chunks); i++ {
		c := &b.chunks[i]
		end := c.start + c.length()
		if end > pos {
			break
		}
		freed += uint64(len(c.buf))
	}
	rest := b.chunks[i:]
	if len(rest) > 0 && rest[0].start < pos {
		c := rest[0]
		if c.hole > 0 {
			panic("hot: TrimTo inside a hole")
		}
		cut := pos - c.start
		tail := make([]byte, uint64(len(c.buf))-cut, max(uint64(len(c.buf))-cut, firstChunk))
		copy(tail, c.buf[cut:])
		rest[0] = chunk{start: pos, buf: tail}
		freed += cut
	}
	b.chunks = append([]chunk(nil), rest...)
	b.size -= pos - b.base
	b.bytes -= freed
	b.base = pos
	return freed
}

// grownCap is the capacity a chunk of capacity c grows to when it must
// hold need bytes: double while small, then a quarter more (like append),
// so that the spare room of a stream's last chunk stays a small part of
// it; rounded up to whole pages, which a large allocation takes anyway.
func grownCap(c, need int) int {
	n := 2 * c
	if c >= 16<<10 {
		n = c + c/4
	}
	n = max(n, need)
	if n > 32<<10 {
		n = (n + pageSize - 1) &^ (pageSize - 1)
	}
	return min(n, maxChunk)
}

// pageSize is the Go runtime's page: large allocations are whole pages.
const pageSize = 8 << 10

// ReadAt appends the bytes in [from, to) to dst and returns it. The range
// must lie within [Base, End) and hold no hole.
func (b *Buffer) ReadAt(dst []byte, from, to uint64) []byte {
	if from >= to {
		return dst
	}
	if dst == nil {
		dst = make([]byte, 0, to-from)
	}
	i := b.chunkIndex(from)
	for ; i < len(b.chunks) && from < to; i++ {
		c := b.chunks[i]
		if c.hole > 0 {
			panic("hot: ReadAt across a hole")
		}
		lo := from - c.start
		hi := min(to-c.start, uint64(len(c.buf)))
		dst = append(dst, c.buf[lo:hi]...)
		from = c.start + hi
	}
	return dst
}

// Segments returns the bytes in [from, to) as slices of the stored chunks,
// without copying. The range must lie within [Base, End) and hold no hole;
// the slices must not be modified.
func (b *Buffer) Segments(from, to uint64) [][]byte {
	return b.AppendSegments(nil, from, to)
}

// AppendHeld appends the bytes held in memory, holes left out, in position
// order, to dst as slices of the stored chunks (which, like Segments', stay
// unchanged).
func (b *Buffer) AppendHeld(dst [][]byte) [][]byte {
	for i := range b.chunks {
		if c := &b.chunks[i]; c.hole == 0 && len(c.buf) > 0 {
			dst = append(dst, c.buf[:len(c.buf):len(c.buf)])
		}
	}
	return dst
}

// AppendSegments is Segments appending to dst.
func (b *Buffer) AppendSegments(dst [][]byte, from, to uint64) [][]byte {
	for i := b.chunkIndex(from); i < len(b.chunks) && from < to; i++ {
		c := b.chunks[i]
		if c.hole > 0 {
			panic("hot: Segments across a hole")
		}
		lo := from - c.start
		hi := min(to-c.start, uint64(len(c.buf)))
		dst = append(dst, c.buf[lo:hi:hi])
		from = c.start + hi
	}
	return dst
}

// Slice returns the bytes in [from, to) without copying them when they lie
// in one chunk (ok is false otherwise). The range must lie within
// [Base, End). The result must not be modified; its capacity is its length,
// so appending to it copies.
func (b *Buffer) Slice(from, to uint64) ([]byte, bool) {
	if from >= to {
		return nil, true
	}
	c := b.chunks[b.chunkIndex(from)]
	if c.hole > 0 || to > c.start+uint64(len(c.buf)) {
		return nil, false
	}
	lo, hi := from-c.start, to-c.start
	return c.buf[lo:hi:hi], true
}

// ChunkEnd returns the end of the chunk holding pos (within [Base, End)):
// always an append boundary.
func (b *Buffer) ChunkEnd(pos uint64) uint64 {
	c := b.chunks[b.chunkIndex(pos)]
	return c.start + c.length()
}

// ByteAt returns the byte at absolute position pos (within [Base, End)).
func (b *Buffer) ByteAt(pos uint64) byte {
	c := b.chunks[b.chunkIndex(pos)]
	return c.buf[pos-c.start]
}

// chunkIndex finds the chunk holding pos by binary search.
func (b *Buffer) chunkIndex(pos uint64) int {
	lo, hi := 0, len(b.chunks)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		c := &b.chunks[mid]
		if pos >= c.start+c.length() {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
