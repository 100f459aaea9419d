package gateway

import (
	"errors"
	"net/http"
	"strconv"
)

// Stream-Incarnation family headers.
const (
	hStreamIncarnation = "Stream-Incarnation"
	hClusterID         = "Ursula-Cluster-Id"
)

// ErrBadIncarnation answers a Stream-Incarnation that is not a token the
// server issued.
var ErrBadIncarnation = errors.New("gateway: Stream-Incarnation must be a token the server issued (a positive decimal integer)")

// parseIncarnation returns the request's Stream-Incarnation (0 when
// absent).
func parseIncarnation(h http.Header) (uint64, error) {
	v, ok := headerValue(h, hStreamIncarnation)
	if !ok {
		return 0, nil
	}
	n, ok := parseCanonicalUint(v)
	if !ok || n == 0 {
		return 0, ErrBadIncarnation
	}
	return n, nil
}

// setIncarnation sets Stream-Incarnation on a stream response.
func setIncarnation(h http.Header, inc uint64) {
	if inc != 0 {
		h[hStreamIncarnation] = []string{strconv.FormatUint(inc, 10)}
	}
}
