package engine

import (
	"fmt"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
)

// TestWriterTokens: the node bounds Producer-Id and Stream-Seq itself (a
// gRPC caller skips the gateway's header checks): at most 256 bytes of
// valid UTF-8 without control characters, else INVALID_ARGUMENT and
// nothing is appended, for an append and an append batch alike.
func TestWriterTokens(t *testing.T) {
	e := startEngine(t, nil)
	tests := []struct {
		name string
		v    string
		ok   bool
	}{
		{"256 bytes", strings.Repeat("p", 256), true},
		{"256 bytes of runes", strings.Repeat("é", 128), true},
		{"unicode", "producer-✓", true},
		{"257 bytes", strings.Repeat("p", 257), false},
		{"a megabyte", strings.Repeat("p", 1<<20), false},
		{"invalid utf-8", "p\xff", false},
		{"nul", "p\x00q", false},
		{"newline", "p\nq", false},
		{"tab", "p\tq", false},
		{"del", "p\x7f", false},
		{"c1 control", "p\u0085", false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, batch := range []bool{false, true} {
				for _, field := range []string{"Producer-Id", "Stream-Seq"} {
					name := fmt.Sprintf("s-%d-%v-%s", i, batch, field)
					mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "text/plain"})
					req := &streamv1.AppendRequest{Ref: ref(name), ContentType: "text/plain"}
					if batch {
						req.Frames = [][]byte{[]byte("f")}
					} else {
						req.Body = []byte("b")
					}
					if field == "Producer-Id" {
						req.Producer = &streamv1.Producer{Id: tc.v}
					} else {
						req.StreamSeq = tc.v
					}
					_, err := e.Append(t.Context(), req)
					if tc.ok {
						if err != nil {
							t.Fatalf("batch=%v %s: %v", batch, field, err)
						}
						continue
					}
					wantCode(t, field, err, fault.ErrInvalidArgument)
					if m, _ := e.machine(key(name)).Lookup(key(name)); m.Tail != 0 {
						t.Fatalf("batch=%v %s: the refused append stored %d bytes", batch, field, m.Tail)
					}
				}
			}
		})
	}
}
