package tier

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

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
