package gateway

import (
	"encoding/json"
	"testing"
)

// TestCreateRefusesUnrepresentableLifetimes: a PUT whose Stream-TTL is
// beyond 100 years (the issue: 9223372036854775807 answered 201 and the
// stream and its body were gone at once) or whose Stream-Expires-At is not
// after the Unix epoch answers 400 INVALID_ARGUMENT without calling the
// node (the fake client fails the test on any call).
func TestCreateRefusesUnrepresentableLifetimes(t *testing.T) {
	for name, hdr := range map[string]map[string]string{
		"ttl of max int64":         {"Stream-TTL": "9223372036854775807"},
		"ttl of max uint64":        {"Stream-TTL": "18446744073709551615"},
		"ttl a second past 100y":   {"Stream-TTL": "3155760001"},
		"expires-at before 1970":   {"Stream-Expires-At": "1969-12-31T23:59:59Z"},
		"expires-at at the epoch":  {"Stream-Expires-At": "1970-01-01T00:00:00Z"},
		"expires-at year zero":     {"Stream-Expires-At": "0000-01-01T00:00:00+00:00"},
		"ttl too long with a body": {"Stream-TTL": "9223372036854775807", "Content-Type": "text/plain"},
	} {
		t.Run(name, func(t *testing.T) {
			g := newTestGateway(t, &fakeClient{t: t}, nil)
			rec := do(t, g, "PUT", "http://example.com/v1/stream/x", "initial body", hdr)
			var body struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != 400 || body.Code != "INVALID_ARGUMENT" {
				t.Fatalf("status %d %s, want 400 INVALID_ARGUMENT", rec.Code, rec.Body)
			}
		})
	}
}
