package gateway

import (
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

func TestAppendJSONArray(t *testing.T) {
	tests := []struct {
		name, stored, want string
	}{
		{"empty", "", "[]"},
		{"one", "{\"a\":1}\n", "[{\"a\":1}]"},
		{"two", "1\n\"x\"\n", "[1,\"x\"]"},
		{"nested array", "[1,2]\n[3]\n", "[[1,2],[3]]"},
		{"no trailing newline", "1\n2", "[1,2]"},
		{"blank lines", "\n1\n\n2\n", "[1,2]"},
		{"crlf", "1\r\n2\r\n", "[1,2]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(appendJSONArray(nil, []byte(tt.stored)))
			if got != tt.want {
				t.Fatalf("appendJSONArray(%q) = %q, want %q", tt.stored, got, tt.want)
			}
			render := func(emit func([]byte)) { renderJSONArray([]byte(tt.stored), emit) }
			var b strings.Builder
			if n, err := writeRendered(&b, render); err != nil || n != len(got) || b.String() != got {
				t.Fatalf("writeRendered = %q (%d, %v), want %q", b.String(), n, err, got)
			}
			if n := renderedSize(render); n != len(got) {
				t.Fatalf("renderedSize = %d, want %d", n, len(got))
			}
		})
	}
}

// TestWriteRenderedPieces: a large rendered response goes out in writes of
// the stored messages themselves and of at most renderBufBytes gathered
// pieces; nothing the size of the whole response is allocated.
func TestWriteRenderedPieces(t *testing.T) {
	var stored []byte
	for i := range 2000 {
		stored = append(stored, strconv.Itoa(i)...)
		stored = append(stored, '\n')
	}
	big := append([]byte(`"`), make([]byte, 1<<20)...)
	for i := 1; i < len(big); i++ {
		big[i] = 'x'
	}
	big = append(big, '"', '\n')
	stored = append(stored, big...)
	render := func(emit func([]byte)) { renderJSONArray(stored, emit) }
	w := &pieceRecorder{}
	n, err := writeRendered(w, render)
	if err != nil || n != renderedSize(render) || n != len(appendJSONArray(nil, stored)) {
		t.Fatalf("wrote %d (%v), size %d", n, err, renderedSize(render))
	}
	if string(w.all) != string(appendJSONArray(nil, stored)) {
		t.Fatal("rendered bytes differ from appendJSONArray")
	}
	for i, p := range w.pieces {
		if p > renderBufBytes && p != len(big)-1 {
			t.Fatalf("write %d of %d bytes: neither a gathered piece nor a stored message", i, p)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 20
	for range runs {
		_, _ = writeRendered(io.Discard, render)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 128<<10 {
		t.Fatalf("%d bytes allocated per rendered response of %d bytes", per, n)
	}
}

// pieceRecorder records the size of each write.
type pieceRecorder struct {
	all    []byte
	pieces []int
}

func (w *pieceRecorder) Write(p []byte) (int, error) {
	w.all = append(w.all, p...)
	w.pieces = append(w.pieces, len(p))
	return len(p), nil
}

func TestAppendSSEData(t *testing.T) {
	tests := []struct {
		name, payload, want string
	}{
		{"single line", "hello", "event: data\ndata:hello\n\n"},
		{"empty", "", "event: data\ndata:\n\n"},
		{"lf", "line1\nline2\nline3", "event: data\ndata:line1\ndata:line2\ndata:line3\n\n"},
		{"trailing lf", "a\n", "event: data\ndata:a\ndata:\n\n"},
		{"crlf injection", "safe\r\n\r\nevent: control\r\ndata: {\"x\":1}\r\n\r\nmore",
			"event: data\ndata:safe\ndata:\ndata:event: control\ndata:data: {\"x\":1}\ndata:\ndata:more\n\n"},
		{"cr only", "start\r\revent: control\rend", "event: data\ndata:start\ndata:\ndata:event: control\ndata:end\n\n"},
		{"lf injection", "start\n\nevent: data\ndata: fake\n\nend",
			"event: data\ndata:start\ndata:\ndata:event: data\ndata:data: fake\ndata:\ndata:end\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(appendSSEData(nil, []byte(tt.payload)))
			if got != tt.want {
				t.Fatalf("appendSSEData(%q) =\n%q\nwant\n%q", tt.payload, got, tt.want)
			}
		})
	}
}

func TestAppendSSEControl(t *testing.T) {
	tests := []struct {
		name string
		c    controlEvent
		want string
	}{
		{"live", controlEvent{NextOffset: "1_2", Cursor: 42, UpToDate: true},
			"event: control\ndata:{\"streamNextOffset\":\"1_2\",\"streamCursor\":\"42\",\"upToDate\":true}\n\n"},
		{"partial", controlEvent{NextOffset: "1_2", Cursor: 42},
			"event: control\ndata:{\"streamNextOffset\":\"1_2\",\"streamCursor\":\"42\"}\n\n"},
		{"closed", controlEvent{NextOffset: "1_2", Cursor: 42, UpToDate: true, Closed: true},
			"event: control\ndata:{\"streamNextOffset\":\"1_2\",\"upToDate\":true,\"streamClosed\":true}\n\n"},
		{"records", controlEvent{NextOffset: "1_2", Cursor: 42, UpToDate: true, Records: true, FirstRecord: 3, NextRecord: 5},
			"event: control\ndata:{\"streamNextOffset\":\"1_2\",\"streamFirstRecord\":3,\"streamNextRecord\":5,\"streamCursor\":\"42\",\"upToDate\":true}\n\n"},
		{"records closed", controlEvent{NextOffset: "1_2", UpToDate: true, Closed: true, Records: true, FirstRecord: 7, NextRecord: 7},
			"event: control\ndata:{\"streamNextOffset\":\"1_2\",\"streamFirstRecord\":7,\"streamNextRecord\":7,\"upToDate\":true,\"streamClosed\":true}\n\n"},
		{"escaped", controlEvent{NextOffset: "a\"b\\\n"},
			"event: control\ndata:{\"streamNextOffset\":\"a\\\"b\\\\\\u000a\",\"streamCursor\":\"0\"}\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(appendSSEControl(nil, tt.c)); got != tt.want {
				t.Fatalf("appendSSEControl =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestSSEPayload(t *testing.T) {
	tests := []struct {
		name string
		mode sseMode
		data string
		want string
	}{
		{"text", sseText, "hi\n", "hi\n"},
		{"json", sseJSON, "{\"n\":1}\n{\"n\":2}\n", "[{\"n\":1},{\"n\":2}]"},
		{"base64", sseBase64, "Hello", "SGVsbG8="},
		{"base64 bytes", sseBase64, "\x00\n\r\xff", "AAoN/w=="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(ssePayload(nil, []byte(tt.data), tt.mode)); got != tt.want {
				t.Fatalf("ssePayload = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSSEWriter(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cur := strconv.FormatUint(currentCursor(now), 10)
	chunk := func(data, next string, upToDate, closed bool) *streamv1.ReadResponse {
		return &streamv1.ReadResponse{Data: []byte(data), NextOffset: next, UpToDate: upToDate, Closed: closed}
	}
	tests := []struct {
		name   string
		mode   sseMode
		chunks []*streamv1.ReadResponse
		want   []string
		done   []bool
	}{
		{
			name:   "empty stream",
			chunks: []*streamv1.ReadResponse{chunk("", "0_0", true, false)},
			want:   []string{"event: control\ndata:{\"streamNextOffset\":\"0_0\",\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n"},
			done:   []bool{false},
		},
		{
			name: "catch-up then caught-up marker is not repeated",
			chunks: []*streamv1.ReadResponse{
				chunk("a", "0_1", false, false),
				chunk("b", "0_2", true, false),
				chunk("", "0_2", true, false),
			},
			want: []string{
				"event: data\ndata:a\n\nevent: control\ndata:{\"streamNextOffset\":\"0_1\",\"streamCursor\":\"" + cur + "\"}\n\n",
				"event: data\ndata:b\n\nevent: control\ndata:{\"streamNextOffset\":\"0_2\",\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n",
				"",
			},
			done: []bool{false, false, false},
		},
		{
			name: "caught-up marker after partial chunk",
			chunks: []*streamv1.ReadResponse{
				chunk("a", "0_1", false, false),
				chunk("", "0_1", true, false),
			},
			want: []string{
				"event: data\ndata:a\n\nevent: control\ndata:{\"streamNextOffset\":\"0_1\",\"streamCursor\":\"" + cur + "\"}\n\n",
				"event: control\ndata:{\"streamNextOffset\":\"0_1\",\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n",
			},
			done: []bool{false, false},
		},
		{
			name: "append and close delivers data before closing",
			chunks: []*streamv1.ReadResponse{
				chunk("", "0_7", true, false),
				chunk("final", "0_12", true, true),
			},
			want: []string{
				"event: control\ndata:{\"streamNextOffset\":\"0_7\",\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n",
				"event: data\ndata:final\n\nevent: control\ndata:{\"streamNextOffset\":\"0_12\",\"upToDate\":true,\"streamClosed\":true}\n\n",
			},
			done: []bool{false, true},
		},
		{
			name: "close after caught up",
			chunks: []*streamv1.ReadResponse{
				chunk("", "0_7", true, false),
				chunk("", "0_7", true, true),
			},
			want: []string{
				"event: control\ndata:{\"streamNextOffset\":\"0_7\",\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n",
				"event: control\ndata:{\"streamNextOffset\":\"0_7\",\"upToDate\":true,\"streamClosed\":true}\n\n",
			},
			done: []bool{false, true},
		},
		{
			name:   "json chunk",
			mode:   sseJSON,
			chunks: []*streamv1.ReadResponse{withRecords(chunk("{\"n\":1}\n{\"n\":2}\n", "0_2", true, false), 3, 5)},
			want: []string{"event: data\ndata:[{\"n\":1},{\"n\":2}]\n\nevent: control\ndata:{\"streamNextOffset\":\"0_2\",\"streamFirstRecord\":3,\"streamNextRecord\":5," +
				"\"streamCursor\":\"" + cur + "\",\"upToDate\":true}\n\n"},
			done: []bool{false},
		},
		{
			name:   "not caught up and empty writes nothing",
			chunks: []*streamv1.ReadResponse{chunk("", "0_2", false, false)},
			want:   []string{""},
			done:   []bool{false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sseWriter{mode: tt.mode}
			for i, c := range tt.chunks {
				out, done := s.appendChunk(c, now)
				if string(out) != tt.want[i] || done != tt.done[i] {
					t.Fatalf("chunk %d: got %q done=%v\nwant %q done=%v", i, out, done, tt.want[i], tt.done[i])
				}
			}
		})
	}
}

func TestCursor(t *testing.T) {
	now := cursorEpoch.Add(100*cursorInterval + time.Second)
	if got := currentCursor(now); got != 100 {
		t.Fatalf("currentCursor = %d, want 100", got)
	}
	if got := currentCursor(cursorEpoch.Add(-time.Hour)); got != 0 {
		t.Fatalf("currentCursor before epoch = %d", got)
	}
	tests := []struct {
		name   string
		client string
		min    uint64
		max    uint64
	}{
		{"absent", "", 100, 100},
		{"behind", "50", 100, 100},
		{"garbage", "abc", 100, 100},
		{"equal", "100", 101, 100 + 180},
		{"ahead", "500", 501, 500 + 180},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 100 {
				got := nextCursor(now, tt.client)
				if got < tt.min || got > tt.max {
					t.Fatalf("nextCursor(%q) = %d, want in [%d, %d]", tt.client, got, tt.min, tt.max)
				}
			}
		})
	}
}

func TestETag(t *testing.T) {
	tag := etag(3, "0_0", "0_5", false)
	if tag != `"3:0_0:0_5"` {
		t.Fatalf("etag = %s", tag)
	}
	if closed := etag(3, "0_0", "0_5", true); closed == tag {
		t.Fatalf("closing must change the etag")
	}
	tests := []struct {
		header string
		match  bool
	}{
		{tag, true},
		{"W/" + tag, true},
		{`"x", ` + tag, true},
		{"*", true},
		{`"wrong-etag"`, false},
		{"", false},
		{`"3:0_0:0_4"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			if got := etagMatches(tt.header, tag); got != tt.match {
				t.Fatalf("etagMatches(%q) = %v", tt.header, got)
			}
		})
	}
}

// withRecords sets a chunk's JSON record range.
func withRecords(c *streamv1.ReadResponse, first, next uint64) *streamv1.ReadResponse {
	c.RecordFirst, c.RecordNext = first, next
	return c
}
