package coldfmt

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

func TestChunkRoundTrip(t *testing.T) {
	body := EncodeChunk(100, [][]byte{[]byte("abc"), []byte("defgh")}, []uint64{103, 108})
	if !bytes.HasPrefix(body, []byte("abcdefgh")) || uint64(len(body)) != ChunkSize(8, 2) {
		t.Fatalf("chunk layout: %q", body)
	}
	// The trailer as doc.go specifies it: record count, then "UCK1".
	trailer := body[len(body)-8:]
	if binary.LittleEndian.Uint32(trailer) != 2 || string(trailer[4:]) != "UCK1" {
		t.Fatalf("trailer %x", trailer)
	}
	recs, err := DecodeRecords(100, body[8:])
	if err != nil || len(recs) != 2 || recs[0] != 103 || recs[1] != 108 {
		t.Fatalf("records %v, %v", recs, err)
	}
	for name, tail := range map[string][]byte{
		"truncated trailer": body[9:],
		"no magic":          append(append([]byte(nil), body[8:len(body)-1]...), 'X'),
		"count mismatch":    body[16:],
	} {
		if _, err := DecodeRecords(100, tail); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestPageRoundTrip(t *testing.T) {
	entries := []*storagev1.ColdRef{
		{Start: 0, End: 10, Key: "b/h/1/c/a", Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: 18},
		{Start: 10, End: 25, Key: "b/h/1/x/b", Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL, Size: 15},
	}
	body, digest := EncodePage(entries)
	if digest != crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) {
		t.Fatal("digest is not the CRC-32C of the body")
	}
	again, digest2 := EncodePage(entries)
	if !bytes.Equal(body, again) || digest != digest2 {
		t.Fatal("page encoding is not deterministic")
	}
	got, err := DecodePage(body)
	if err != nil || len(got) != 2 || !proto.Equal(got[1], entries[1]) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	if _, err := DecodePage([]byte{0xff, 0xff}); err == nil {
		t.Fatal("garbage decoded as a page")
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
