package gateway

import (
	"errors"
	"net/http"
	"strconv"
)

// Stream-Incarnation family headers. Stream-Previous-Incarnation and
// Stream-Inherited-Offset (HEAD) name, once the stream's group started a
// new history (a recovery plan or a restore), the token before it and the
// offset up to which bytes read under that token still hold.
const (
	hStreamIncarnation         = "Stream-Incarnation"
	hStreamPreviousIncarnation = "Stream-Previous-Incarnation"
	hStreamInheritedOffset     = "Stream-Inherited-Offset"
	hClusterID                 = "Ursula-Cluster-Id"
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

// setPreviousIncarnation sets Stream-Previous-Incarnation and
// Stream-Inherited-Offset when the stream went through a new history.
func setPreviousIncarnation(h http.Header, prev uint64, inherited string) {
	if prev != 0 {
		h[hStreamPreviousIncarnation] = []string{strconv.FormatUint(prev, 10)}
		h[hStreamInheritedOffset] = []string{inherited}
	}
}
