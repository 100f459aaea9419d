package stream

import (
	"math"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

func TestAddMs(t *testing.T) {
	tests := []struct {
		name string
		a, b int64
		want int64
	}{
		{"small", 1000, 2000, 3000},
		{"negative", 1000, -3000, -2000},
		{"saturates high", math.MaxInt64 - 5, 10, math.MaxInt64},
		{"max plus max", math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{"saturates low", math.MinInt64 + 5, -10, math.MinInt64},
		{"exactly max", math.MaxInt64 - 10, 10, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AddMs(tt.a, tt.b); got != tt.want {
				t.Fatalf("AddMs(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

func TestTTLMs(t *testing.T) {
	tests := []struct {
		name string
		sec  uint64
		want int64
	}{
		{"zero", 0, 0},
		{"hour", 3600, 3_600_000},
		{"100 years", MaxTTLSeconds, MaxTTLSeconds * 1000},
		{"largest exact", math.MaxInt64 / 1000, math.MaxInt64 / 1000 * 1000},
		{"first to saturate", math.MaxInt64/1000 + 1, math.MaxInt64},
		{"max int64 seconds", math.MaxInt64, math.MaxInt64},
		{"max uint64 seconds", math.MaxUint64, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TTLMs(tt.sec); got != tt.want {
				t.Fatalf("TTLMs(%d) = %d, want %d", tt.sec, got, tt.want)
			}
		})
	}
}

// TestExpiryNeverWraps: whatever TTL a stream holds (one that bypassed the
// engine's validation: a command of another build, a restored snapshot),
// its expiry is in the future of its last touch, never in the past.
func TestExpiryNeverWraps(t *testing.T) {
	const now = int64(1_900_000_000_000) // 2030
	tests := []struct {
		name      string
		meta      Meta
		expiry    int64
		expiredAt int64 // a time at which it must be expired (0: never)
	}{
		{"no lifetime", Meta{TouchedMs: now}, math.MaxInt64, 0},
		{"hour", Meta{HasTTL: true, TTLSeconds: 3600, TouchedMs: now}, now + 3_600_000, now + 3_600_000},
		{"zero ttl", Meta{HasTTL: true, TTLSeconds: 0, TouchedMs: now}, now, now},
		{"100 years", Meta{HasTTL: true, TTLSeconds: MaxTTLSeconds, TouchedMs: now}, now + MaxTTLSeconds*1000, now + MaxTTLSeconds*1000},
		{"max int64 seconds", Meta{HasTTL: true, TTLSeconds: math.MaxInt64, TouchedMs: now}, math.MaxInt64, 0},
		{"max uint64 seconds", Meta{HasTTL: true, TTLSeconds: math.MaxUint64, TouchedMs: now}, math.MaxInt64, 0},
		{"sum past int64", Meta{HasTTL: true, TTLSeconds: math.MaxInt64 / 1000, TouchedMs: now}, math.MaxInt64, 0},
		{"expires-at earlier than ttl", Meta{HasTTL: true, TTLSeconds: math.MaxUint64, ExpiresAtMs: now + 5, TouchedMs: now}, now + 5, now + 5},
		{"expires-at year 9999", Meta{ExpiresAtMs: 253402300799999}, 253402300799999, 253402300799999},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.meta.ExpiryMs(); got != tt.expiry {
				t.Fatalf("ExpiryMs = %d, want %d", got, tt.expiry)
			}
			if tt.meta.ExpiredAt(now - 1) {
				t.Fatal("expired before its last touch")
			}
			if tt.expiredAt == 0 {
				if tt.meta.ExpiredAt(math.MaxInt64 - 1) {
					t.Fatal("a stream without a representable expiry expired")
				}
				return
			}
			if tt.meta.ExpiredAt(tt.expiredAt - 1) {
				t.Fatal("expired a millisecond early")
			}
			if !tt.meta.ExpiredAt(tt.expiredAt) {
				t.Fatal("not expired at its expiry")
			}
		})
	}
}

// TestApplyHugeTTL: a CreateStream whose TTL overflows int64 milliseconds
// (the engine refuses it; apply must not be wrong if one gets through)
// creates a stream that is not expired, and a sweep does not list it.
func TestApplyHugeTTL(t *testing.T) {
	a := newApplier(t)
	const now = 1_900_000_000_000
	r := a.apply(now, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain", HasTtl: true, TtlSeconds: math.MaxInt64, Body: []byte("kept")})
	if r.Err != nil || !r.Created {
		t.Fatalf("create: %+v", r)
	}
	m, ok := a.m.Lookup(Key{"b", "s"})
	if !ok || m.ExpiredAt(now) || m.ExpiredAt(now+1000) {
		t.Fatalf("stream expired at once: %+v", m)
	}
	if got := a.m.Expired(now+1000, 10); len(got) != 0 {
		t.Fatalf("the sweep would expire %v", got)
	}
}
