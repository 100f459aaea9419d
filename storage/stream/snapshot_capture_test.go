package stream

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// BenchmarkCaptureSnapshot measures what a snapshot costs the shard worker
// (the capture; the encoding runs on the snapshot worker) for a group of
// many streams, each created and appended to once: a node of 1M streams in
// 16 groups holds 62,500 per group. Between two captures either nothing
// changed (idle) or 500 of the streams were appended to, as under the
// benchmark's 500 writers (the appends are not timed, nor is the encoding,
// which releases the capture's buffers for the next).
func BenchmarkCaptureSnapshot(b *testing.B) {
	for _, n := range []int{1000, 62500} {
		for _, changed := range []int{0, 500} {
			b.Run(fmt.Sprintf("%d/changed=%d", n, changed), func(b *testing.B) {
				a := newApplier(b)
				name := func(i int) string { return fmt.Sprintf("s-%07d", (i*7919)%n) }
				fillStreams(a, n, name, true)
				var buf []byte
				encode := func(capture func([]byte) ([]byte, error)) {
					data, err := capture(buf)
					if err != nil {
						b.Fatal(err)
					}
					buf = data[:0]
				}
				encode(a.m.CaptureSnapshot())
				seq, next := uint64(1), 0
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					b.StopTimer()
					for range changed {
						a.apply(3, &storagev1.Append{Bucket: "b", Stream: name(next), ContentType: "application/octet-stream", Body: make([]byte, 256),
							Producer: producer("p", 0, seq)})
						if next++; next == n {
							next, seq = 0, seq+1
						}
					}
					b.StartTimer()
					capture := a.m.CaptureSnapshot()
					b.StopTimer()
					encode(capture) // on the snapshot worker, not timed
					b.StartTimer()
				}
			})
		}
	}
}

// fillStreams creates n streams of bucket b, named by name, and when
// written appends 256 bytes to each with one producer, whose id is as long
// as a writer's would be (a one-byte string is static in Go and would hide
// what each stream's copy of the id costs).
func fillStreams(a *applier, n int, name func(int) string, written bool) {
	for i := range n {
		a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: name(i), ContentType: "application/octet-stream"})
		if written {
			a.apply(2, &storagev1.Append{Bucket: "b", Stream: name(i), ContentType: "application/octet-stream", Body: make([]byte, 256),
				Producer: producer("writer-0042-9f1c6a", 0, 0)})
		}
	}
}

// The capture encodes the streams in the map's order and the encoder puts
// them in the order of their names: every snapshot of one state is the
// same bytes, its streams sorted by bucket, then name.
func TestSnapshotStreamsInNameOrder(t *testing.T) {
	a := newApplier(t)
	for i := range 60 {
		bucket := []string{"b", "a"}[i%2]
		if i < 2 {
			a.apply(1, &storagev1.CreateBucket{Bucket: bucket})
		}
		name := fmt.Sprintf("s-%02d", (i*37)%60)
		a.apply(1, &storagev1.CreateStream{Bucket: bucket, Stream: name, ContentType: "text/plain"})
		a.apply(2, &storagev1.Append{Bucket: bucket, Stream: name, ContentType: "text/plain", Body: []byte(name)})
	}
	first, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if again, _ := a.m.Snapshot(); !bytes.Equal(again, first) {
			t.Fatal("two snapshots of one state differ")
		}
	}
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(first, &snap); err != nil {
		t.Fatal(err)
	}
	streams := snap.GetStreams()
	if len(streams) != 60 {
		t.Fatalf("%d streams, want 60", len(streams))
	}
	for i, s := range streams {
		if string(s.GetData()) != s.GetStream() {
			t.Fatalf("stream %s/%s holds %q, its own name expected", s.GetBucket(), s.GetStream(), s.GetData())
		}
		if i == 0 {
			continue
		}
		p := streams[i-1]
		if p.GetBucket() > s.GetBucket() || p.GetBucket() == s.GetBucket() && p.GetStream() >= s.GetStream() {
			t.Fatalf("%s/%s before %s/%s", p.GetBucket(), p.GetStream(), s.GetBucket(), s.GetStream())
		}
	}
}

// The snapshot worker hands each encoding the buffer of the previous one:
// whatever that buffer holds, and whether or not it is large enough, the
// encoding is the same bytes.
func TestSnapshotEncodingReusesTheBuffer(t *testing.T) {
	a := newApplier(t)
	fillStreams(a, 50, func(i int) string { return fmt.Sprintf("s-%02d", i) }, true)
	want, err := a.m.CaptureSnapshot()(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 10, len(want), 2 * len(want)} {
		buf := bytes.Repeat([]byte{0xa5}, size)
		got, err := a.m.CaptureSnapshot()(buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoding into a used buffer of %d bytes differs from a fresh one", size)
		}
		if size >= len(want)+1024 && &got[0] != &buf[0] {
			t.Fatalf("a buffer of %d bytes was not reused for an encoding of %d", size, len(want))
		}
	}
}

// A capture's buffers serve a later capture only once its encoder is done
// and a later capture has replaced it as the cache: a capture encoded
// after three more captures of a changing group (each encoded at once) is
// still the bytes of the state it captured.
func TestCaptureBuffersWaitForTheirEncoder(t *testing.T) {
	a := newApplier(t)
	name := func(i int) string { return fmt.Sprintf("s-%02d", i) }
	fillStreams(a, 50, name, true)
	want, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	pending := a.m.CaptureSnapshot()
	for round := range 3 {
		for i := range 50 {
			a.apply(3, &storagev1.Append{Bucket: "b", Stream: name(i), ContentType: "application/octet-stream",
				Body: bytes.Repeat([]byte{byte(round)}, 300), Producer: producer("writer-0042-9f1c6a", 0, uint64(round+1))})
		}
		if _, err := a.m.CaptureSnapshot()(nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := pending(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("a capture encoded after later captures differs from its state's snapshot: its buffers were reused while it was pending")
	}
	if _, err := pending(nil); err == nil {
		t.Fatal("a capture encoded twice: its buffers may serve another capture by then")
	}
}

// Once a group's captures are encoded, its next captures take their arenas
// from earlier ones rather than allocating them.
func TestCapturesReuseReleasedBuffers(t *testing.T) {
	spares.mu.Lock()
	spares.arenas, spares.lists = nil, nil // those of earlier tests
	spares.mu.Unlock()
	a := newApplier(t)
	fillStreams(a, 50, func(i int) string { return fmt.Sprintf("s-%02d", i) }, true)
	seen := map[*byte]bool{}
	for round := range 8 {
		if _, err := a.m.CaptureSnapshot()(nil); err != nil {
			t.Fatal(err)
		}
		arena := &a.m.cache.last.metas[:1][0]
		if round >= 4 && !seen[arena] {
			t.Fatalf("capture %d allocated a new arena with %d earlier ones released", round, len(seen))
		}
		seen[arena] = true
	}
}
