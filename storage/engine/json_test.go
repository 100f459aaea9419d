package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// TestJSONRefusesInvalidText: a JSON body that strict parsers cannot read
// (invalid UTF-8, which json.Valid accepts inside strings, or an escaped
// unpaired surrogate) is refused with INVALID_ARGUMENT before anything is
// proposed, on create, append and append batch alike, so gRPC callers
// cannot store it either.
func TestJSONRefusesInvalidText(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json", HasBody: true, Body: []byte(`{"ok":"é"}`)})
	bad := map[string][]byte{
		"invalid utf-8 in a string": []byte("{\"k\":\"\xff\"}"),
		"invalid utf-8 in a key":    []byte("[{\"\xc3\":1}]"),
		"encoded surrogate":         []byte("\"\xed\xa0\x80\""),
		"escaped lone surrogate":    []byte(`["ok","\udc00"]`),
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := e.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref("new"), ContentType: "application/json", HasBody: true, Body: body})
			wantCode(t, "CreateStream", err, fault.ErrInvalidArgument)
			if exists(e, "new") {
				t.Fatal("the refused create left a stream")
			}
			before, _ := e.machine(key("js")).Lookup(key("js"))
			_, err = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json", Body: body})
			wantCode(t, "Append", err, fault.ErrInvalidArgument)
			resp, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("js"), ContentType: "application/json", Frames: [][]byte{body}})
			if err != nil || len(resp.GetFrames()) != 1 || resp.GetFrames()[0].GetStatus() != 400 {
				t.Fatalf("batch of one bad frame: %v, %v", resp, err)
			}
			if after, _ := e.machine(key("js")).Lookup(key("js")); after.Tail != before.Tail {
				t.Fatalf("the refused writes moved the tail from %d to %d", before.Tail, after.Tail)
			}
		})
	}
	got := readAll(t, e, "js")
	if !utf8.ValidString(got) || got != "{\"ok\":\"é\"}\n" {
		t.Fatalf("stream holds %q", got)
	}
}

// TestJSONReadInsideMessage: a read of a JSON stream from an offset inside
// a message is refused with INVALID_ARGUMENT (its bytes are not JSON),
// whether it is a catch-up read, a long poll or a subscription, and
// whether the message is hot or cold; offsets at a message boundary, the
// start and the tail keep working. Forks and retention may not cut a
// message either.
func TestJSONReadInsideMessage(t *testing.T) {
	store := objstore.NewMemory()
	e := startColdEngine(t, coldTestConfig(t.TempDir()), store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("cold"), ContentType: "application/json"})
	var msgs []string
	for i := range 40 {
		m := fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("p", i%7))
		msgs = append(msgs, m)
		mustAppend(t, e, "cold", "application/json", m)
	}
	waitFlushed(t, e, "cold")
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("hot"), ContentType: "application/json"})
	for _, m := range msgs[:3] {
		mustAppend(t, e, "hot", "application/json", m)
	}
	for _, name := range []string{"hot", "cold"} {
		meta, _ := e.machine(key(name)).Lookup(key(name))
		// boundaries: the start, each message end, the tail.
		var ends []uint64
		p := uint64(0)
		for _, m := range msgs {
			if p >= meta.Tail {
				break
			}
			p += uint64(len(m)) + 1
			ends = append(ends, p)
		}
		inside := []uint64{1, ends[0] - 1, ends[0] + 2, ends[1] + 5}
		t.Run(name, func(t *testing.T) {
			for _, pos := range inside {
				_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: off(pos)})
				wantCode(t, fmt.Sprintf("Read at %d", pos), err, fault.ErrInvalidArgument)
				_, err = e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: off(pos), WaitMs: 10})
				wantCode(t, fmt.Sprintf("long-poll Read at %d", pos), err, fault.ErrInvalidArgument)
				err = e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref(name), Offset: off(pos)}, func(*streamv1.ReadResponse) error { return errStopSubscribe })
				wantCode(t, fmt.Sprintf("Subscribe at %d", pos), err, fault.ErrInvalidArgument)
				_, err = e.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref(fmt.Sprintf("fork-%s-%d", name, pos)),
					Fork: &streamv1.ForkSpec{Source: ref(name), Offset: off(pos)}})
				wantCode(t, fmt.Sprintf("fork at %d", pos), err, fault.ErrInvalidArgument)
			}
			for _, start := range append([]uint64{0}, ends...) {
				resp, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: off(start), NoTouch: true})
				if err != nil {
					t.Fatalf("Read at boundary %d: %v", start, err)
				}
				for _, line := range strings.SplitAfter(string(resp.GetData()), "\n") {
					if line != "" && !json.Valid([]byte(line)) {
						t.Fatalf("Read at %d served %q", start, line)
					}
				}
			}
			for _, o := range []string{stream.OffsetStart, stream.OffsetNow, off(meta.Tail)} {
				if _, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: o, NoTouch: true}); err != nil {
					t.Fatalf("Read at %s: %v", o, err)
				}
				err := e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref(name), Offset: o}, func(*streamv1.ReadResponse) error { return errStopSubscribe })
				if err != errStopSubscribe {
					t.Fatalf("Subscribe at %s: %v", o, err)
				}
			}
			_, err := e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref(name), Offset: off(inside[1])})
			wantCode(t, "retention inside a message", err, fault.ErrInvalidArgument)
			mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("fork-ok-" + name), Fork: &streamv1.ForkSpec{Source: ref(name), Offset: off(ends[1])}})
		})
	}
}
