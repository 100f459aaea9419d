package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
)

// Request validation errors of the stream handlers.
var (
	ErrEmptyAppend     = errors.New("gateway: an append needs a body or Stream-Closed: true")
	ErrMissingType     = errors.New("gateway: an append with a body needs Content-Type")
	ErrBadOffsetParam  = errors.New("gateway: offset must appear at most once and not be empty")
	ErrLiveNeedsOffset = errors.New("gateway: live reads need an offset")
	ErrBadQuery        = errors.New("gateway: malformed query string")
	ErrBadStreamID     = errors.New("gateway: stream ids must be valid UTF-8 without control characters or empty, \".\" or \"..\" segments")
	errShuttingDown    = errcode.New(errcode.Unavailable, "gateway shutting down")
)

// statusClientClosed is recorded for requests whose client left before the
// answer (nginx's convention).
const statusClientClosed = 499

// upstreamError writes an error from the node (or the gateway) and logs the
// ones that are not the client's fault.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went away; nobody reads the answer.
		w.WriteHeader(statusClientClosed)
		return
	}
	de := toDomain(err)
	if errcode.HTTPStatus(de.Code) >= 500 {
		g.metrics.upstreamErrors.Add(1)
		g.logger.WarnContext(r.Context(), "stream request failed", "method", r.Method, "path", r.URL.Path, "code", errcode.Reason(de.Code), "err", de.Message)
	}
	writeDomainError(w, de)
}

// ValidateStreamID checks a stream id: not empty, valid UTF-8 (the node
// keeps it in protobuf strings), no control characters, no empty, "." or
// ".." path segments.
func ValidateStreamID(id string) error {
	if id == "" || !utf8.ValidString(id) {
		return ErrBadStreamID
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return ErrBadStreamID
		}
	}
	for seg := range strings.SplitSeq(id, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return ErrBadStreamID
		}
	}
	return nil
}

// absoluteURL returns the absolute URL of the request, honouring
// X-Forwarded-Proto and X-Forwarded-Host.
func absoluteURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if v := firstListItem(r.Header.Get("X-Forwarded-Proto")); v == "http" || v == "https" {
		scheme = v
	}
	host := r.Host
	if v := firstListItem(r.Header.Get("X-Forwarded-Host")); v != "" {
		host = v
	}
	return scheme + "://" + host + r.URL.EscapedPath()
}

func firstListItem(v string) string {
	if i := strings.IndexByte(v, ','); i >= 0 {
		v = v[:i]
	}
	return strings.ToLower(strings.TrimSpace(v))
}

// forkSource resolves a Stream-Forked-From value (a path, or an absolute URL
// on this server) to a stream reference.
func (g *Gateway) forkSource(v string) (*streamv1.StreamRef, error) {
	u, err := url.Parse(strings.TrimSpace(v))
	if err != nil || u.Path == "" {
		return nil, ErrBadForkedFrom
	}
	p := u.Path
	root := g.cfg.StreamRoot
	if rest, ok := strings.CutPrefix(p, root); ok {
		if rest == reservedSegment || strings.HasPrefix(rest, reservedSegment+"/") || ValidateStreamID(rest) != nil {
			return nil, ErrBadForkedFrom
		}
		return &streamv1.StreamRef{Bucket: BuiltinBucket, Stream: rest}, nil
	}
	bucket, stream, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	if !ok || strings.Contains(stream, "/") || ValidateStreamID(stream) != nil || ValidateBucket(bucket) != nil {
		return nil, ErrBadForkedFrom
	}
	return &streamv1.StreamRef{Bucket: bucket, Stream: stream}, nil
}

// createStream serves PUT on a stream.
func (g *Gateway) createStream(w http.ResponseWriter, r *http.Request, t target) {
	hdr, err := ParseCreate(r.Header)
	if err != nil {
		badRequest(w, err)
		return
	}
	req := &streamv1.CreateStreamRequest{
		Ref:         t.ref,
		ContentType: hdr.ContentType,
		ExpiresAt:   hdr.ExpiresAt,
		Closed:      hdr.Closed,
	}
	if hdr.HasTTL {
		ttl := hdr.TTLSeconds
		req.TtlSeconds = &ttl
	}
	if hdr.ForkedFrom != "" {
		src, err := g.forkSource(hdr.ForkedFrom)
		if err != nil {
			badRequest(w, err)
			return
		}
		req.Fork = &streamv1.ForkSpec{Source: src, Offset: hdr.ForkOffset, SubOffset: hdr.ForkSubOffset}
	}
	rb, err := g.readBody(r, g.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rb.Release()
	body := rb.Bytes()
	req.Body, req.HasBody = body, len(body) > 0
	resp, err := g.client.CreateStream(r.Context(), req)
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	info := resp.GetInfo()
	h := w.Header()
	setContentType(h, info.GetContentType())
	h[hStreamNextOffset] = []string{info.GetNextOffset()}
	setIncarnation(h, info.GetIncarnation())
	if info.GetClosed() {
		h[hStreamClosed] = valTrue
	}
	if !resp.GetCreated() {
		w.WriteHeader(http.StatusOK)
		return
	}
	g.metrics.bytesAppended.Add(uint64(len(body)))
	h[hLocation] = []string{absoluteURL(r)}
	w.WriteHeader(http.StatusCreated)
	if t.path != "" && g.cfg.Observer != nil {
		g.cfg.Observer.StreamCreated(r.Context(), t.path)
	}
}

// setContentType sets the stream's content type as stored.
func setContentType(h http.Header, ct string) {
	if ct == "" {
		ct = "application/octet-stream"
	}
	h[hContentType] = []string{ct}
}

// appendStream serves POST on a stream: append, append-and-close, close.
func (g *Gateway) appendStream(w http.ResponseWriter, r *http.Request, t target) {
	h := r.Header
	prod, hasProd, err := ParseProducer(h)
	if err != nil {
		badRequest(w, err)
		return
	}
	closeReq := false
	if v, ok := headerValue(h, hStreamClosed); ok {
		closeReq = ParseClosed(v)
	}
	ct, _ := headerValue(h, hContentType)
	if err := checkContentType(ct); err != nil {
		badRequest(w, err)
		return
	}
	seq, err := ParseStreamSeq(h)
	if err != nil {
		badRequest(w, err)
		return
	}
	rb, err := g.readBody(r, g.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rb.Release()
	body := rb.Bytes()
	if len(body) == 0 && !closeReq {
		badRequest(w, ErrEmptyAppend)
		return
	}
	if len(body) > 0 && strings.TrimSpace(ct) == "" {
		badRequest(w, ErrMissingType)
		return
	}
	// The request's messages in one allocation instead of two.
	x := &struct {
		req      streamv1.AppendRequest
		producer streamv1.Producer
	}{}
	req := &x.req
	req.Ref, req.ContentType, req.Body, req.Close, req.StreamSeq, req.Incarnation = t.ref, ct, body, closeReq, seq, t.incarnation
	if match, hasMatch, err := parseRecordMatch(h); err != nil {
		badRequest(w, err)
		return
	} else if hasMatch {
		req.RecordMatch = &match
	}
	if hasProd {
		x.producer.Id, x.producer.Epoch, x.producer.Seq = prod.ID, prod.Epoch, prod.Seq
		req.Producer = &x.producer
	}
	resp, err := g.client.Append(r.Context(), req)
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	out := w.Header()
	// One allocation for the header values (each gets a full slice, so an
	// append to one cannot overwrite the next).
	n := 2
	if hasProd {
		n = 4
	}
	vals := make([]string, n)
	vals[0] = resp.GetNextOffset()
	out[hStreamNextOffset] = vals[0:1:1]
	if resp.GetClosed() {
		out[hStreamClosed] = valTrue
	}
	if inc := resp.GetIncarnation(); inc != 0 { // as setIncarnation does
		vals[1] = strconv.FormatUint(inc, 10)
		out[hStreamIncarnation] = vals[1:2:2]
	}
	if len(body) > 0 {
		setAppendRecords(out, resp, ct)
	}
	status := http.StatusNoContent
	if hasProd {
		vals[2] = echoUint(h, hProducerEpoch, prod.Epoch, resp.GetProducerEpoch())
		vals[3] = echoUint(h, hProducerSeq, prod.Seq, resp.GetProducerSeq())
		out[hProducerEpoch] = vals[2:3:3]
		out[hProducerSeq] = vals[3:4:4]
		if len(body) > 0 && !resp.GetDuplicate() {
			status = http.StatusOK
		}
	}
	w.WriteHeader(status)
	if !resp.GetDuplicate() {
		g.metrics.bytesAppended.Add(uint64(len(body)))
		if t.path != "" && g.cfg.Observer != nil {
			g.cfg.Observer.StreamWritten(r.Context(), t.path)
		}
	}
}

// echoUint returns v in decimal, reusing the request's spelling of header
// key when it says the same (the usual answer echoes the request).
func echoUint(h http.Header, key string, parsed, v uint64) string {
	if raw, _ := headerValue(h, key); parsed == v && raw != "" && (raw == "0" || raw[0] != '0') {
		return raw
	}
	return strconv.FormatUint(v, 10)
}

// headStream serves HEAD on a stream.
func (g *Gateway) headStream(w http.ResponseWriter, r *http.Request, t target) {
	resp, err := g.client.Head(r.Context(), &streamv1.HeadRequest{Ref: t.ref, Incarnation: t.incarnation})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	info := resp.GetInfo()
	h := w.Header()
	setContentType(h, info.GetContentType())
	h[hStreamNextOffset] = []string{info.GetNextOffset()}
	h[hCacheControl] = valNoStore
	setIncarnation(h, info.GetIncarnation())
	setPreviousIncarnation(h, info.GetPreviousIncarnation(), info.GetInheritedOffset())
	setRecordRange(h, info.GetContentType(), info.GetRecordFirst(), info.GetRecordNext())
	if id := info.GetClusterId(); id != "" {
		h[hClusterID] = []string{id}
	}
	if info.TtlSeconds != nil {
		h[hStreamTTL] = []string{strconv.FormatUint(info.GetTtlSeconds(), 10)}
	}
	if v := info.GetExpiresAt(); v != "" {
		h[hStreamExpiresAt] = []string{v}
	}
	setSnapshotInfo(h, info)
	if info.GetClosed() {
		h[hStreamClosed] = valTrue
	}
	w.WriteHeader(http.StatusOK)
}

// deleteStream serves DELETE on a stream.
func (g *Gateway) deleteStream(w http.ResponseWriter, r *http.Request, t target) {
	if _, err := g.client.DeleteStream(r.Context(), &streamv1.DeleteStreamRequest{Ref: t.ref}); err != nil {
		g.upstreamError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	if t.path != "" && g.cfg.Observer != nil {
		g.cfg.Observer.StreamDeleted(r.Context(), t.path)
	}
}

// readParams are the parsed query parameters of a GET.
type readParams struct {
	offset string
	live   string
	cursor string
	rec    recordParams
}

// parseReadParams parses offset, live and cursor from a raw query.
func parseReadParams(rawQuery string) (readParams, error) {
	p := readParams{offset: "-1"}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return readParams{}, ErrBadQuery
	}
	offs, hasOffset := q["offset"]
	if hasOffset {
		if len(offs) != 1 || offs[0] == "" {
			return readParams{}, ErrBadOffsetParam
		}
		o, err := ParseOffset(offs[0])
		if err != nil {
			return readParams{}, err
		}
		p.offset = o
	}
	if v := q["live"]; len(v) > 0 {
		p.live = v[0]
	}
	if p.rec, err = parseRecordParams(q, hasOffset); err != nil {
		return readParams{}, err
	}
	switch {
	case p.live == "sse" && p.rec.maxRecords > 0:
		return readParams{}, ErrMaxRecordsLive
	case p.live == "sse" && p.rec.envelope:
		return readParams{}, ErrEnvelopeLive
	}
	if (p.live == "long-poll" || p.live == "sse") && !hasOffset && !p.rec.start() {
		return readParams{}, ErrLiveNeedsOffset
	}
	if v := q["cursor"]; len(v) > 0 {
		p.cursor = v[0]
	}
	return p, nil
}

// readStream serves GET on a stream.
func (g *Gateway) readStream(w http.ResponseWriter, r *http.Request, t target) {
	p, err := parseReadParams(r.URL.RawQuery)
	if err != nil {
		badRequest(w, err)
		return
	}
	switch p.live {
	case "long-poll":
		g.longPoll(w, r, t, p)
	case "sse":
		g.serveSSE(w, r, t, p)
	default:
		g.catchUp(w, r, t, p)
	}
}

// maxBytes is the per-read data bound sent to the node.
func (g *Gateway) maxBytes() uint64 { return uint64(g.cfg.ReadChunkBytes) }

// catchUp serves a plain GET.
func (g *Gateway) catchUp(w http.ResponseWriter, r *http.Request, t target, p readParams) {
	resp, err := g.client.Read(r.Context(), p.rec.apply(&streamv1.ReadRequest{Ref: t.ref, Offset: p.offset, MaxBytes: g.maxBytes(), Incarnation: t.incarnation}))
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	h := w.Header()
	if p.offset == "now" || p.rec.recordNow || p.rec.tailRecords > 0 {
		h[hCacheControl] = valNoStore
	} else {
		h[hCacheControl] = valCacheable
	}
	g.writeReadResponse(w, r, resp, "")
}

// writeReadResponse writes a 200 (or 304) with the data of a read. cursor
// is set on live reads.
func (g *Gateway) writeReadResponse(w http.ResponseWriter, r *http.Request, resp *streamv1.ReadResponse, cursor string) {
	h := w.Header()
	ct := resp.GetContentType()
	setContentType(h, ct)
	h[hStreamNextOffset] = []string{resp.GetNextOffset()}
	setIncarnation(h, resp.GetIncarnation())
	if resp.GetUpToDate() {
		h[hStreamUpToDate] = valTrue
	}
	if resp.GetClosed() {
		h[hStreamClosed] = valTrue
	}
	if cursor != "" {
		h[hStreamCursor] = []string{cursor}
	}
	setRecordRange(h, ct, resp.GetRecordFirst(), resp.GetRecordNext())
	envelope := isJSONType(ct) && strings.Contains(r.URL.RawQuery, "record_view=envelope")
	tag := etag(resp.GetIncarnation(), resp.GetStartOffset(), resp.GetNextOffset(), resp.GetClosed())
	if envelope {
		tag = tag[:len(tag)-1] + `:e"`
	}
	h[hETag] = []string{tag}
	if inm, ok := headerValue(r.Header, hIfNoneMatch); ok && etagMatches(inm, tag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	// The body goes out in pieces, never rendered whole: a reader that
	// stops reading holds the read's data (usually the stored bytes
	// themselves) and a small buffer until the write deadline frees it.
	data := resp.GetData()
	var render func(emit func([]byte))
	switch {
	case envelope:
		h[hContentType] = []string{ctRecordsNDJSON}
		first := resp.GetRecordFirst()
		render = func(emit func([]byte)) { renderEnvelope(data, first, emit) }
	case isJSONType(ct):
		render = func(emit func([]byte)) { renderJSONArray(data, emit) }
	}
	size := len(data)
	if render != nil {
		size = renderedSize(render)
	}
	h["Content-Length"] = []string{strconv.Itoa(size)}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	var n int
	if render == nil {
		n, _ = w.Write(data)
	} else {
		n, _ = writeRendered(w, render)
	}
	g.metrics.bytesServed.Add(uint64(n))
}

// liveContext returns a context that ends with the request, with the
// gateway's shutdown, or after timeout (when > 0).
func (g *Gateway) liveContext(r *http.Request, timeout time.Duration) (context.Context, context.CancelFunc) {
	var ctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), timeout)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	stop := context.AfterFunc(g.stopCtx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// longPoll serves GET ?live=long-poll.
func (g *Gateway) longPoll(w http.ResponseWriter, r *http.Request, t target, p readParams) {
	g.metrics.longPolls.Add(1)
	defer g.metrics.longPolls.Add(-1)
	ctx, cancel := g.liveContext(r, 0)
	defer cancel()
	wait := g.cfg.LongPollTimeout
	resp, err := g.client.Read(ctx, p.rec.apply(&streamv1.ReadRequest{
		Ref: t.ref, Offset: p.offset, MaxBytes: g.maxBytes(), WaitMs: uint64(wait / time.Millisecond), Incarnation: t.incarnation,
	}))
	if err != nil {
		if g.stopCtx.Err() != nil {
			writeDomainError(w, errShuttingDown)
			return
		}
		g.upstreamError(w, r, err)
		return
	}
	cursor := strconv.FormatUint(nextCursor(time.Now(), p.cursor), 10)
	if len(resp.GetData()) == 0 {
		h := w.Header()
		h[hStreamNextOffset] = []string{resp.GetNextOffset()}
		h[hStreamUpToDate] = valTrue
		h[hCacheControl] = valNoStore
		setIncarnation(h, resp.GetIncarnation())
		setRecordRange(h, resp.GetContentType(), resp.GetRecordFirst(), resp.GetRecordNext())
		if resp.GetClosed() {
			h[hStreamClosed] = valTrue
		} else {
			h[hStreamCursor] = []string{cursor}
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header()[hCacheControl] = valCacheable
	g.writeReadResponse(w, r, resp, cursor)
}

// setRetention serves PUT /{bucket}/{stream}/retention/{offset} and
// PUT /{bucket}/{stream}/retention?record=N (JSON streams): reads below
// the offset (the record's start) answer 410 from then on. The node
// refuses a retention beyond the visible snapshot (409) and answers one
// at or below the current retention without change. The answer carries
// the stream's retention (which only moves forward) as
// Stream-Retained-Offset and, for JSON streams, its first retained record
// as Stream-Record-First.
func (g *Gateway) setRetention(w http.ResponseWriter, r *http.Request, t target, offset string) {
	record, ok := recordOrPath(w, r, offset)
	if !ok {
		return
	}
	resp, err := g.client.SetRetention(r.Context(), &streamv1.SetRetentionRequest{Ref: t.ref, Offset: offset, Record: record})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	h := w.Header()
	h.Set(hRetainedOffset, resp.GetRetainedOffset())
	if resp.GetJson() {
		h[hStreamRecordFirst] = []string{strconv.FormatUint(resp.GetRecordFirst(), 10)}
	}
	w.WriteHeader(http.StatusNoContent)
}
