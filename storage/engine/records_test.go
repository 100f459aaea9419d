package engine

import (
	"fmt"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

func u64p(v uint64) *uint64 { return &v }

func TestAppendBatchOneEntry(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	mustAppend(t, e, "js", "application/json", `"zero"`)
	before := e.machine(key("js")).Applied()
	batch := &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json",
		Frames:   [][]byte{[]byte(`{"a":1}`), []byte(`not json`), []byte(`[2, 3]`)},
		Producer: &streamv1.Producer{Id: "p", Epoch: 0, Seq: 0}}
	resp, err := e.Append(t.Context(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.machine(key("js")).Applied() - before; got != 1 {
		t.Fatalf("the batch took %d log entries, want 1", got)
	}
	acks := resp.GetFrames()
	type ack struct {
		status            uint32
		next              string
		recStart, recNext uint64
		code              string
	}
	want := []ack{{200, off(15), 1, 2, ""}, {400, "", 0, 0, fault.ErrInvalidArgument.Name()}, {200, off(19), 2, 4, ""}}
	for i, w := range want {
		a := acks[i]
		got := ack{a.GetStatus(), a.GetNextOffset(), a.GetRecordStart(), a.GetRecordNext(), a.GetErrorCode()}
		if got != w {
			t.Fatalf("frame %d: %+v, want %+v", i, got, w)
		}
	}
	if resp.GetRecordStart() != 1 || resp.GetRecordNext() != 4 {
		t.Fatalf("batch range [%d, %d)", resp.GetRecordStart(), resp.GetRecordNext())
	}
	if got := readAll(t, e, "js"); got != "\"zero\"\n{\"a\":1}\n2\n3\n" {
		t.Fatalf("stream holds %q", got)
	}
	// A retry of the producer tuple is a duplicate of the whole batch.
	dup, err := e.Append(t.Context(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if !dup.GetDuplicate() || dup.GetRecordStart() != 1 || dup.GetRecordNext() != 4 || dup.GetFrames()[0].GetStatus() != 204 {
		t.Fatalf("retry: %v", dup)
	}
	// Record match.
	_, err = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json",
		Frames: [][]byte{[]byte(`5`)}, RecordMatch: u64p(3)})
	wantCode(t, "batch with a stale record match", err, fault.ErrRecordMismatch)
	resp, err = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json",
		Body: []byte(`5`), RecordMatch: u64p(4)})
	if err != nil || resp.GetRecordStart() != 4 || resp.GetRecordNext() != 5 {
		t.Fatalf("append at the record tail: %v %v", resp, err)
	}
	head, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("js")})
	if err != nil || head.GetInfo().GetRecordNext() != 5 || head.GetInfo().GetRecordFirst() != 0 {
		t.Fatalf("head: %v %v", head, err)
	}
	// Frame bounds.
	_, err = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json", Frames: make([][]byte, MaxBatchFrames+1)})
	wantCode(t, "too many frames", err, fault.ErrPayloadTooLarge)
}

func TestRecordReadsHotAndCold(t *testing.T) {
	cfg := coldTestConfig(t.TempDir())
	cfg.Cold.ExternalMinBytes = 1 << 10
	e := startColdEngine(t, cfg, objstore.NewMemory())
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	var msgs []string
	for i := range 300 {
		a, b := fmt.Sprintf(`{"i":%d,"s":"%s"}`, i, strings.Repeat("y", i%23)), fmt.Sprintf(`[%d]`, i)
		body := "[" + a + "," + b + "]"
		if i == 150 {
			// An external payload of many messages.
			var big []string
			for j := range 100 {
				big = append(big, fmt.Sprintf(`"big-%03d-%s"`, j, strings.Repeat("z", 8)))
			}
			body = "[" + strings.Join(big, ",") + "]"
			msgs = append(msgs, big...)
		} else {
			msgs = append(msgs, a, b)
		}
		r := mustAppend(t, e, "js", "application/json", body)
		if r.GetRecordNext() != uint64(len(msgs)) {
			t.Fatalf("append %d: record tail %d, want %d", i, r.GetRecordNext(), len(msgs))
		}
	}
	waitFlushed(t, e, "js")
	m := mustLookup(t, e, "js")
	if lv, _ := e.machine(key("js")).ColdLevels(key("js"), m.Incarnation); len(lv) < 2 {
		t.Fatalf("cold index has %d levels, want sealed pages", len(lv))
	}
	// A few hot messages after the cold history.
	for i := range 5 {
		s := fmt.Sprintf(`"hot-%d"`, i)
		mustAppend(t, e, "js", "application/json", s)
		msgs = append(msgs, s)
	}
	total := uint64(len(msgs))
	read := func(req *streamv1.ReadRequest) *streamv1.ReadResponse {
		t.Helper()
		req.Ref, req.NoTouch = ref("js"), true
		resp, err := e.Read(t.Context(), req)
		if err != nil {
			t.Fatalf("read %v: %v", req, err)
		}
		return resp
	}
	for _, n := range []uint64{0, 1, 2, 63, 250, 299, 300, 301, 350, 399, 400, 598, total - 5, total - 1} {
		resp := read(&streamv1.ReadRequest{Record: u64p(n), MaxRecords: 2})
		want := msgs[n] + "\n"
		if n+1 < total {
			want += msgs[n+1] + "\n"
		}
		if string(resp.GetData()) != want || resp.GetRecordFirst() != n || resp.GetRecordNext() != min(n+2, total) {
			t.Fatalf("record %d: %q [%d, %d), want %q", n, resp.GetData(), resp.GetRecordFirst(), resp.GetRecordNext(), want)
		}
		// The offset it answers continues at the next record.
		next := read(&streamv1.ReadRequest{Offset: resp.GetNextOffset(), MaxBytes: 1})
		if next.GetRecordFirst() != resp.GetRecordNext() {
			t.Fatalf("after record %d: read at %s starts at record %d, want %d", n, resp.GetNextOffset(), next.GetRecordFirst(), resp.GetRecordNext())
		}
	}
	if resp := read(&streamv1.ReadRequest{RecordNow: true}); len(resp.GetData()) != 0 || resp.GetRecordFirst() != total || resp.GetNextOffset() != stream.FormatOffset(m.Tail+uint64(len("\"hot-0\"\n"))*5) {
		t.Fatalf("record=now: %v", resp)
	}
	if resp := read(&streamv1.ReadRequest{TailRecords: 3}); resp.GetRecordFirst() != total-3 || strings.Count(string(resp.GetData()), "\n") != 3 {
		t.Fatalf("tail_records=3: %v", resp)
	}
	_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), Record: u64p(total + 1)})
	wantCode(t, "record beyond the tail", err, fault.ErrOffsetOutOfRange)
	_, err = e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), MaxRecords: 1})
	wantCode(t, "max_records without a record start", err, fault.ErrInvalidArgument)

	// Retention moves record_first; records below it are gone.
	at := read(&streamv1.ReadRequest{Record: u64p(120), MaxRecords: 1})
	if _, err := putSnap(t, e, "js", at.GetStartOffset(), "application/x", "state before record 120", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("js"), Offset: at.GetStartOffset()}); err != nil {
		t.Fatal(err)
	}
	if m := mustLookup(t, e, "js"); m.RecordFirst != 120 {
		t.Fatalf("record_first %d after retention, want 120", m.RecordFirst)
	}
	_, err = e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), Record: u64p(119)})
	wantCode(t, "record below the retention", err, fault.ErrOffsetTrimmed)
	if resp := read(&streamv1.ReadRequest{TailRecords: total}); resp.GetRecordFirst() != 120 {
		t.Fatalf("tail_records beyond the retained range starts at %d", resp.GetRecordFirst())
	}

	// A fork inherits the records below its base.
	fork := read(&streamv1.ReadRequest{Record: u64p(400), MaxRecords: 1})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("fk"), Fork: &streamv1.ForkSpec{Source: ref("js"), Offset: fork.GetStartOffset()}})
	r := mustAppend(t, e, "fk", "application/json", `"own"`)
	if r.GetRecordStart() != 400 || r.GetRecordNext() != 401 {
		t.Fatalf("fork append range [%d, %d), want [400, 401)", r.GetRecordStart(), r.GetRecordNext())
	}
	resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("fk"), Record: u64p(399), NoTouch: true})
	if err != nil || string(resp.GetData()) != msgs[399]+"\n\"own\"\n" || resp.GetRecordFirst() != 399 {
		t.Fatalf("fork read from record 399: %q %v", resp.GetData(), err)
	}
}

// TestRecordSnapshotAndRetention covers the ?record=N forms of snapshot
// publish and retention, and the retention's bounds: at or below the
// current retention is a no-op, beyond the visible snapshot
// SNAPSHOT_CONFLICT.
func TestRecordSnapshotAndRetention(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("bin"), ContentType: "application/octet-stream", HasBody: true, Body: []byte("xyz")})
	const total = 10
	for i := range total {
		mustAppend(t, e, "js", "application/json", fmt.Sprintf(`{"n":%d}`, i))
	}
	startOf := func(n uint64) string {
		t.Helper()
		resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), Record: u64p(n), MaxRecords: 1, NoTouch: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStartOffset()
	}
	snapReq := func(name string, n uint64) *streamv1.PutSnapshotRequest {
		return &streamv1.PutSnapshotRequest{Ref: ref(name), Record: u64p(n), ContentType: "application/x", Body: []byte(fmt.Sprintf("state@%d", n))}
	}
	retain := func(n uint64) (*streamv1.SetRetentionResponse, error) {
		return e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("js"), Record: u64p(n)})
	}

	snap, err := e.PutSnapshot(t.Context(), snapReq("js", 6))
	if err != nil {
		t.Fatal(err)
	}
	if snap.GetOffset() != startOf(6) || !snap.GetCreated() {
		t.Fatalf("snapshot at record 6: %v, want offset %s", snap, startOf(6))
	}
	if again, err := e.PutSnapshot(t.Context(), snapReq("js", 6)); err != nil || again.GetCreated() || again.GetDigest() != snap.GetDigest() {
		t.Fatalf("the same snapshot again: %v %v", again, err)
	}
	_, err = e.PutSnapshot(t.Context(), snapReq("js", total+1))
	wantCode(t, "snapshot beyond the record tail", err, fault.ErrSnapshotConflict)
	_, err = e.PutSnapshot(t.Context(), snapReq("bin", 0))
	wantCode(t, "snapshot record of a binary stream", err, fault.ErrInvalidArgument)

	_, err = retain(7)
	wantCode(t, "retention beyond the snapshot", err, fault.ErrSnapshotConflict)
	_, err = retain(total + 1)
	wantCode(t, "retention beyond the record tail", err, fault.ErrOffsetOutOfRange)
	_, err = e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("bin"), Record: u64p(0)})
	wantCode(t, "retention record of a binary stream", err, fault.ErrInvalidArgument)

	resp, err := retain(4)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRetainedOffset() != startOf(4) || resp.GetRecordFirst() != 4 || !resp.GetJson() {
		t.Fatalf("retention at record 4: %v, want %s", resp, startOf(4))
	}
	// At or below the current retention: the same answer, no entry.
	before := e.machine(key("js")).Applied()
	for _, n := range []uint64{0, 3, 4} {
		resp, err := retain(n)
		if err != nil || resp.GetRetainedOffset() != startOf(4) || resp.GetRecordFirst() != 4 {
			t.Fatalf("retention at record %d below the current one: %v %v", n, resp, err)
		}
	}
	if got := e.machine(key("js")).Applied(); got != before {
		t.Fatalf("no-op retentions took %d log entries", got-before)
	}
	// Up to the snapshot itself.
	if resp, err := retain(6); err != nil || resp.GetRetainedOffset() != snap.GetOffset() || resp.GetRecordFirst() != 6 {
		t.Fatalf("retention at the snapshot: %v %v", resp, err)
	}
	_, err = e.PutSnapshot(t.Context(), snapReq("js", 5))
	wantCode(t, "snapshot below the first retained record", err, fault.ErrOffsetTrimmed)
}

// TestSubscribeRecords: a subscription's chunks of a JSON stream carry
// their record range, contiguous from the start position's ordinal, for
// catch-up and live chunks alike (SSE control events report them).
func TestSubscribeRecords(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	for i := range 5 {
		mustAppend(t, e, "js", "application/json", fmt.Sprintf(`[%d, %d]`, 2*i, 2*i+1))
	}
	from, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("js"), Record: u64p(3), MaxRecords: 1, NoTouch: true})
	if err != nil {
		t.Fatal(err)
	}
	type chunk struct{ first, next, lines uint64 }
	var got []chunk
	live := false
	appended := make(chan struct{})
	err = e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("js"), Offset: from.GetStartOffset(), MaxBytes: 8}, func(r *streamv1.ReadResponse) error {
		got = append(got, chunk{r.GetRecordFirst(), r.GetRecordNext(), uint64(strings.Count(string(r.GetData()), "\n"))})
		if r.GetUpToDate() && !live {
			live = true
			go func() { // a live append, while the subscription waits
				defer close(appended)
				if _, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json", Body: []byte(`["a", "b"]`)}); err != nil {
					t.Error(err)
				}
			}()
			return nil
		}
		if r.GetRecordNext() == 12 {
			return errStopSubscribe
		}
		return nil
	})
	// The subscription can see the live append before Append returns: the
	// test's context must outlive the call (a CI run saw it canceled).
	if live {
		<-appended
	}
	if err != errStopSubscribe {
		t.Fatalf("Subscribe: %v", err)
	}
	next := uint64(3)
	for i, c := range got {
		if c.first != next || c.next != c.first+c.lines {
			t.Fatalf("chunk %d: %+v after record %d (all %+v)", i, c, next, got)
		}
		next = c.next
	}
	if next != 12 || len(got) < 3 {
		t.Fatalf("chunks %+v", got)
	}
}
