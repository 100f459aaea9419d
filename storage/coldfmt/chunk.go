package coldfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	chunkMagic   = 0x314b4355 // "UCK1" little endian
	trailerBytes = 8
)

// EncodeChunk builds a chunk object holding data (the concatenation of
// segments), which starts at position start, and the absolute record ends
// inside it.
func EncodeChunk(start uint64, segments [][]byte, records []uint64) []byte {
	n := 0
	for _, seg := range segments {
		n += len(seg)
	}
	out := make([]byte, 0, n+8*len(records)+trailerBytes)
	for _, seg := range segments {
		out = append(out, seg...)
	}
	for _, r := range records {
		out = binary.LittleEndian.AppendUint64(out, r-start)
	}
	out = binary.LittleEndian.AppendUint32(out, uint32(len(records)))
	return binary.LittleEndian.AppendUint32(out, chunkMagic)
}

// ChunkSize is the object size of a chunk of n bytes and r records.
func ChunkSize(n uint64, r int) uint64 { return n + 8*uint64(r) + trailerBytes }

// DecodeRecords parses the record section and trailer of a chunk (the
// bytes after its data) into absolute record ends.
func DecodeRecords(start uint64, tail []byte) ([]uint64, error) {
	if len(tail) < trailerBytes {
		return nil, errors.New("coldfmt: chunk trailer is truncated")
	}
	t := tail[len(tail)-trailerBytes:]
	n := binary.LittleEndian.Uint32(t)
	if binary.LittleEndian.Uint32(t[4:]) != chunkMagic {
		return nil, errors.New("coldfmt: chunk trailer has no magic")
	}
	if uint64(len(tail)) != 8*uint64(n)+trailerBytes {
		return nil, fmt.Errorf("coldfmt: chunk trailer names %d records in %d bytes", n, len(tail))
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = start + binary.LittleEndian.Uint64(tail[8*i:])
	}
	return out, nil
}
