package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// maxAttrsBody bounds a PUT …/attrs body.
const maxAttrsBody = 16 << 10

// Attribute errors.
var (
	ErrAttrsTooLarge = errors.New("gateway: attributes are at most 16 KiB")
	ErrBadAttrs      = errors.New("gateway: attributes must be a JSON object {\"title\"?: string, \"metadata\"?: object}")
)

// streamAttrs is the JSON form of a stream's attributes. Unknown top-level
// keys are dropped.
type streamAttrs struct {
	Title    string          `json:"title,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// serveAttrs serves GET and PUT /{bucket}/{stream}/attrs.
func (g *Gateway) serveAttrs(w http.ResponseWriter, r *http.Request, t target) {
	switch r.Method {
	case http.MethodGet:
		resp, err := g.client.GetAttrs(r.Context(), &streamv1.GetAttrsRequest{Ref: t.ref})
		if err != nil {
			g.upstreamError(w, r, err)
			return
		}
		a := resp.GetAttrs()
		writeJSONBody(w, http.StatusOK, streamAttrs{Title: a.GetTitle(), Metadata: a.GetMetadata()})
	case http.MethodPut:
		a, err := parseAttrs(http.MaxBytesReader(w, r.Body, maxAttrsBody))
		if err != nil {
			badRequest(w, err)
			return
		}
		if _, err := g.client.SetAttrs(r.Context(), &streamv1.SetAttrsRequest{Ref: t.ref, Attrs: a}); err != nil {
			g.upstreamError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, OPTIONS")
	}
}

// parseAttrs reads a PUT …/attrs body: a JSON object whose title, when
// present and not null, is a string and whose metadata, when present and
// not null, is an object. Other keys are dropped; {} clears.
func parseAttrs(body io.Reader) (*streamv1.StreamAttrs, error) {
	raw, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, ErrAttrsTooLarge
		}
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil || top == nil {
		return nil, ErrBadAttrs
	}
	a := &streamv1.StreamAttrs{}
	if v, ok := top["title"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &a.Title); err != nil {
			return nil, ErrBadAttrs
		}
	}
	if v, ok := top["metadata"]; ok && !isNull(v) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return nil, ErrBadAttrs
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			return nil, ErrBadAttrs
		}
		a.Metadata = buf.Bytes()
	}
	return a, nil
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }
