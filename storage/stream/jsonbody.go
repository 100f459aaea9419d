package stream

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/ursula/ursula/storage/fault"
)

// FlattenJSON turns a JSON request body into stored form: one compact JSON
// value per line, each followed by '\n'. A top-level array is flattened one
// level (each element is one message); any other value is one message.
// allowEmpty permits "[]" (zero messages), which a create may send and an
// append may not. It returns the stored bytes and the message count.
//
// The body must be valid UTF-8 (json.Valid accepts invalid UTF-8 inside
// strings, which strict parsers then cannot read back) and hold no \u
// escape of an unpaired surrogate (which strict parsers refuse too): the
// character rules of I-JSON (RFC 7493 §2.1) that parsers enforce.
// Noncharacters, which I-JSON also excludes but parsers accept, pass.
// Anything else is INVALID_ARGUMENT, before a command is proposed.
func FlattenJSON(body []byte, allowEmpty bool) ([]byte, int, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "empty JSON body")
	}
	if !json.Valid(trimmed) {
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "body is not valid JSON")
	}
	if err := checkInteroperable(trimmed); err != nil {
		return nil, 0, err
	}
	out := make([]byte, 0, len(trimmed)+8)
	if trimmed[0] != '[' {
		var err error
		if out, err = appendCompact(out, trimmed); err != nil {
			return nil, 0, err
		}
		return append(out, '\n'), 1, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(trimmed, &elems); err != nil {
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "body is not a valid JSON array")
	}
	if len(elems) == 0 {
		if allowEmpty {
			return nil, 0, nil
		}
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "empty JSON array: nothing to append")
	}
	for _, e := range elems {
		var err error
		if out, err = appendCompact(out, e); err != nil {
			return nil, 0, err
		}
		out = append(out, '\n')
	}
	return out, len(elems), nil
}

func appendCompact(dst, v []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(v))
	if err := json.Compact(&buf, v); err != nil {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "body is not valid JSON")
	}
	return append(dst, buf.Bytes()...), nil
}

// IsJSONContentType reports whether a content type is JSON mode.
func IsJSONContentType(ct string) bool {
	return MediaType(ct) == "application/json"
}

// MediaType returns the lower-cased media type of a content type, without
// parameters.
func MediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	// ASCII, the usual case, without allocating (every append compares
	// content types): the same result as the general form below.
	upper := false
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		if c >= utf8.RuneSelf {
			return string(bytes.ToLower(bytes.TrimSpace([]byte(ct))))
		}
		upper = upper || ('A' <= c && c <= 'Z')
	}
	ct = strings.TrimSpace(ct)
	if upper {
		ct = strings.ToLower(ct)
	}
	return ct
}

// SameContentType compares two content types on their media type, case-
// insensitively, ignoring parameters.
func SameContentType(a, b string) bool { return MediaType(a) == MediaType(b) }

// checkInteroperable refuses JSON text (already valid by json.Valid) that
// strict parsers reject: bytes that are not UTF-8, and \u escapes of a
// surrogate that is not part of a pair (RFC 7493 §2.1).
func checkInteroperable(b []byte) error {
	if !utf8.Valid(b) {
		return fault.Errorf(fault.ErrInvalidArgument, "body is not valid UTF-8 (at byte %d)", invalidUTF8At(b))
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		// A string: skip to its closing quote, checking its escapes.
		for i++; i < len(b) && b[i] != '"'; i++ {
			if b[i] != '\\' {
				continue
			}
			i++
			if i >= len(b) || b[i] != 'u' {
				continue
			}
			r := hex4(b[i+1:])
			i += 4
			switch {
			case r >= 0xdc00 && r <= 0xdfff:
				return fault.Errorf(fault.ErrInvalidArgument, "body escapes an unpaired low surrogate \\u%04x", r)
			case r >= 0xd800 && r <= 0xdbff:
				if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
					if lo := hex4(b[i+3:]); lo >= 0xdc00 && lo <= 0xdfff {
						i += 6
						continue
					}
				}
				return fault.Errorf(fault.ErrInvalidArgument, "body escapes an unpaired high surrogate \\u%04x", r)
			}
		}
	}
	return nil
}

// hex4 decodes the 4 hex digits a \u escape of valid JSON holds (-1 when
// b is shorter).
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// invalidUTF8At is the offset of the first byte of b that is not UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}
