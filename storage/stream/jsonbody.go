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
func FlattenJSON(body []byte, allowEmpty bool) ([]byte, int, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "empty JSON body")
	}
	if !json.Valid(trimmed) {
		return nil, 0, fault.Errorf(fault.ErrInvalidArgument, "body is not valid JSON")
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
