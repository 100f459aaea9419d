package gateway

import (
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/httpserver"
)

// Snapshot and bootstrap headers.
const (
	hSnapshotOffset = "Stream-Snapshot-Offset"
	hSnapshotDigest = "Stream-Snapshot-Digest"
	hSnapshotMatch  = "Stream-Snapshot-Match"
)

// ErrBootstrapLive refuses a live bootstrap.
var ErrBootstrapLive = errors.New("gateway: bootstrap is not a live read; read on from Stream-Next-Offset")

// newBoundary returns the multipart boundary of a bootstrap response
// (tests make it deterministic).
var newBoundary = func() string { return multipart.NewWriter(io.Discard).Boundary() }

// serveSnapshot serves /{bucket}/{stream}/snapshot (arg empty) and
// /{bucket}/{stream}/snapshot/{offset}.
func (g *Gateway) serveSnapshot(w http.ResponseWriter, r *http.Request, t target, arg string) {
	if arg == "" {
		switch {
		case r.Method == http.MethodPut && strings.Contains(r.URL.RawQuery, "record="):
			g.putSnapshot(w, r, t, "") // …/snapshot?record=N
		case r.Method != http.MethodGet:
			methodNotAllowed(w, "GET, OPTIONS")
		default:
			g.latestSnapshot(w, r, t)
		}
		return
	}
	if _, err := ParseOffset(arg); err != nil || arg == "-1" || arg == "now" {
		badRequest(w, ErrBadOffset)
		return
	}
	switch r.Method {
	case http.MethodPut:
		g.putSnapshot(w, r, t, arg)
	case http.MethodGet:
		g.getSnapshot(w, r, t, arg)
	case http.MethodDelete:
		g.deleteSnapshot(w, r, t, arg)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE, OPTIONS")
	}
}

// recordOrPath reads the ?record=N that may stand for an offset in the
// path (empty then); it answers 400 and reports false for a malformed
// record or both.
func recordOrPath(w http.ResponseWriter, r *http.Request, offset string) (*uint64, bool) {
	record, err := recordQuery(r.URL.RawQuery)
	switch {
	case err != nil:
		badRequest(w, err)
		return nil, false
	case record != nil && offset != "":
		badRequest(w, ErrRecordAndPath)
		return nil, false
	}
	return record, true
}

// putSnapshot serves PUT …/snapshot/{offset} and, for JSON streams,
// PUT …/snapshot?record=N (offset empty): 204 with the snapshot's offset
// and digest (also for the same snapshot again).
func (g *Gateway) putSnapshot(w http.ResponseWriter, r *http.Request, t target, offset string) {
	record, ok := recordOrPath(w, r, offset)
	if !ok {
		return
	}
	ct, _ := headerValue(r.Header, hContentType)
	if err := checkContentType(ct); err != nil {
		badRequest(w, err)
		return
	}
	body, err := g.readBody(r, g.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	defer body.Release()
	match, _ := headerValue(r.Header, hSnapshotMatch)
	resp, err := g.client.PutSnapshot(r.Context(), &streamv1.PutSnapshotRequest{
		Ref: t.ref, Offset: offset, Record: record, ContentType: ct, Body: body.Bytes(), Match: strings.TrimSpace(match),
	})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	publishedSnapshot(w, resp.GetOffset(), resp.GetDigest())
}

// readBody reads the request body, at most limit bytes, charged against
// the process's in-flight request-body budget as it arrives; the caller
// releases it once the node answered. The errors are domain errors: 413
// above the limit, 503 OVERLOADED (Retry-After) when the budget cannot
// hold it, 408 when it stalls, 400 on other read errors.
func (g *Gateway) readBody(r *http.Request, limit int64) (*httpserver.Body, error) {
	b, err := httpserver.ReadBody(r, limit, g.budget)
	if err == nil {
		return b, nil
	}
	var tooLarge *httpserver.BodyTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return nil, errcode.New(errcode.PayloadTooLarge, "%s", tooLarge.Error())
	case errors.Is(err, httpserver.ErrBudgetExhausted):
		return nil, errcode.New(errcode.Overloaded, "the gateway holds its budget of in-flight request bodies; retry").
			With(errcode.KeyRetryAfterMS, strconv.Itoa(bodyBudgetRetryMS))
	case errors.Is(err, httpserver.ErrBodyStalled):
		return nil, errcode.New(errcode.RequestTimeout, "the request body made no progress for %v", g.cfg.HTTP.BodyReadTimeout)
	}
	return nil, errcode.New(errcode.InvalidArgument, "read request body: %v", err)
}

// bodyBudgetRetryMS is the Retry-After of a request refused for want of
// body budget.
const bodyBudgetRetryMS = 1000

// latestSnapshot serves GET …/snapshot: 307 to the latest snapshot's URL,
// 404 when the stream has none.
func (g *Gateway) latestSnapshot(w http.ResponseWriter, r *http.Request, t target) {
	resp, err := g.client.Head(r.Context(), &streamv1.HeadRequest{Ref: t.ref})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	off := resp.GetInfo().GetSnapshotOffset()
	if off == "" {
		writeDomainError(w, errcode.New(errcode.SnapshotNotFound, "stream %s has no snapshot", t.ref.GetStream()))
		return
	}
	h := w.Header()
	h[hLocation] = []string{snapshotPath(t) + "/" + off}
	h[hCacheControl] = valNoStore
	w.WriteHeader(http.StatusTemporaryRedirect)
}

// snapshotPath is the path of a stream's snapshot resource.
func snapshotPath(t target) string {
	return "/" + url.PathEscape(t.ref.GetBucket()) + "/" + url.PathEscape(t.ref.GetStream()) + "/snapshot"
}

// getSnapshot serves GET …/snapshot/{offset}: the snapshot's bytes with
// the stream's state as its leader sees it. A snapshot committed from
// staged parts is read and written a part at a time; a failure after the
// headers went out cuts the body short of its Content-Length.
func (g *Gateway) getSnapshot(w http.ResponseWriter, r *http.Request, t target, offset string) {
	resp, err := g.client.GetSnapshot(r.Context(), &streamv1.GetSnapshotRequest{Ref: t.ref, Offset: offset})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	h := w.Header()
	setContentType(h, resp.GetContentType())
	setSnapshotState(h, resp)
	h[hCacheControl] = valNoStore
	size := uint64(len(resp.GetBody()))
	if resp.GetParts() > 1 {
		size = resp.GetSize()
	}
	h["Content-Length"] = []string{strconv.FormatUint(size, 10)}
	w.WriteHeader(http.StatusOK)
	n, _ := w.Write(resp.GetBody())
	g.metrics.bytesServed.Add(uint64(n))
	for p := uint32(2); p <= resp.GetParts(); p++ {
		body, err := g.nextSnapshotPart(r, t, resp, p)
		if err != nil {
			g.logger.WarnContext(r.Context(), "snapshot part read failed", "path", r.URL.Path, "part", p, "err", err)
			panic(http.ErrAbortHandler)
		}
		n, err := w.Write(body)
		g.metrics.bytesServed.Add(uint64(n))
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

// setSnapshotState sets the snapshot and stream-state headers of a
// snapshot read.
func setSnapshotState(h http.Header, resp *streamv1.GetSnapshotResponse) {
	h[hSnapshotOffset] = []string{resp.GetOffset()}
	h[hSnapshotDigest] = []string{resp.GetDigest()}
	h[hStreamNextOffset] = []string{resp.GetNextOffset()}
	if resp.GetUpToDate() {
		h[hStreamUpToDate] = valTrue
	}
	if resp.GetClosed() {
		h[hStreamClosed] = valTrue
	}
}

// setSnapshotInfo adds the latest snapshot's offset and digest to a HEAD
// answer.
func setSnapshotInfo(h http.Header, info *streamv1.StreamInfo) {
	if off := info.GetSnapshotOffset(); off != "" {
		h[hSnapshotOffset] = []string{off}
		h[hSnapshotDigest] = []string{info.GetSnapshotDigest()}
	}
}

// deleteSnapshot serves DELETE …/snapshot/{offset}. Snapshots are only
// replaced, never deleted: the latest answers 409, any other offset 404.
func (g *Gateway) deleteSnapshot(w http.ResponseWriter, r *http.Request, t target, offset string) {
	resp, err := g.client.Head(r.Context(), &streamv1.HeadRequest{Ref: t.ref})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	if off := resp.GetInfo().GetSnapshotOffset(); off != "" && off == offset {
		writeDomainError(w, errcode.New(errcode.SnapshotConflict, "the latest snapshot cannot be deleted; publish a newer one to replace it"))
		return
	}
	writeDomainError(w, errcode.New(errcode.SnapshotNotFound, "stream %s has no snapshot at %s", t.ref.GetStream(), offset))
}

// bootstrap serves GET …/bootstrap: a multipart/mixed body whose first
// part is the latest snapshot (an empty application/octet-stream part
// without one), followed by the stream's retained updates after it, one
// part per read chunk in the stream's content type (JSON streams: each
// part a JSON array, as a catch-up read renders it). The updates end at
// the tail as of the start (Stream-Next-Offset), so the headers hold for
// the whole body; the parts are streamed read by read.
func (g *Gateway) bootstrap(w http.ResponseWriter, r *http.Request, t target) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET, OPTIONS")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		badRequest(w, ErrBadQuery)
		return
	}
	if _, live := q["live"]; live {
		badRequest(w, ErrBootstrapLive)
		return
	}
	ctx := r.Context()
	snap, err := g.client.GetSnapshot(ctx, &streamv1.GetSnapshotRequest{Ref: t.ref})
	from, snapOffset := "-1", "-1"
	var next string
	var closed bool
	switch {
	case err == nil:
		from, snapOffset, next, closed = snap.GetOffset(), snap.GetOffset(), snap.GetNextOffset(), snap.GetClosed()
	case toDomain(err).Code == errcode.SnapshotNotFound:
		snap = nil
		head, herr := g.client.Head(ctx, &streamv1.HeadRequest{Ref: t.ref})
		if herr != nil {
			g.upstreamError(w, r, herr)
			return
		}
		next, closed = head.GetInfo().GetNextOffset(), head.GetInfo().GetClosed()
	default:
		g.upstreamError(w, r, err)
		return
	}
	// The first read happens before the headers, so that an error (a
	// snapshot below the retention: 410) is still an error response.
	var first *streamv1.ReadResponse
	if from != next {
		if first, err = g.client.Read(ctx, &streamv1.ReadRequest{Ref: t.ref, Offset: from, MaxBytes: g.maxBytes()}); err != nil {
			g.upstreamError(w, r, err)
			return
		}
	}
	mw := multipart.NewWriter(w)
	if err := mw.SetBoundary(newBoundary()); err != nil {
		writeError(w, err)
		return
	}
	h := w.Header()
	h[hContentType] = []string{"multipart/mixed; boundary=" + mw.Boundary()}
	h[hSnapshotOffset] = []string{snapOffset}
	h[hStreamNextOffset] = []string{next}
	h[hStreamUpToDate] = valTrue
	if closed {
		h[hStreamClosed] = valTrue
	}
	h[hCacheControl] = valNoStore
	w.WriteHeader(http.StatusOK)
	part := func(ct string, body []byte) io.Writer {
		p, err := mw.CreatePart(textproto.MIMEHeader{hContentType: {ct}})
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if _, err := p.Write(body); err != nil {
			panic(http.ErrAbortHandler)
		}
		g.metrics.bytesServed.Add(uint64(len(body)))
		return p
	}
	if snap != nil {
		p := part(orDefault(snap.GetContentType()), snap.GetBody())
		// A snapshot committed from staged parts goes out a part at a time.
		for n := uint32(2); n <= snap.GetParts(); n++ {
			body, err := g.nextSnapshotPart(r, t, snap, n)
			if err != nil {
				g.logger.WarnContext(ctx, "bootstrap snapshot part read failed", "path", r.URL.Path, "part", n, "err", err)
				panic(http.ErrAbortHandler)
			}
			if _, err := p.Write(body); err != nil {
				panic(http.ErrAbortHandler)
			}
			g.metrics.bytesServed.Add(uint64(len(body)))
		}
	} else {
		part("application/octet-stream", nil)
	}
	target := offsetPos(next)
	resp := first
	for resp != nil {
		data := resp.GetData()
		end := offsetPos(resp.GetNextOffset())
		if end > target {
			// The stream grew since the start: stop at the tail the
			// headers announced (an append boundary).
			data = data[:uint64(len(data))-min(end-target, uint64(len(data)))]
			end = target
		}
		if len(data) > 0 {
			ct := orDefault(resp.GetContentType())
			if isJSONType(ct) {
				// Rendered in pieces, never copied whole.
				p := part(ct, nil)
				n, err := writeRendered(p, func(emit func([]byte)) { renderJSONArray(data, emit) })
				g.metrics.bytesServed.Add(uint64(n))
				if err != nil {
					panic(http.ErrAbortHandler)
				}
			} else {
				part(ct, data)
			}
		}
		if end >= target {
			break
		}
		if len(resp.GetData()) == 0 {
			err = errcode.New(errcode.Internal, "read at %s returned nothing before %s", resp.GetNextOffset(), next)
		} else {
			resp, err = g.client.Read(ctx, &streamv1.ReadRequest{Ref: t.ref, Offset: resp.GetNextOffset(), MaxBytes: g.maxBytes()})
		}
		if err != nil {
			// The headers are sent: cut the body short, without the
			// closing boundary, so the client sees it is incomplete.
			g.logger.WarnContext(ctx, "bootstrap read failed", "path", r.URL.Path, "err", err)
			panic(http.ErrAbortHandler)
		}
	}
	if err := mw.Close(); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// offsetPos is the byte position of a server-issued offset token (0 for
// anything else).
func offsetPos(off string) uint64 {
	_, pos, ok := strings.Cut(off, "_")
	if !ok {
		return 0
	}
	var n uint64
	for i := 0; i < len(pos); i++ {
		n = n*10 + uint64(pos[i]-'0')
	}
	return n
}

func orDefault(ct string) string {
	if ct == "" {
		return "application/octet-stream"
	}
	return ct
}

// publishedSnapshot answers a successful publish or commit: 204 with the
// snapshot's offset and digest.
func publishedSnapshot(w http.ResponseWriter, offset, digest string) {
	h := w.Header()
	h[hSnapshotOffset] = []string{offset}
	h[hSnapshotDigest] = []string{digest}
	w.WriteHeader(http.StatusNoContent)
}
