package cold

import (
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
