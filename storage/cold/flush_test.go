package cold

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/stream"
)

func hot(name string, bytes uint64, sinceMs int64) stream.HotStream {
	return stream.HotStream{Key: stream.Key{Bucket: "b", Stream: name}, ColdEnd: 0, Tail: bytes, HotBytes: bytes, HotSinceMs: sinceMs}
}

func names(hs []stream.HotStream) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key.Stream)
	}
	return out
}

func TestPickFlushes(t *testing.T) {
	cfg := Config{FlushBytes: 1000, FlushAge: 5 * time.Second}
	const now = 100_000
	ext := hot("external", 12, now)
	ext.Tail = 500 // positions past the hot bytes: an external payload not yet indexed
	list := func() []stream.HotStream {
		return []stream.HotStream{
			hot("young-small", 10, now-1000),
			hot("old", 11, now-5000),
			hot("big", 1000, now),
			hot("young-mid", 300, now),
			ext,
			hot("young-large", 600, now-10),
		}
	}

	// No pressure: the due ones, in the order listed (nothing sorted).
	got := pickFlushes(list(), now, 1933, 1933, cfg)
	if want := []string{"old", "big", "external"}; !slices.Equal(names(got), want) {
		t.Fatalf("without pressure: %v, want %v", names(got), want)
	}

	// Above the limit: largest first, the due ones and then the largest
	// others until the group is back under it.
	got = pickFlushes(list(), now, 1933, 400, cfg)
	if want := []string{"big", "young-large", "external", "old"}; !slices.Equal(names(got), want) {
		t.Fatalf("under pressure: %v, want %v", names(got), want)
	}

	// The result lives in the list's storage: the flusher reuses it.
	in := list()
	if got := pickFlushes(in, now, 0, 1<<30, cfg); len(got) > 0 && &got[0] != &in[0] {
		t.Fatal("pickFlushes allocated a new list")
	}
}

// TestAgedOutSpreadsStreamsWrittenTogether: streams whose hot windows
// start in the same millisecond come due for their age-based flush spread
// over the last quarter of the age bound, not in one tick; none before it,
// every one at it; a stream once due stays due; and the next window of the
// same streams draws again.
func TestAgedOutSpreadsStreamsWrittenTogether(t *testing.T) {
	const ageMs, n = 5000, 1000
	dueAt := func(since int64) []int64 {
		at := make([]int64, n)
		for i := range at {
			h := hot(fmt.Sprintf("s%d", i), 10, since)
			at[i] = -1
			for now := since; now <= since+ageMs; now++ {
				due := agedOut(h, now, ageMs)
				switch {
				case due && at[i] < 0:
					at[i] = now - since
				case !due && at[i] >= 0:
					t.Fatalf("stream %d due at age %d, no longer at %d", i, at[i], now-since)
				}
			}
		}
		return at
	}
	first := dueAt(0)
	ticks := map[int64]bool{} // the flusher's 100 ms ticks the streams come due in
	for i, a := range first {
		if a < ageMs-ageMs/flushSpread || a > ageMs {
			t.Fatalf("stream %d due at age %d ms, want within [%d, %d]", i, a, ageMs-ageMs/flushSpread, ageMs)
		}
		ticks[a/100] = true
	}
	if len(ticks) < 12 {
		t.Fatalf("1,000 streams written together come due in %d ticks of 100 ms, want them spread over the 13 of the last quarter", len(ticks))
	}
	next := dueAt(ageMs + 3)
	same := 0
	for i := range first {
		if first[i] == next[i] {
			same++
		}
	}
	if same > n/10 {
		t.Fatalf("%d of %d streams drew the same point for their next window", same, n)
	}
}
