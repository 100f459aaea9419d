package stream

import "math"

// Lifetime bounds. MaxTTLSeconds is the longest sliding TTL a stream may
// have: 100 years (of 365.25 days). A TTL is an idle window, and one longer
// than any deployment lives is indistinguishable from none; the bound keeps
// every expiry computation far inside int64 milliseconds (100 years are
// 3.2e12 ms; a touch time in year 9999 plus that is 2.6e14, against 9.2e18)
// and the value inside the 2^53 integers JSON clients read exactly.
// Expires-At needs no such cap: an RFC 3339 timestamp's year has four
// digits, so its milliseconds fit an int64; only instants at or before the
// Unix epoch cannot be stored (expires_at_ms 0 means "none").
const MaxTTLSeconds = 3_155_760_000

// TTLMs is a TTL of sec seconds in milliseconds, saturating at
// math.MaxInt64 (never reached by a TTL within MaxTTLSeconds).
func TTLMs(sec uint64) int64 {
	if sec > math.MaxInt64/1000 {
		return math.MaxInt64
	}
	return int64(sec) * 1000
}

// AddMs is a+b saturating at the bounds of int64: expiry arithmetic on
// times and durations in milliseconds never wraps around.
func AddMs(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}
