package gateway

import (
	"bytes"
	"encoding/base64"
	"io"
	"strconv"
	"strings"
	"sync"
)

// appendJSONArray appends the stored form of JSON messages (one compact JSON
// value per line, each ending in "\n") to dst as one JSON array. Empty lines
// are skipped; no data gives "[]".
func appendJSONArray(dst, stored []byte) []byte {
	dst = append(dst, '[')
	first := true
	start := 0
	for i := 0; i <= len(stored); i++ {
		if i < len(stored) && stored[i] != '\n' {
			continue
		}
		line := stored[start:i]
		start = i + 1
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, line...)
	}
	return append(dst, ']')
}

// appendSSEData appends one SSE "data" event carrying payload: each line of
// payload (split on CRLF, CR and LF; empty lines included) becomes its own
// "data:" line, and a blank line ends the event.
func appendSSEData(dst, payload []byte) []byte {
	dst = append(dst, "event: data\n"...)
	start := 0
	for i := 0; i < len(payload); i++ {
		c := payload[i]
		if c != '\n' && c != '\r' {
			continue
		}
		dst = append(dst, "data:"...)
		dst = append(dst, payload[start:i]...)
		dst = append(dst, '\n')
		if c == '\r' && i+1 < len(payload) && payload[i+1] == '\n' {
			i++
		}
		start = i + 1
	}
	dst = append(dst, "data:"...)
	dst = append(dst, payload[start:]...)
	return append(dst, "\n\n"...)
}

// ssePayload converts a chunk of stored data into the payload of one SSE data
// event: a JSON array for JSON streams, the bytes for text streams, base64
// otherwise.
func ssePayload(dst, data []byte, mode sseMode) []byte {
	switch mode {
	case sseJSON:
		return appendJSONArray(dst, data)
	case sseBase64:
		return base64.StdEncoding.AppendEncode(dst, data)
	default:
		return append(dst, data...)
	}
}

// sseMode says how data events carry a stream's bytes.
type sseMode uint8

const (
	sseText sseMode = iota
	sseJSON
	sseBase64
)

func sseModeFor(contentType string) sseMode {
	switch {
	case isJSONType(contentType):
		return sseJSON
	case isTextType(contentType):
		return sseText
	default:
		return sseBase64
	}
}

// controlEvent is the content of an SSE control event.
type controlEvent struct {
	NextOffset string
	Cursor     uint64
	UpToDate   bool
	Closed     bool
	// Records (JSON streams) adds the record range of the data event
	// before it (FirstRecord == NextRecord without data), as reads answer
	// it in Stream-Record-First/Stream-Record-Next.
	Records                 bool
	FirstRecord, NextRecord uint64
}

// appendSSEControl appends a control event. The data is a flat JSON object;
// streamCursor is left out once the stream is closed; streamFirstRecord and
// streamNextRecord (numbers) are there for JSON streams.
func appendSSEControl(dst []byte, c controlEvent) []byte {
	dst = append(dst, "event: control\ndata:{\"streamNextOffset\":"...)
	dst = appendJSONString(dst, c.NextOffset)
	if c.Records {
		dst = append(dst, ",\"streamFirstRecord\":"...)
		dst = strconv.AppendUint(dst, c.FirstRecord, 10)
		dst = append(dst, ",\"streamNextRecord\":"...)
		dst = strconv.AppendUint(dst, c.NextRecord, 10)
	}
	if !c.Closed {
		dst = append(dst, ",\"streamCursor\":\""...)
		dst = strconv.AppendUint(dst, c.Cursor, 10)
		dst = append(dst, '"')
	}
	if c.UpToDate {
		dst = append(dst, ",\"upToDate\":true"...)
	}
	if c.Closed {
		dst = append(dst, ",\"streamClosed\":true"...)
	}
	return append(dst, "}\n\n"...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// etag returns the ETag of a read: "<incarnation>:<start>:<next>[:c]".
func etag(incarnation uint64, start, next string, closed bool) string {
	b := make([]byte, 0, 8+len(start)+len(next)+24)
	b = append(b, '"')
	b = strconv.AppendUint(b, incarnation, 10)
	b = append(b, ':')
	b = append(b, start...)
	b = append(b, ':')
	b = append(b, next...)
	if closed {
		b = append(b, ":c"...)
	}
	b = append(b, '"')
	return string(b)
}

// etagMatches reports whether an If-None-Match header value matches tag.
func etagMatches(header, tag string) bool {
	for header != "" {
		var part string
		if i := strings.IndexByte(header, ','); i >= 0 {
			part, header = header[:i], header[i+1:]
		} else {
			part, header = header, ""
		}
		part = strings.TrimSpace(part)
		if part == "*" {
			return true
		}
		if len(part) > 2 && part[0] == 'W' && part[1] == '/' {
			part = part[2:]
		}
		if part == tag {
			return true
		}
	}
	return false
}

// renderJSONArray emits the JSON array of stored JSON messages (the bytes
// appendJSONArray appends) in pieces: the brackets, the separators and the
// messages themselves, as slices of stored, so that a large read is never
// copied whole.
func renderJSONArray(stored []byte, emit func([]byte)) {
	emit(jsonOpen)
	first := true
	for len(stored) > 0 {
		line := stored
		if i := bytes.IndexByte(stored, '\n'); i >= 0 {
			line, stored = stored[:i], stored[i+1:]
		} else {
			stored = nil
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 {
			continue
		}
		if !first {
			emit(jsonComma)
		}
		first = false
		emit(line)
	}
	emit(jsonClose)
}

// renderEnvelope emits what appendEnvelope appends, in pieces.
func renderEnvelope(stored []byte, first uint64, emit func([]byte)) {
	var hdr [48]byte
	n := first
	for len(stored) > 0 {
		line := stored
		if i := bytes.IndexByte(stored, '\n'); i >= 0 {
			line, stored = stored[:i], stored[i+1:]
		} else {
			stored = nil
		}
		h := append(hdr[:0], `{"record":`...)
		h = strconv.AppendUint(h, n, 10)
		h = append(h, `,"value":`...)
		emit(h)
		emit(line)
		emit(envelopeEnd)
		n++
	}
}

var (
	jsonOpen    = []byte{'['}
	jsonClose   = []byte{']'}
	jsonComma   = []byte{','}
	envelopeEnd = []byte("}\n")
)

// renderBufBytes is the buffer a rendered response is written through: a
// response of any size holds this much of the gateway's memory for
// rendering, whatever its reader does.
const renderBufBytes = 32 << 10

var renderBufPool = sync.Pool{New: func() any { b := make([]byte, 0, renderBufBytes); return &b }}

// renderedSize returns the number of bytes render emits.
func renderedSize(render func(emit func([]byte))) int {
	n := 0
	render(func(b []byte) { n += len(b) })
	return n
}

// writeRendered writes what render emits to w through a pooled buffer of
// renderBufBytes: small pieces are gathered, large ones (slices of the
// stored bytes) written as they are. It returns the bytes written and the
// first write error, after which nothing more is written.
func writeRendered(w io.Writer, render func(emit func([]byte))) (int, error) {
	bp := renderBufPool.Get().(*[]byte)
	buf := (*bp)[:0]
	written := 0
	var werr error
	write := func(b []byte) {
		if werr != nil || len(b) == 0 {
			return
		}
		n, err := w.Write(b)
		written += n
		werr = err
	}
	render(func(b []byte) {
		if len(buf)+len(b) <= cap(buf) {
			buf = append(buf, b...)
			return
		}
		write(buf)
		buf = buf[:0]
		if len(b) >= cap(buf)/2 {
			write(b)
			return
		}
		buf = append(buf, b...)
	})
	write(buf)
	*bp = buf[:0]
	renderBufPool.Put(bp)
	return written, werr
}
