package coldfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// ErrCorrupt reports a cold object whose bytes do not match their
// checksums, or that does not decode: it must never be served.
var ErrCorrupt = errors.New("coldfmt: corrupt cold object")

// ChecksumBlockBytes is the data block size of the chunks this build
// writes: each block of a chunk's data has its own CRC-32C, so that a
// ranged read verifies what it fetched (a block) without the rest.
const ChecksumBlockBytes = 64 << 10

const (
	chunkMagic = 0x324b4355 // "UCK2" little endian
	// tailBytes is the fixed end of a footer: u64 data length, u32 record
	// count, u32 block size, u32 footer CRC, u32 magic.
	tailBytes = 24
	// minBlockBytes bounds the block size a footer may name (a reader
	// must not be made to allocate one CRC per byte).
	minBlockBytes = 512
)

// FooterSize is the size of the footer of a chunk of n data bytes with r
// record ends and blocks of blockBytes.
func FooterSize(n uint64, r int, blockBytes uint32) uint64 {
	return 4*blocks(n, blockBytes) + 8*uint64(r) + tailBytes
}

// ChunkSize is the object size of a chunk of n bytes and r records, as
// this build writes it.
func ChunkSize(n uint64, r int) uint64 { return n + FooterSize(n, r, ChecksumBlockBytes) }

func blocks(n uint64, b uint32) uint64 {
	k := n / uint64(b)
	if n%uint64(b) != 0 {
		k++
	}
	return k
}

// EncodeChunk builds a chunk object holding data (the concatenation of
// segments), which starts at position start, and the absolute record ends
// inside it (none for an external payload). It returns the object and its
// checksum (the footer's CRC), which the committed reference carries.
func EncodeChunk(start uint64, segments [][]byte, records []uint64) ([]byte, uint32) {
	return encodeChunk(start, segments, records, ChecksumBlockBytes)
}

func encodeChunk(start uint64, segments [][]byte, records []uint64, block uint32) ([]byte, uint32) {
	var n uint64
	for _, seg := range segments {
		n += uint64(len(seg))
	}
	out := make([]byte, 0, n+FooterSize(n, len(records), block))
	for _, seg := range segments {
		out = append(out, seg...)
	}
	for off := uint64(0); off < n; off += uint64(block) {
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(out[off:min(off+uint64(block), n)], castagnoli))
	}
	for _, r := range records {
		out = binary.LittleEndian.AppendUint64(out, r-start)
	}
	out = binary.LittleEndian.AppendUint64(out, n)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(records)))
	out = binary.LittleEndian.AppendUint32(out, block)
	crc := crc32.Checksum(out[n:], castagnoli)
	out = binary.LittleEndian.AppendUint32(out, crc)
	return binary.LittleEndian.AppendUint32(out, chunkMagic), crc
}

// Footer is a chunk's footer (everything after its data), parsed for its
// structure. Verify checks its own CRC; VerifyData checks data blocks
// against it. The bytes are shared, never copied.
type Footer struct {
	b       []byte
	n       uint64
	records int
	block   uint32
	blocks  int
}

// ParseFooter parses the footer of a chunk holding n data bytes. It checks
// the structure (lengths, magic, block size) in constant time, not the
// contents: see Verify, which a reader calls once, on the bytes it
// fetched, before it trusts them.
func ParseFooter(n uint64, b []byte) (Footer, error) {
	if len(b) < tailBytes {
		return Footer{}, fmt.Errorf("%w: footer of %d bytes is shorter than its tail", ErrCorrupt, len(b))
	}
	t := b[len(b)-tailBytes:]
	if binary.LittleEndian.Uint32(t[20:]) != chunkMagic {
		return Footer{}, fmt.Errorf("%w: chunk footer has no magic", ErrCorrupt)
	}
	if got := binary.LittleEndian.Uint64(t); got != n {
		return Footer{}, fmt.Errorf("%w: chunk footer names %d data bytes, the reference %d", ErrCorrupt, got, n)
	}
	r := uint64(binary.LittleEndian.Uint32(t[8:]))
	block := binary.LittleEndian.Uint32(t[12:])
	if block < minBlockBytes {
		return Footer{}, fmt.Errorf("%w: chunk footer names a block size of %d bytes", ErrCorrupt, block)
	}
	nb := blocks(n, block)
	if uint64(len(b)) != 4*nb+8*r+tailBytes {
		return Footer{}, fmt.Errorf("%w: chunk footer of %d bytes for %d blocks and %d records", ErrCorrupt, len(b), nb, r)
	}
	return Footer{b: b, n: n, records: int(r), block: block, blocks: int(nb)}, nil
}

// CRC is the footer's checksum as stored in it (the committed reference
// must carry the same).
func (f Footer) CRC() uint32 { return binary.LittleEndian.Uint32(f.b[len(f.b)-8:]) }

// Verify checks the footer against its stored CRC and against want, the
// checksum of the committed reference, which is authoritative, and that
// its record ends ascend within the data.
func (f Footer) Verify(want uint32) error {
	got := crc32.Checksum(f.b[:len(f.b)-8], castagnoli)
	if got != f.CRC() {
		return fmt.Errorf("%w: chunk footer CRC %08x, stored %08x", ErrCorrupt, got, f.CRC())
	}
	if got != want {
		return fmt.Errorf("%w: chunk footer CRC %08x, the committed reference %08x", ErrCorrupt, got, want)
	}
	prev := uint64(0)
	for i := range f.records {
		e := f.RecordEnd(i)
		if e <= prev || e > f.n {
			return fmt.Errorf("%w: chunk record end %d after %d in %d bytes", ErrCorrupt, e, prev, f.n)
		}
		prev = e
	}
	return nil
}

// DataBytes is the chunk's data length.
func (f Footer) DataBytes() uint64 { return f.n }

// BlockBytes is the chunk's checksum block size.
func (f Footer) BlockBytes() uint32 { return f.block }

// Records is the number of record ends.
func (f Footer) Records() int { return f.records }

// RecordEnd is record end i, relative to the chunk's start.
func (f Footer) RecordEnd(i int) uint64 {
	return binary.LittleEndian.Uint64(f.b[4*f.blocks+8*i:])
}

// Span widens the data range [lo, hi) to the checksum blocks it touches,
// the range VerifyData needs.
func (f Footer) Span(lo, hi uint64) (uint64, uint64) {
	b := uint64(f.block)
	return lo / b * b, min(blocks(hi, f.block)*b, f.n)
}

// VerifyData checks data, the chunk's bytes from off, against the block
// CRCs. off must start a block and data must end at a block end or at
// the end of the data (see Span).
func (f Footer) VerifyData(off uint64, data []byte) error {
	b := uint64(f.block)
	end := off + uint64(len(data))
	if off%b != 0 || end > f.n || (end%b != 0 && end != f.n) {
		return fmt.Errorf("%w: data range [%d, %d) is not whole checksum blocks of %d bytes in %d", ErrCorrupt, off, end, b, f.n)
	}
	for p := uint64(0); p < uint64(len(data)); p += b {
		i := int((off + p) / b)
		got := crc32.Checksum(data[p:min(p+b, uint64(len(data)))], castagnoli)
		if want := binary.LittleEndian.Uint32(f.b[4*i:]); got != want {
			return fmt.Errorf("%w: data block %d (bytes [%d, %d)) has CRC %08x, its footer %08x", ErrCorrupt, i, off+p, min(off+p+b, end), got, want)
		}
	}
	return nil
}

// DecodeChunk verifies a whole chunk object against crc (its committed
// reference's checksum) and returns its data and absolute record ends. The
// data shares body's memory.
func DecodeChunk(start, n uint64, body []byte, crc uint32) ([]byte, []uint64, error) {
	if uint64(len(body)) < n {
		return nil, nil, fmt.Errorf("%w: chunk of %d bytes holds no %d data bytes", ErrCorrupt, len(body), n)
	}
	f, err := ParseFooter(n, body[n:])
	if err != nil {
		return nil, nil, err
	}
	if err := f.Verify(crc); err != nil {
		return nil, nil, err
	}
	if err := f.VerifyData(0, body[:n]); err != nil {
		return nil, nil, err
	}
	recs := make([]uint64, f.Records())
	for i := range recs {
		recs[i] = start + f.RecordEnd(i)
	}
	return body[:n], recs, nil
}
