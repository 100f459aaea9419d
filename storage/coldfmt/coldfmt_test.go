package coldfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

func TestChunkRoundTrip(t *testing.T) {
	body, crc := EncodeChunk(100, [][]byte{[]byte("abc"), []byte("defgh")}, []uint64{103, 108})
	if !bytes.HasPrefix(body, []byte("abcdefgh")) || uint64(len(body)) != ChunkSize(8, 2) {
		t.Fatalf("chunk layout: %q", body)
	}
	// The footer as doc.go specifies it: one block CRC, the record ends,
	// then the tail: data length, record count, block size, footer CRC
	// and "UCK2".
	footer := body[8:]
	if got := binary.LittleEndian.Uint32(footer); got != crc32.Checksum([]byte("abcdefgh"), castagnoli) {
		t.Fatalf("block CRC %08x", got)
	}
	if binary.LittleEndian.Uint64(footer[4:]) != 3 || binary.LittleEndian.Uint64(footer[12:]) != 8 {
		t.Fatalf("record ends %x", footer[4:20])
	}
	tail := footer[20:]
	if binary.LittleEndian.Uint64(tail) != 8 || binary.LittleEndian.Uint32(tail[8:]) != 2 ||
		binary.LittleEndian.Uint32(tail[12:]) != ChecksumBlockBytes || string(tail[20:]) != "UCK2" {
		t.Fatalf("tail %x", tail)
	}
	if stored := binary.LittleEndian.Uint32(tail[16:]); stored != crc || crc != crc32.Checksum(footer[:len(footer)-8], castagnoli) {
		t.Fatalf("footer CRC: stored %08x, returned %08x", stored, crc)
	}
	data, recs, err := DecodeChunk(100, 8, body, crc)
	if err != nil || string(data) != "abcdefgh" || len(recs) != 2 || recs[0] != 103 || recs[1] != 108 {
		t.Fatalf("decoded %q %v, %v", data, recs, err)
	}
	// An external payload is a chunk without record ends.
	ext, xcrc := EncodeChunk(0, [][]byte{[]byte("payload")}, nil)
	if data, recs, err := DecodeChunk(0, 7, ext, xcrc); err != nil || string(data) != "payload" || len(recs) != 0 {
		t.Fatalf("external payload: %q %v %v", data, recs, err)
	}
}

// TestChunkBlocks: a chunk's data is checksummed per block, so a ranged
// read verifies the blocks it fetched and nothing else.
func TestChunkBlocks(t *testing.T) {
	data := make([]byte, 3*ChecksumBlockBytes+100)
	for i := range data {
		data[i] = byte(i * 7)
	}
	body, crc := EncodeChunk(0, [][]byte{data}, []uint64{ChecksumBlockBytes, uint64(len(data))})
	n := uint64(len(data))
	f, err := ParseFooter(n, body[n:])
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Verify(crc); err != nil {
		t.Fatal(err)
	}
	if f.BlockBytes() != ChecksumBlockBytes || f.Records() != 2 || f.RecordEnd(1) != n {
		t.Fatalf("footer: block %d, %d records", f.BlockBytes(), f.Records())
	}
	spans := []struct{ lo, hi, wlo, whi uint64 }{
		{0, 1, 0, ChecksumBlockBytes},
		{ChecksumBlockBytes + 5, ChecksumBlockBytes + 6, ChecksumBlockBytes, 2 * ChecksumBlockBytes},
		{ChecksumBlockBytes - 1, ChecksumBlockBytes + 1, 0, 2 * ChecksumBlockBytes},
		{3*ChecksumBlockBytes + 1, n, 3 * ChecksumBlockBytes, n},
	}
	for _, sp := range spans {
		lo, hi := f.Span(sp.lo, sp.hi)
		if lo != sp.wlo || hi != sp.whi {
			t.Fatalf("Span(%d, %d) = [%d, %d), want [%d, %d)", sp.lo, sp.hi, lo, hi, sp.wlo, sp.whi)
		}
		if err := f.VerifyData(lo, data[lo:hi]); err != nil {
			t.Fatalf("VerifyData [%d, %d): %v", lo, hi, err)
		}
	}
	damaged := bytes.Clone(data)
	damaged[2*ChecksumBlockBytes+9] ^= 0x20
	if err := f.VerifyData(0, damaged[:2*ChecksumBlockBytes]); err != nil {
		t.Fatalf("blocks before the damage: %v", err)
	}
	if err := f.VerifyData(2*ChecksumBlockBytes, damaged[2*ChecksumBlockBytes:3*ChecksumBlockBytes]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("the damaged block: %v", err)
	}
	if err := f.VerifyData(5, data[5:ChecksumBlockBytes]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a range that is not whole blocks: %v", err)
	}
}

func TestChunkCorruption(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 20000) // 4 blocks
	good, crc := EncodeChunk(1000, [][]byte{data}, []uint64{1005, 1000 + uint64(len(data))})
	n := uint64(len(data))
	flip := func(off int) []byte {
		b := bytes.Clone(good)
		b[off] ^= 0x01
		return b
	}
	other, otherCRC := EncodeChunk(1000, [][]byte{bytes.Repeat([]byte("x"), len(data))}, []uint64{1005, 1000 + uint64(len(data))})
	tests := []struct {
		name string
		body []byte
		n    uint64
		crc  uint32
	}{
		{"data byte", flip(70000), n, crc},
		{"last data byte", flip(int(n) - 1), n, crc},
		{"block crc", flip(int(n) + 2), n, crc},
		{"record end", flip(int(n) + 16 + 1), n, crc},
		{"tail data length", flip(len(good) - 24), n, crc},
		{"tail record count", flip(len(good) - 16), n, crc},
		{"tail block size", flip(len(good) - 12), n, crc},
		{"footer crc", flip(len(good) - 8), n, crc},
		{"magic", flip(len(good) - 1), n, crc},
		{"truncated", good[:len(good)-1], n, crc},
		{"extended", append(bytes.Clone(good), 0), n, crc},
		{"truncated into the data", good[:n-3], n, crc},
		{"another chunk at the key", other, n, crc},
		{"reference crc differs", good, n, crc ^ 1},
		{"reference length differs", good, n - 1, crc},
		{"self-consistent but not the committed one", other, n, otherCRC ^ 0x80},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := DecodeChunk(1000, tt.n, tt.body, tt.crc); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeChunk = %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzDecodeChunk: the chunk decoder never panics on any object, and
// whatever it accepts re-encodes to the same bytes (the format has one
// encoding per content). With storedCRC the reference's checksum is taken
// from the object itself, so mutations that keep the footer consistent
// reach the data checks.
func FuzzDecodeChunk(f *testing.F) {
	seed := func(start uint64, records []uint64, segs ...string) {
		var bs [][]byte
		n := 0
		for _, s := range segs {
			bs = append(bs, []byte(s))
			n += len(s)
		}
		body, _ := EncodeChunk(start, bs, records)
		f.Add(body, uint64(n), start, true)
		f.Add(body, uint64(n), start, false)
	}
	seed(0, nil)
	seed(0, nil, "external payload")
	seed(100, []uint64{103, 108}, "abc", "defgh")
	seed(7, []uint64{8}, "{\"a\":1}\n")
	small, _ := encodeChunk(0, [][]byte{[]byte(strings.Repeat("s", 1500))}, []uint64{700, 1500}, minBlockBytes)
	f.Add(small, uint64(1500), uint64(0), true)
	f.Add([]byte("UCK2"), uint64(0), uint64(0), true)
	f.Add([]byte{}, uint64(0), uint64(0), false)
	f.Fuzz(func(t *testing.T, body []byte, n, start uint64, storedCRC bool) {
		var crc uint32
		if storedCRC && len(body) >= 8 {
			crc = binary.LittleEndian.Uint32(body[len(body)-8:])
		}
		data, recs, err := DecodeChunk(start, n, body, crc)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if uint64(len(data)) != n {
			t.Fatalf("%d data bytes, want %d", len(data), n)
		}
		prev := start
		for _, r := range recs {
			if r <= prev || r > start+n {
				t.Fatalf("record ends %v outside (%d, %d]", recs, start, start+n)
			}
			prev = r
		}
		fo, _ := ParseFooter(n, body[n:])
		again, againCRC := encodeChunk(start, [][]byte{data}, recs, fo.BlockBytes())
		if !bytes.Equal(again, body) || againCRC != crc {
			t.Fatalf("accepted %x, which re-encodes to %x", body, again)
		}
	})
}

func TestPageRoundTrip(t *testing.T) {
	entries := []*storagev1.ColdRef{
		{Start: 0, End: 10, Key: "b/h/1/c/a", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 18},
		{Start: 10, End: 25, Key: "b/h/1/x/b", Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL, Size: 15},
	}
	body, digest := EncodePage(entries)
	if digest != crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) || digest != PageChecksum(body) {
		t.Fatal("digest is not the CRC-32C of the body")
	}
	again, digest2 := EncodePage(entries)
	if !bytes.Equal(body, again) || digest != digest2 {
		t.Fatal("page encoding is not deterministic")
	}
	got, err := DecodePage(body, digest)
	if err != nil || len(got) != 2 || !proto.Equal(got[1], entries[1]) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	if _, err := DecodePage([]byte{0xff, 0xff}, PageChecksum([]byte{0xff, 0xff})); !errors.Is(err, ErrCorrupt) {
		t.Fatal("garbage decoded as a page")
	}
	damaged := bytes.Clone(body)
	damaged[len(damaged)/2] ^= 0x04
	if _, err := DecodePage(damaged, digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged page decoded: %v", err)
	}
	if r := FindRef(got, 12); r != got[1] {
		t.Fatalf("FindRef(12) = %v", r)
	}
	if r := FindRef(got, 25); r != nil {
		t.Fatalf("FindRef past the run = %v", r)
	}
}

func TestKeys(t *testing.T) {
	// The prefix is a durable format: pin it.
	if got, want := StreamPrefix("b", "s", 7), "b/043a718774c572bd8a25adbeb1bfcd5c/7/"; got != want {
		t.Fatalf("StreamPrefix = %q, want %q", got, want)
	}
	prefix := StreamPrefix("b", "a/b", 1)
	if !strings.HasPrefix(prefix, BucketPrefix("b")) {
		t.Fatalf("%q is not below its bucket", prefix)
	}
	for _, k := range []string{ChunkKey(prefix, 5, 9), ExternalKey(prefix), PageKey(prefix, 1, 0, 5), SnapshotKey(prefix, 9, "d")} {
		if !strings.HasPrefix(k, prefix) {
			t.Errorf("%q is not below the stream prefix", k)
		}
	}
	if a, b := ChunkKey(prefix, 5, 9), ChunkKey(prefix, 5, 9); a == b {
		t.Fatal("two chunk keys of one range are equal: the nonce is missing")
	}
	key := SnapshotPartKey(prefix, 42, 3)
	pos, n, ok := ParseSnapshotPartKey(prefix, key)
	if !ok || pos != 42 || n != 3 {
		t.Fatalf("ParseSnapshotPartKey(%q) = %d, %d, %v", key, pos, n, ok)
	}
	for _, bad := range []string{prefix + "sp/42/00000-x", prefix + "sp/1/00001-x", prefix + "c/1-2-x", "other/" + key} {
		if _, _, ok := ParseSnapshotPartKey(prefix, bad); ok {
			t.Errorf("ParseSnapshotPartKey accepted %q", bad)
		}
	}
}
