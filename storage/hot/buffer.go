package hot

// Chunk sizes. The last chunk grows by reallocation (from firstChunk, see
// grownCap) up to maxChunk, so that thousands of mostly idle streams do
// not each hold a large, mostly empty chunk, while a stream of up to
// maxChunk bytes is contiguous and reads of it need no copy. An append
// never straddles two chunks; one that does not fit starts a new chunk (of
// maxChunk, or of its own size when larger).
const (
	firstChunk = 512
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
type Buffer struct {
	base   uint64
	size   uint64
	chunks []chunk
}

type chunk struct {
	start uint64 // absolute position of buf[0]
	buf   []byte
}

// NewBuffer returns an empty buffer whose first byte will be at base.
func NewBuffer(base uint64) *Buffer { return &Buffer{base: base} }

// Base is the absolute position of the first byte.
func (b *Buffer) Base() uint64 { return b.base }

// End is the absolute position just past the last byte.
func (b *Buffer) End() uint64 { return b.base + b.size }

// Len is the number of bytes held.
func (b *Buffer) Len() uint64 { return b.size }

// Append copies p to the end of the buffer.
func (b *Buffer) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	b.size += uint64(len(p))
	if n := len(b.chunks); n > 0 {
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
	if len(b.chunks) > 0 {
		size = maxChunk
	}
	c := make([]byte, len(p), max(len(p), size))
	copy(c, p)
	b.chunks = append(b.chunks, chunk{start: b.End() - uint64(len(p)), buf: c})
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
// must lie within [Base, End).
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
		lo := from - c.start
		hi := min(to-c.start, uint64(len(c.buf)))
		dst = append(dst, c.buf[lo:hi]...)
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
	if to > c.start+uint64(len(c.buf)) {
		return nil, false
	}
	lo, hi := from-c.start, to-c.start
	return c.buf[lo:hi:hi], true
}

// ChunkEnd returns the end of the chunk holding pos (within [Base, End)):
// always an append boundary.
func (b *Buffer) ChunkEnd(pos uint64) uint64 {
	c := b.chunks[b.chunkIndex(pos)]
	return c.start + uint64(len(c.buf))
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
		c := b.chunks[mid]
		if pos >= c.start+uint64(len(c.buf)) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
