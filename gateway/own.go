package gateway

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
)

// readyProbeTimeout bounds the node probe of /__ursula/ready.
const readyProbeTimeout = 2 * time.Second

// readyProbeStream is the stream the readiness probe asks about; it need not
// exist (STREAM_NOT_FOUND proves the node answers).
const readyProbeStream = "__ursula-ready-probe"

// openAPI is the OpenAPI 3 document of the data plane, openapi.yaml as
// JSON (make generate writes openapi.json from it).
//
//go:embed openapi.json
var openAPI []byte

// serveOwn serves /__ursula/{ready,metrics,prometheus,openapi.json}.
func (g *Gateway) serveOwn(w http.ResponseWriter, r *http.Request, name string) {
	switch name {
	case "ready", "metrics", "openapi.json":
	case "prometheus":
		if g.cfg.Prometheus == nil {
			notFound(w, "prometheus endpoint not enabled")
			return
		}
	default:
		notFound(w, "no such resource")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET, HEAD, OPTIONS")
		return
	}
	if name == "prometheus" {
		w.Header()[hCacheControl] = valNoStore
		g.cfg.Prometheus.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	h[hCacheControl] = valNoStore
	h.Set(hContentType, "application/json")
	if name == "openapi.json" {
		h.Set("Content-Length", strconv.Itoa(len(openAPI)))
		_, _ = w.Write(openAPI)
		return
	}
	if name == "metrics" {
		body := g.metrics.appendJSON(make([]byte, 0, 1024))
		h.Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		return
	}
	reason := g.probe(r.Context())
	var body []byte
	status := http.StatusOK
	if reason == "" {
		body = []byte(`{"ready":true}` + "\n")
	} else {
		status = http.StatusServiceUnavailable
		body, _ = json.Marshal(struct {
			Ready  bool   `json:"ready"`
			Reason string `json:"reason"`
		}{false, reason})
		body = append(body, '\n')
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// probe asks the node about a stream that need not exist; it returns the
// reason the gateway is not ready, or "".
func (g *Gateway) probe(ctx context.Context) string {
	if g.stopCtx.Err() != nil {
		return "shutting down"
	}
	ctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
	defer cancel()
	_, err := g.client.Head(ctx, &streamv1.HeadRequest{Ref: &streamv1.StreamRef{Bucket: BuiltinBucket, Stream: readyProbeStream}})
	if err == nil {
		return ""
	}
	de := toDomain(err)
	switch de.Code {
	case errcode.StreamNotFound, errcode.StreamGone, errcode.BucketNotFound:
		return ""
	}
	return "node probe failed: " + de.Error()
}

// notFound writes a 404 for a path the gateway does not serve.
func notFound(w http.ResponseWriter, msg string) {
	writeDomainError(w, &errcode.Error{Code: errcode.NotFound, Message: msg})
}

// methodNotAllowed writes a 405 with an Allow header.
func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeDomainError(w, &errcode.Error{Code: errcode.MethodNotAllowed, Message: "method not allowed"})
}

// Bucket name errors.
var (
	ErrReservedBucket = errors.New("gateway: bucket names beginning with \"__\" are reserved")
	ErrBadBucket      = errors.New("gateway: bucket names are 2-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit")
)

// ValidateBucket checks a user bucket name: ^[a-z0-9][a-z0-9._-]{1,62}$ and
// not beginning with "__".
func ValidateBucket(name string) error {
	if len(name) >= 2 && name[0] == '_' && name[1] == '_' {
		return ErrReservedBucket
	}
	if len(name) < 2 || len(name) > 63 {
		return ErrBadBucket
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return ErrBadBucket
		}
	}
	return nil
}

// createBucket serves PUT /{bucket}.
func (g *Gateway) createBucket(w http.ResponseWriter, r *http.Request, bucket string) {
	resp, err := g.client.CreateBucket(r.Context(), &streamv1.CreateBucketRequest{Bucket: bucket})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	if resp.GetCreated() {
		w.Header().Set(hLocation, absoluteURL(r))
		w.WriteHeader(http.StatusCreated)
		return
	}
	w.WriteHeader(http.StatusOK)
}
