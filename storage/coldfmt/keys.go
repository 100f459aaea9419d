package coldfmt

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// The root of the cold store holds FormatEpochKey, whose body is FormatEpoch.
// Epoch 2: chunks and external payloads carry a CRC-32C per data block in
// a checksummed footer ("UCK2"), and every index reference the checksum of
// its object. A root of another epoch is refused (this build reads no
// other format).
const (
	FormatEpochKey = "URSULA_FORMAT_EPOCH"
	FormatEpoch    = "2"
)

// StreamPrefix is the object-key prefix of one stream incarnation: every
// object of the stream (chunks, external payloads, index pages) lives below
// it, and it lives below "{bucket}/". Stream names are hashed because they
// may hold '/' and be longer than an object key allows.
func StreamPrefix(bucket, stream string, incarnation uint64) string {
	h := sha256.Sum256([]byte(stream))
	return fmt.Sprintf("%s/%s/%d/", bucket, hex.EncodeToString(h[:16]), incarnation)
}

// BucketPrefix is the erasure domain of a bucket in the cold store.
func BucketPrefix(bucket string) string { return bucket + "/" }

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ChunkKey names a new chunk object of [start, end) under a stream prefix.
func ChunkKey(prefix string, start, end uint64) string {
	return fmt.Sprintf("%sc/%020d-%020d-%s", prefix, start, end, nonce())
}

// ExternalKey names a new external payload object under a stream prefix.
func ExternalKey(prefix string) string { return prefix + "x/" + nonce() }

// PageKey names a new index page object of a level under a stream prefix.
func PageKey(prefix string, level uint32, start, end uint64) string {
	return fmt.Sprintf("%sp/%d/%020d-%020d-%s", prefix, level, start, end, nonce())
}

// SnapshotKey names a new application-snapshot object under a stream
// prefix: the position and digest it stands for, and a nonce so that a
// snapshot published again after it was replaced never reuses a key the
// GC queue still holds.
func SnapshotKey(prefix string, pos uint64, digest string) string {
	return fmt.Sprintf("%ss/%020d-%s-%s", prefix, pos, digest, nonce())
}

// SnapshotPartsPrefix is the directory of the staged parts of a snapshot
// at pos under a stream prefix.
func SnapshotPartsPrefix(prefix string, pos uint64) string {
	return fmt.Sprintf("%ssp/%020d/", prefix, pos)
}

// SnapshotPartKey names a new object for part n of a snapshot at pos.
func SnapshotPartKey(prefix string, pos uint64, n uint32) string {
	return fmt.Sprintf("%s%05d-%s", SnapshotPartsPrefix(prefix, pos), n, nonce())
}

// ParseSnapshotPartKey returns the position and part number of a key
// SnapshotPartKey made under prefix.
func ParseSnapshotPartKey(prefix, key string) (pos uint64, n uint32, ok bool) {
	rest, found := strings.CutPrefix(key, prefix+"sp/")
	if !found {
		return 0, 0, false
	}
	ps, name, found := strings.Cut(rest, "/")
	if !found || len(ps) != 20 {
		return 0, 0, false
	}
	ns, _, found := strings.Cut(name, "-")
	if !found || len(ns) != 5 {
		return 0, 0, false
	}
	p, err := strconv.ParseUint(ps, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(ns, 10, 32)
	if err != nil || v == 0 {
		return 0, 0, false
	}
	return p, uint32(v), true
}
