package gateway

import (
	"errors"
	"net/http"
	"testing"
)

func TestParseOffset(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"start", "-1", true},
		{"now", "now", true},
		{"issued", "0000000000000000_0000000000000000", true},
		{"short", "1_2", true},
		{"empty", "", false},
		{"comma", "0,1", false},
		{"space", "0 1", false},
		{"slash", "1/2", false},
		{"traversal", "../1_2", false},
		{"nul", "1_2\x00", false},
		{"newline", "1_2\n", false},
		{"no underscore", "12", false},
		{"leading underscore", "_12", false},
		{"trailing underscore", "12_", false},
		{"two underscores", "1_2_3", false},
		{"upper now", "NOW", false},
		{"minus two", "-2", false},
		{"too long", string(make([]byte, 300)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseOffset(tt.in)
			if tt.ok != (err == nil) {
				t.Fatalf("ParseOffset(%q) err = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if tt.ok && got != tt.in {
				t.Fatalf("ParseOffset(%q) = %q", tt.in, got)
			}
		})
	}
}

func TestParseTTL(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
		ok   bool
	}{
		{"zero", "0", 0, true},
		{"hour", "3600", 3600, true},
		{"leading zeros", "00060", 0, false},
		{"plus", "+60", 0, false},
		{"float", "60.5", 0, false},
		{"scientific", "1e3", 0, false},
		{"negative", "-1", 0, false},
		{"letters", "abc", 0, false},
		{"empty", "", 0, false},
		{"space", " 60", 0, false},
		{"overflow", "99999999999999999999999", 0, false},
		{"100 years", "3155760000", 3155760000, true},
		{"over 100 years", "3155760001", 0, false},
		{"max int64", "9223372036854775807", 0, false},
		{"max uint64", "18446744073709551615", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTTL(tt.in)
			if tt.ok != (err == nil) || got != tt.want {
				t.Fatalf("ParseTTL(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestParseExpiresAt(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"zulu", "2030-01-02T03:04:05Z", true},
		{"offset", "2030-01-02T03:04:05+00:00", true},
		{"js millis", "2030-01-02T03:04:05.678Z", true},
		{"nanos", "2030-01-02T03:04:05.123456789-07:00", true},
		{"garbage", "not-a-timestamp", false},
		{"date only", "2030-01-02", false},
		{"no zone", "2030-01-02T03:04:05", false},
		{"empty", "", false},
		{"year 9999", "9999-12-31T23:59:59.999Z", true},
		{"after the epoch", "1970-01-01T00:00:00.001Z", true},
		{"the epoch", "1970-01-01T00:00:00Z", false},
		{"before the epoch", "1969-12-31T23:59:59Z", false},
		{"year zero", "0000-01-01T00:00:00Z", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseExpiresAt(tt.in)
			if tt.ok != (err == nil) {
				t.Fatalf("ParseExpiresAt(%q) err = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if tt.ok && got != tt.in {
				t.Fatalf("ParseExpiresAt(%q) = %q, want the input unchanged", tt.in, got)
			}
		})
	}
}

func TestParseClosed(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"true", true}, {"TRUE", true}, {"True", true}, {" true ", true},
		{"false", false}, {"yes", false}, {"1", false}, {"", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := ParseClosed(tt.in); got != tt.want {
				t.Fatalf("ParseClosed(%q) = %v", tt.in, got)
			}
		})
	}
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseProducer(t *testing.T) {
	tests := []struct {
		name    string
		h       http.Header
		want    ProducerHeaders
		present bool
		err     error
	}{
		{"none", header(), ProducerHeaders{}, false, nil},
		{"all", header("Producer-Id", "p", "Producer-Epoch", "2", "Producer-Seq", "7"), ProducerHeaders{"p", 2, 7}, true, nil},
		{"max safe", header("Producer-Id", "p", "Producer-Epoch", "9007199254740991", "Producer-Seq", "0"), ProducerHeaders{"p", 9007199254740991, 0}, true, nil},
		{"above max safe", header("Producer-Id", "p", "Producer-Epoch", "9007199254740992", "Producer-Seq", "0"), ProducerHeaders{}, false, ErrBadProducerEpoch},
		{"zero padded", header("Producer-Id", "p", "Producer-Epoch", "0001", "Producer-Seq", "00"), ProducerHeaders{"p", 1, 0}, true, nil},
		{"only id", header("Producer-Id", "p"), ProducerHeaders{}, false, ErrPartialProducer},
		{"only epoch", header("Producer-Epoch", "0"), ProducerHeaders{}, false, ErrPartialProducer},
		{"missing seq", header("Producer-Id", "p", "Producer-Epoch", "0"), ProducerHeaders{}, false, ErrPartialProducer},
		{"empty id", header("Producer-Id", "", "Producer-Epoch", "0", "Producer-Seq", "0"), ProducerHeaders{}, false, ErrEmptyProducerID},
		{"seq junk", header("Producer-Id", "p", "Producer-Epoch", "0", "Producer-Seq", "1abc"), ProducerHeaders{}, false, ErrBadProducerSeq},
		{"epoch junk", header("Producer-Id", "p", "Producer-Epoch", "0xyz", "Producer-Seq", "0"), ProducerHeaders{}, false, ErrBadProducerEpoch},
		{"scientific", header("Producer-Id", "p", "Producer-Epoch", "1e3", "Producer-Seq", "0"), ProducerHeaders{}, false, ErrBadProducerEpoch},
		{"negative", header("Producer-Id", "p", "Producer-Epoch", "-1", "Producer-Seq", "0"), ProducerHeaders{}, false, ErrBadProducerEpoch},
		{"empty seq", header("Producer-Id", "p", "Producer-Epoch", "0", "Producer-Seq", ""), ProducerHeaders{}, false, ErrBadProducerSeq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, present, err := ParseProducer(tt.h)
			if !errors.Is(err, tt.err) || present != tt.present || got != tt.want {
				t.Fatalf("ParseProducer = %+v, %v, %v; want %+v, %v, %v", got, present, err, tt.want, tt.present, tt.err)
			}
		})
	}
}

func TestParseCreate(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want CreateHeaders
		err  error
	}{
		{"plain", header("Content-Type", "text/plain"), CreateHeaders{ContentType: "text/plain"}, nil},
		{"ttl", header("Stream-TTL", "3600"), CreateHeaders{HasTTL: true, TTLSeconds: 3600}, nil},
		{"ttl zero", header("Stream-TTL", "0"), CreateHeaders{HasTTL: true}, nil},
		{"expires", header("Stream-Expires-At", "2030-01-01T00:00:00Z"), CreateHeaders{ExpiresAt: "2030-01-01T00:00:00Z"}, nil},
		{"both", header("Stream-TTL", "1", "Stream-Expires-At", "2030-01-01T00:00:00Z"), CreateHeaders{}, ErrTTLAndExpiresAt},
		{"bad ttl", header("Stream-TTL", "00060"), CreateHeaders{}, ErrBadTTL},
		{"ttl past 100 years", header("Stream-TTL", "9223372036854775807"), CreateHeaders{}, ErrTTLTooLong},
		{"expires before the epoch", header("Stream-Expires-At", "1969-07-20T20:17:40Z"), CreateHeaders{}, ErrBadExpiresAt},
		{"empty ttl", header("Stream-TTL", ""), CreateHeaders{}, ErrBadTTL},
		{"bad expires", header("Stream-Expires-At", "tomorrow"), CreateHeaders{}, ErrBadExpiresAt},
		{"closed", header("Stream-Closed", "TRUE"), CreateHeaders{Closed: true}, nil},
		{"closed other", header("Stream-Closed", "yes"), CreateHeaders{}, nil},
		{"fork", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Offset", "0000000000000000_0000000000000000", "Stream-Fork-Sub-Offset", "3"),
			CreateHeaders{ForkedFrom: "/v1/stream/src", ForkOffset: "0000000000000000_0000000000000000", ForkSubOffset: 3}, nil},
		{"fork sub zero", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Sub-Offset", "0"), CreateHeaders{ForkedFrom: "/v1/stream/src"}, nil},
		{"sub without from", header("Stream-Fork-Sub-Offset", "0"), CreateHeaders{}, ErrForkWithoutFrom},
		{"offset without from", header("Stream-Fork-Offset", "1_1"), CreateHeaders{}, ErrForkWithoutFrom},
		{"bad fork offset", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Offset", "now"), CreateHeaders{}, ErrBadForkOffset},
		{"bad sub offset", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Sub-Offset", "05"), CreateHeaders{}, ErrBadForkSubOffset},
		{"negative sub offset", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Sub-Offset", "-1"), CreateHeaders{}, ErrBadForkSubOffset},
		{"float sub offset", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Sub-Offset", "1.5"), CreateHeaders{}, ErrBadForkSubOffset},
		{"plus sub offset", header("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Sub-Offset", "+1"), CreateHeaders{}, ErrBadForkSubOffset},
		{"empty from", header("Stream-Forked-From", " "), CreateHeaders{}, ErrBadForkedFrom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCreate(tt.h)
			if !errors.Is(err, tt.err) || got != tt.want {
				t.Fatalf("ParseCreate = %+v, %v; want %+v, %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestParseReadParams(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want readParams
		err  error
	}{
		{"absent", "", readParams{offset: "-1"}, nil},
		{"start", "offset=-1", readParams{offset: "-1"}, nil},
		{"unknown params", "offset=-1&foo=bar&baz=qux", readParams{offset: "-1"}, nil},
		{"empty", "offset=", readParams{}, ErrBadOffsetParam},
		{"repeated", "offset=a&offset=b", readParams{}, ErrBadOffsetParam},
		{"malformed", "offset=0%2C1", readParams{}, ErrBadOffset},
		{"long-poll", "offset=now&live=long-poll&cursor=12", readParams{offset: "now", live: "long-poll", cursor: "12"}, nil},
		{"long-poll without offset", "live=long-poll", readParams{}, ErrLiveNeedsOffset},
		{"sse without offset", "live=sse", readParams{}, ErrLiveNeedsOffset},
		{"unknown live", "live=other", readParams{offset: "-1", live: "other"}, nil},
		{"bad escape", "offset=%zz", readParams{}, ErrBadQuery},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseReadParams(tt.raw)
			if !errors.Is(err, tt.err) || got != tt.want {
				t.Fatalf("parseReadParams(%q) = %+v, %v; want %+v, %v", tt.raw, got, err, tt.want, tt.err)
			}
		})
	}
}

func TestValidateBucket(t *testing.T) {
	tests := []struct {
		in  string
		err error
	}{
		{"orders", nil},
		{"a1", nil},
		{"my.bucket_x-1", nil},
		{"__ds", ErrReservedBucket},
		{"__x", ErrReservedBucket},
		{"a", ErrBadBucket},
		{"Upper", ErrBadBucket},
		{"-dash", ErrBadBucket},
		{"has space", ErrBadBucket},
		{string(make([]byte, 64)), ErrBadBucket},
		{"", ErrBadBucket},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if err := ValidateBucket(tt.in); !errors.Is(err, tt.err) {
				t.Fatalf("ValidateBucket(%q) = %v, want %v", tt.in, err, tt.err)
			}
		})
	}
}

func TestValidateStreamID(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"events", true},
		{"a/b/c", true},
		{"x-1_2.3", true},
		{"", false},
		{"a//b", false},
		{"a/", false},
		{"../x", false},
		{"a/./b", false},
		{"a\x00b", false},
		{"a\nb", false},
		{"ünïcode/✓", true},
		{"\xb5", false},
		{"a/\xed\xa0\x80", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if err := ValidateStreamID(tt.in); (err == nil) != tt.ok {
				t.Fatalf("ValidateStreamID(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			}
		})
	}
}

func TestContentTypeModes(t *testing.T) {
	tests := []struct {
		ct   string
		json bool
		mode sseMode
	}{
		{"application/json", true, sseJSON},
		{"APPLICATION/JSON; charset=utf-8", true, sseJSON},
		{"text/plain", false, sseText},
		{"Text/Html;charset=utf-8", false, sseText},
		{"application/octet-stream", false, sseBase64},
		{"application/x-protobuf", false, sseBase64},
		{"image/png", false, sseBase64},
		{"", false, sseBase64},
	}
	for _, tt := range tests {
		t.Run(tt.ct, func(t *testing.T) {
			if got := isJSONType(tt.ct); got != tt.json {
				t.Fatalf("isJSONType(%q) = %v", tt.ct, got)
			}
			if got := sseModeFor(tt.ct); got != tt.mode {
				t.Fatalf("sseModeFor(%q) = %v, want %v", tt.ct, got, tt.mode)
			}
		})
	}
}
