package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// Bucket and listing errors.
var (
	ErrReservedName = errors.New("gateway: the bucket name \"snapshots\" and the stream id \"streams\" are reserved")
	ErrBadLimit     = errors.New("gateway: limit must be an integer from 1 to 1000")
)

// Names reserved in Ursula's family.
const (
	reservedBucket = "snapshots"
	listSegment    = "streams"
	maxListLimit   = 1000
)

// bucketInfo is the body of GET /{bucket}.
type bucketInfo struct {
	BucketID    string `json:"bucket_id"`
	CreatedAtMs int64  `json:"created_at_ms"`
	StreamCount uint64 `json:"stream_count"`
}

// serveBucket serves /{bucket}: PUT creates, GET describes, DELETE removes
// an empty bucket.
func (g *Gateway) serveBucket(w http.ResponseWriter, r *http.Request, bucket string) {
	switch r.Method {
	case http.MethodPut:
		if bucket == reservedBucket {
			badRequest(w, ErrReservedName)
			return
		}
		g.createBucket(w, r, bucket)
	case http.MethodGet:
		resp, err := g.client.GetBucket(r.Context(), &streamv1.GetBucketRequest{Bucket: bucket})
		if err != nil {
			g.upstreamError(w, r, err)
			return
		}
		writeJSONBody(w, http.StatusOK, bucketInfo{BucketID: resp.GetBucket(), CreatedAtMs: resp.GetCreatedMs(), StreamCount: resp.GetStreamCount()})
	case http.MethodDelete:
		if _, err := g.client.DeleteBucket(r.Context(), &streamv1.DeleteBucketRequest{Bucket: bucket}); err != nil {
			g.upstreamError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE, OPTIONS")
	}
}

// streamListing is one item of GET /{bucket}/streams.
type streamListing struct {
	StreamID      string `json:"stream_id"`
	Status        string `json:"status"`
	ContentType   string `json:"content_type"`
	TailOffset    string `json:"tail_offset"`
	CreatedAtMs   int64  `json:"created_at_ms"`
	LastWriteAtMs int64  `json:"last_write_at_ms"`
}

// streamList is the body of GET /{bucket}/streams.
type streamList struct {
	Streams    []streamListing `json:"streams"`
	NextCursor *string         `json:"next_cursor"`
	HasMore    bool            `json:"has_more"`
}

// serveList serves /{bucket}/streams: GET lists the bucket's streams in id
// order (?prefix, ?after cursor, ?limit 1..1000, default 100).
func (g *Gateway) serveList(w http.ResponseWriter, r *http.Request, bucket string) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		badRequest(w, ErrReservedName)
		return
	default:
		methodNotAllowed(w, "GET, OPTIONS")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		badRequest(w, ErrBadQuery)
		return
	}
	req := &streamv1.ListStreamsRequest{Bucket: bucket, Prefix: q.Get("prefix"), After: q.Get("after")}
	if v, ok := q["limit"]; ok {
		n, ok := parseCanonicalUint(v[0])
		if len(v) != 1 || !ok || n < 1 || n > maxListLimit {
			badRequest(w, ErrBadLimit)
			return
		}
		req.Limit = uint32(n)
	}
	resp, err := g.client.ListStreams(r.Context(), req)
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	out := streamList{Streams: make([]streamListing, 0, len(resp.GetStreams())), HasMore: resp.GetHasMore()}
	for _, s := range resp.GetStreams() {
		out.Streams = append(out.Streams, streamListing{
			StreamID: s.GetStreamId(), Status: s.GetStatus(), ContentType: s.GetContentType(),
			TailOffset: s.GetTailOffset(), CreatedAtMs: s.GetCreatedAtMs(), LastWriteAtMs: s.GetLastWriteAtMs(),
		})
	}
	if c := resp.GetNextCursor(); c != "" {
		out.NextCursor = &c
	}
	writeJSONBody(w, http.StatusOK, out)
}

// writeJSONBody writes v as an uncacheable JSON response.
func writeJSONBody(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set(hContentType, "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h[hCacheControl] = valNoStore
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
