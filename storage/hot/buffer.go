package hot

// Chunks start small and double up to maxChunk, so that thousands of
// mostly idle streams do not each hold a large, mostly empty chunk. Appends
// larger than the next chunk get a chunk of their own, so one huge append is
// one allocation.
const (
	firstChunk = 512
	maxChunk   = 64 << 10
	chunkSize  = maxChunk
)

// Buffer is an append-only byte sequence starting at a base position.
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
	end := b.End()
	if n := len(b.chunks); n > 0 {
		last := &b.chunks[n-1]
		if free := cap(last.buf) - len(last.buf); free > 0 {
			k := min(free, len(p))
			last.buf = append(last.buf, p[:k]...)
			p = p[k:]
			b.size += uint64(k)
			end += uint64(k)
		}
	}
	if len(p) == 0 {
		return
	}
	next := firstChunk
	if n := len(b.chunks); n > 0 {
		next = min(2*cap(b.chunks[n-1].buf), maxChunk)
	}
	c := make([]byte, len(p), max(len(p), next))
	copy(c, p)
	b.chunks = append(b.chunks, chunk{start: end, buf: c})
	b.size += uint64(len(p))
}

// ReadAt appends the bytes in [from, to) to dst and returns it. The range
// must lie within [Base, End).
func (b *Buffer) ReadAt(dst []byte, from, to uint64) []byte {
	if from >= to {
		return dst
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
