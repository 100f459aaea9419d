package gateway

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// Cursor parameters (protocol §10.1): the cursor counts 20-second intervals
// since 2024-10-09T00:00:00Z.
const (
	cursorInterval  = 20 * time.Second
	cursorMaxJitter = 3600 // seconds
)

var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

// currentCursor returns the interval number at now.
func currentCursor(now time.Time) uint64 {
	d := now.Sub(cursorEpoch)
	if d < 0 {
		return 0
	}
	return uint64(d / cursorInterval)
}

// nextCursor returns the cursor to send given the client's cursor parameter
// (empty when absent). When the client's cursor is not behind the current
// interval, the result is the client's value plus a random jitter of 1 to
// 3600 seconds in intervals (at least one), so it is strictly greater.
func nextCursor(now time.Time, client string) uint64 {
	cur := currentCursor(now)
	if client == "" {
		return cur
	}
	c, err := strconv.ParseUint(client, 10, 64)
	if err != nil || c < cur {
		return cur
	}
	jitter := 1 + rand.Uint64N(cursorMaxJitter)
	n := (jitter + uint64(cursorInterval/time.Second) - 1) / uint64(cursorInterval/time.Second)
	if n < 1 {
		n = 1
	}
	if c > ^uint64(0)-n {
		return c
	}
	return c + n
}
