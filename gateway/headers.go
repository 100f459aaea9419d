package gateway

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Protocol header names in canonical MIME form, so they can index
// http.Header directly.
const (
	hContentType         = "Content-Type"
	hStreamNextOffset    = "Stream-Next-Offset"
	hRetainedOffset      = "Stream-Retained-Offset"
	hStreamUpToDate      = "Stream-Up-To-Date"
	hStreamClosed        = "Stream-Closed"
	hStreamCursor        = "Stream-Cursor"
	hStreamSeq           = "Stream-Seq"
	hStreamTTL           = "Stream-Ttl"
	hStreamExpiresAt     = "Stream-Expires-At"
	hStreamForkedFrom    = "Stream-Forked-From"
	hStreamForkOffset    = "Stream-Fork-Offset"
	hStreamForkSubOffset = "Stream-Fork-Sub-Offset"
	hStreamSSEEncoding   = "Stream-Sse-Data-Encoding"
	hProducerID          = "Producer-Id"
	hProducerEpoch       = "Producer-Epoch"
	hProducerSeq         = "Producer-Seq"
	hProducerExpectedSeq = "Producer-Expected-Seq"
	hProducerReceivedSeq = "Producer-Received-Seq"
	hProducerOutcome     = "Producer-Outcome"
	hETag                = "Etag"
	hIfNoneMatch         = "If-None-Match"
	hCacheControl        = "Cache-Control"
	hLocation            = "Location"
	hRetryAfter          = "Retry-After"
)

// maxSafeInteger is 2^53-1, the largest producer epoch or seq accepted.
const maxSafeInteger = 1<<53 - 1

// maxOffsetLen bounds offsets accepted from clients.
const maxOffsetLen = 256

// maxHeaderTextLen bounds the free-text headers the node stores:
// Producer-Id and Stream-Seq (kept per producer and per stream, and in
// every group snapshot) and Content-Type.
const maxHeaderTextLen = 256

// Parse errors; each becomes a 400 INVALID_ARGUMENT.
var (
	ErrBadOffset        = errors.New("gateway: offset must be -1, now or a server-issued offset")
	ErrBadTTL           = errors.New("gateway: Stream-TTL must be a non-negative integer without sign or leading zeros")
	ErrBadExpiresAt     = errors.New("gateway: Stream-Expires-At must be an RFC 3339 timestamp after 1970-01-01T00:00:00Z")
	ErrTTLTooLong       = errors.New("gateway: Stream-TTL must be at most 3155760000 seconds (100 years)")
	ErrTTLAndExpiresAt  = errors.New("gateway: Stream-TTL and Stream-Expires-At are mutually exclusive")
	ErrPartialProducer  = errors.New("gateway: Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
	ErrEmptyProducerID  = errors.New("gateway: Producer-Id must not be empty")
	ErrBadProducerEpoch = errors.New("gateway: Producer-Epoch must be an integer between 0 and 2^53-1")
	ErrBadProducerSeq   = errors.New("gateway: Producer-Seq must be an integer between 0 and 2^53-1")
	ErrBadForkOffset    = errors.New("gateway: Stream-Fork-Offset must be a server-issued offset")
	ErrBadForkSubOffset = errors.New("gateway: Stream-Fork-Sub-Offset must be a non-negative integer without sign or leading zeros")
	ErrForkWithoutFrom  = errors.New("gateway: Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
	ErrBadForkedFrom    = errors.New("gateway: Stream-Forked-From must be the path of a stream on this server")
	ErrBadProducerID    = errors.New("gateway: Producer-Id must be valid UTF-8 without control characters, at most 256 bytes")
	ErrBadStreamSeq     = errors.New("gateway: Stream-Seq must be valid UTF-8 without control characters, at most 256 bytes")
	ErrBadContentType   = errors.New("gateway: Content-Type must be valid UTF-8 without control characters, at most 256 bytes")
)

// validHeaderText reports whether a header value the node stores is
// acceptable: at most maxHeaderTextLen bytes of valid UTF-8 without
// control characters (C0, DEL, C1), a horizontal tab allowed when tab is
// set. HTTP lets obs-text bytes through, which are not UTF-8, and the
// node's protobuf strings must be.
func validHeaderText(s string, tab bool) bool {
	if len(s) > maxHeaderTextLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			continue
		}
		if c == '\t' && tab {
			continue
		}
		if c < 0x80 {
			return false
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 || unicode.IsControl(r) {
			return false
		}
		i += n - 1
	}
	return true
}

// checkContentType validates a Content-Type value the node stores.
func checkContentType(ct string) error {
	if !validHeaderText(ct, true) {
		return ErrBadContentType
	}
	return nil
}

// ParseStreamSeq returns the Stream-Seq header ("" when absent).
func ParseStreamSeq(h http.Header) (string, error) {
	seq, _ := headerValue(h, hStreamSeq)
	if !validHeaderText(seq, false) {
		return "", ErrBadStreamSeq
	}
	return seq, nil
}

// headerValue returns the first value of the canonical header key and
// whether the header was present at all.
func headerValue(h http.Header, key string) (string, bool) {
	v, ok := h[key]
	if !ok || len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// isDigits reports whether s is one or more ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isOffsetToken reports whether s has the form digits "_" digits.
func isOffsetToken(s string) bool {
	if len(s) > maxOffsetLen {
		return false
	}
	i := strings.IndexByte(s, '_')
	return i > 0 && isDigits(s[:i]) && isDigits(s[i+1:])
}

// ParseOffset validates a read offset: "-1", "now" or digits_digits.
func ParseOffset(s string) (string, error) {
	if s == "-1" || s == "now" || isOffsetToken(s) {
		return s, nil
	}
	return "", ErrBadOffset
}

// parseCanonicalUint parses ^(0|[1-9][0-9]*)$ into a uint64.
func parseCanonicalUint(s string) (uint64, bool) {
	if !isDigits(s) || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// maxTTLSeconds is the longest Stream-TTL: 100 years, the node's bound
// (storage/stream.MaxTTLSeconds, which documents why), repeated here
// because the gateway does not import storage.
const maxTTLSeconds = 3_155_760_000

// ParseTTL parses a Stream-TTL value (seconds, at most 100 years).
func ParseTTL(s string) (uint64, error) {
	n, ok := parseCanonicalUint(s)
	if !ok {
		return 0, ErrBadTTL
	}
	if n > maxTTLSeconds {
		return 0, ErrTTLTooLong
	}
	return n, nil
}

// ParseExpiresAt validates a Stream-Expires-At value and returns it
// unchanged (the node stores and compares the client's spelling). An
// instant at or before the Unix epoch (in milliseconds) cannot be stored.
func ParseExpiresAt(s string) (string, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.UnixMilli() <= 0 {
		return "", ErrBadExpiresAt
	}
	return s, nil
}

// ParseClosed reports whether a Stream-Closed value means "closed": only
// "true", case-insensitively; every other value counts as absent.
func ParseClosed(s string) bool {
	return strings.EqualFold(strings.TrimSpace(s), "true")
}

// parseSafeUint parses ^[0-9]+$ bounded by 2^53-1.
func parseSafeUint(s string) (uint64, bool) {
	if !isDigits(s) {
		return 0, false
	}
	// Strip leading zeros so that long zero-padded values still parse.
	t := strings.TrimLeft(s, "0")
	if t == "" {
		return 0, true
	}
	if len(t) > 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n > maxSafeInteger {
		return 0, false
	}
	return n, true
}

// ProducerHeaders are the parsed idempotent-producer headers.
type ProducerHeaders struct {
	ID    string
	Epoch uint64
	Seq   uint64
}

// ParseProducer parses the producer headers of h. It returns ok=false and no
// error when none of them is present.
func ParseProducer(h http.Header) (p ProducerHeaders, ok bool, err error) {
	id, hasID := headerValue(h, hProducerID)
	epoch, hasEpoch := headerValue(h, hProducerEpoch)
	seq, hasSeq := headerValue(h, hProducerSeq)
	if !hasID && !hasEpoch && !hasSeq {
		return ProducerHeaders{}, false, nil
	}
	if !hasID || !hasEpoch || !hasSeq {
		return ProducerHeaders{}, false, ErrPartialProducer
	}
	if strings.TrimSpace(id) == "" {
		return ProducerHeaders{}, false, ErrEmptyProducerID
	}
	if !validHeaderText(id, false) {
		return ProducerHeaders{}, false, ErrBadProducerID
	}
	e, good := parseSafeUint(epoch)
	if !good {
		return ProducerHeaders{}, false, ErrBadProducerEpoch
	}
	s, good := parseSafeUint(seq)
	if !good {
		return ProducerHeaders{}, false, ErrBadProducerSeq
	}
	return ProducerHeaders{ID: id, Epoch: e, Seq: s}, true, nil
}

// CreateHeaders are the parsed headers of a PUT (create) request.
type CreateHeaders struct {
	ContentType   string
	HasTTL        bool
	TTLSeconds    uint64
	ExpiresAt     string
	Closed        bool
	ForkedFrom    string // raw Stream-Forked-From; empty when not a fork
	ForkOffset    string
	ForkSubOffset uint64
}

// ParseCreate parses and validates the headers of a create request.
func ParseCreate(h http.Header) (CreateHeaders, error) {
	var c CreateHeaders
	c.ContentType, _ = headerValue(h, hContentType)
	if err := checkContentType(c.ContentType); err != nil {
		return CreateHeaders{}, err
	}
	ttl, hasTTL := headerValue(h, hStreamTTL)
	exp, hasExp := headerValue(h, hStreamExpiresAt)
	if hasTTL && hasExp {
		return CreateHeaders{}, ErrTTLAndExpiresAt
	}
	if hasTTL {
		n, err := ParseTTL(ttl)
		if err != nil {
			return CreateHeaders{}, err
		}
		c.HasTTL, c.TTLSeconds = true, n
	}
	if hasExp {
		v, err := ParseExpiresAt(exp)
		if err != nil {
			return CreateHeaders{}, err
		}
		c.ExpiresAt = v
	}
	if v, ok := headerValue(h, hStreamClosed); ok {
		c.Closed = ParseClosed(v)
	}
	from, hasFrom := headerValue(h, hStreamForkedFrom)
	off, hasOff := headerValue(h, hStreamForkOffset)
	sub, hasSub := headerValue(h, hStreamForkSubOffset)
	if (hasOff || hasSub) && !hasFrom {
		return CreateHeaders{}, ErrForkWithoutFrom
	}
	if hasFrom {
		if strings.TrimSpace(from) == "" {
			return CreateHeaders{}, ErrBadForkedFrom
		}
		c.ForkedFrom = from
	}
	if hasOff {
		if !isOffsetToken(off) {
			return CreateHeaders{}, ErrBadForkOffset
		}
		c.ForkOffset = off
	}
	if hasSub {
		n, ok := parseCanonicalUint(sub)
		if !ok {
			return CreateHeaders{}, ErrBadForkSubOffset
		}
		c.ForkSubOffset = n
	}
	return c, nil
}

// isJSONType reports whether a content type's media type is
// application/json (parameters and case ignored).
func isJSONType(ct string) bool {
	return mediaTypeIs(ct, "application/json")
}

// isTextType reports whether SSE carries the stream's data as text:
// text/* and application/json; everything else is base64.
func isTextType(ct string) bool {
	mt := mediaType(ct)
	if len(mt) >= 5 && strings.EqualFold(mt[:5], "text/") {
		return true
	}
	return strings.EqualFold(mt, "application/json")
}

// mediaType returns the media type of ct without parameters or surrounding
// space.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.TrimSpace(ct)
}

func mediaTypeIs(ct, want string) bool {
	return strings.EqualFold(mediaType(ct), want)
}
