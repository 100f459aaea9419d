package engine

import (
	"bytes"
	"context"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// flipObject flips one bit of every object under the store whose key
// holds part and whose bytes hold marker, at the marker; it returns how
// many it damaged.
func flipObject(tb testing.TB, s objstore.Store, part string, marker []byte) int {
	tb.Helper()
	ctx := context.Background()
	var keys []string
	if err := s.List(ctx, "", func(in objstore.Info) error {
		if strings.Contains(in.Key, part) {
			keys = append(keys, in.Key)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		b, err := s.Get(ctx, k)
		if err != nil {
			tb.Fatal(err)
		}
		i := bytes.Index(b, marker)
		if i < 0 {
			continue
		}
		b = bytes.Clone(b)
		b[i] ^= 0x01
		if err := s.Put(ctx, k, b); err != nil {
			tb.Fatal(err)
		}
		n++
	}
	return n
}

// TestColdCorruptionRefused: the engine's cold readers — a stream read, a
// fork's read of its source's cold bytes, a record lookup, and an
// application snapshot (small, read through the cache; large, read
// directly) — answer COLD_OBJECT_CORRUPT for an object whose bytes do not
// match their checksum, serve none of them, and count each refusal.
func TestColdCorruptionRefused(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("src"), ContentType: "application/json"})
	for i := range 30 {
		mustAppend(t, e, "src", "application/json", `{"n":"`+strings.Repeat("s", i)+`-marker"}`)
	}
	waitFlushed(t, e, "src")
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("fork"), Fork: &streamv1.ForkSpec{Source: ref("src")}})
	small := []byte("small snapshot body")
	large := bytes.Repeat([]byte("L"), 2<<20)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("snap-small"), ContentType: "text/plain", HasBody: true, Body: []byte("x")})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("snap-large"), ContentType: "text/plain", HasBody: true, Body: []byte("x")})
	for name, body := range map[string][]byte{"snap-small": small, "snap-large": large} {
		if _, err := e.PutSnapshot(t.Context(), &streamv1.PutSnapshotRequest{Ref: ref(name), Offset: off(1), ContentType: "text/plain", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if n := flipObject(t, store, "/c/", []byte("sssss-marker")); n == 0 {
		t.Fatal("no chunk holds the marker")
	}
	flipObject(t, store, "/s/", []byte("small snapshot"))
	flipObject(t, store, "/s/", []byte("LLLL"))

	stats := e.node.Cold.Stats()
	before := stats.CorruptReads.Load()
	// readOn reads a stream from the start, page by page, until an error
	// (a page stops before the damaged chunk when earlier bytes fill it).
	readOn := func(name string) error {
		offset := stream.OffsetStart
		for range 1000 {
			resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: offset, MaxBytes: 64, NoTouch: true})
			if err != nil {
				return err
			}
			if resp.GetUpToDate() {
				return nil
			}
			offset = resp.GetNextOffset()
		}
		return nil
	}
	last := uint64(29)
	reads := []struct {
		name string
		read func() error
	}{
		{"stream read", func() error { return readOn("src") }},
		{"fork read below its base", func() error { return readOn("fork") }},
		{"record lookup", func() error {
			_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("src"), Record: &last, NoTouch: true})
			return err
		}},
		{"small snapshot", func() error {
			_, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("snap-small")})
			return err
		}},
		{"large snapshot", func() error {
			_, err := e.GetSnapshot(t.Context(), &streamv1.GetSnapshotRequest{Ref: ref("snap-large")})
			return err
		}},
	}
	for _, r := range reads {
		t.Run(r.name, func(t *testing.T) {
			got := stats.CorruptReads.Load()
			wantCode(t, r.name, r.read(), fault.ErrColdObjectCorrupt)
			if stats.CorruptReads.Load() <= got {
				t.Fatal("the refusal was not counted")
			}
		})
	}
	if stats.CorruptReads.Load() < before+uint64(len(reads)) {
		t.Fatalf("corrupt reads %d -> %d", before, stats.CorruptReads.Load())
	}
}
