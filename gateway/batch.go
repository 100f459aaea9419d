package gateway

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
)

// Append batches and JSON record coordinates (Ursula extensions).

// Record and batch headers.
const (
	hStreamRecordStart = "Stream-Record-Start"
	hStreamRecordNext  = "Stream-Record-Next"
	hStreamRecordFirst = "Stream-Record-First"
	hStreamRecordMatch = "Stream-Record-Match"
	hPrefer            = "Prefer"
)

// maxBatchFrames bounds the frames of an append batch; its frame payloads
// are bounded by the gateway's max_body_bytes (the framing adds 4 bytes per
// frame).
const maxBatchFrames = 512

// ctRecordsNDJSON is the content type of a read with record_view=envelope.
const ctRecordsNDJSON = "application/vnd.durable-stream-records+ndjson"

var (
	ErrBadRecordMatch  = errors.New("gateway: Stream-Record-Match must be a non-negative integer")
	ErrBadFrame        = errors.New("gateway: malformed batch frame (u32 big-endian length, then the payload)")
	ErrEmptyFrame      = errors.New("gateway: zero-length batch frame")
	ErrEmptyBatch      = errors.New("gateway: an append batch needs at least one frame")
	ErrBadRecordParam  = errors.New("gateway: record must be a non-negative integer or now")
	ErrBadRecordCount  = errors.New("gateway: tail_records and max_records must be positive integers")
	ErrRecordAndOffset = errors.New("gateway: record, tail_records and offset are mutually exclusive")
	ErrMaxRecordsStart = errors.New("gateway: max_records needs record or tail_records")
	ErrMaxRecordsBytes = errors.New("gateway: max_records and max_bytes cannot be combined")
	ErrBadRecordView   = errors.New("gateway: record_view must be envelope")
	ErrRecordPosition  = errors.New("gateway: record must be one non-negative integer")
	ErrRecordAndPath   = errors.New("gateway: an offset in the path and a record query are mutually exclusive")
	ErrMaxRecordsLive  = errors.New("gateway: max_records is not supported with live=sse")
	ErrEnvelopeLive    = errors.New("gateway: record_view=envelope is not supported with live=sse")
)

// parseFrames splits an append-batch body into its frames.
func parseFrames(body []byte) ([][]byte, error) {
	var frames [][]byte
	for len(body) > 0 {
		if len(body) < 4 {
			return nil, ErrBadFrame
		}
		n := binary.BigEndian.Uint32(body)
		body = body[4:]
		if n == 0 {
			return nil, ErrEmptyFrame
		}
		if uint64(n) > uint64(len(body)) {
			return nil, ErrBadFrame
		}
		if len(frames) == maxBatchFrames {
			return nil, errcode.New(errcode.PayloadTooLarge, "an append batch holds at most %d frames", maxBatchFrames)
		}
		frames = append(frames, body[:n:n])
		body = body[n:]
	}
	if len(frames) == 0 {
		return nil, ErrEmptyBatch
	}
	return frames, nil
}

// frameAck is the JSON acknowledgement of one frame.
type frameAck struct {
	Status           uint32  `json:"status"`
	StreamNextOffset *string `json:"stream_next_offset"`
	StreamClosed     bool    `json:"stream_closed"`
	RecordStart      *uint64 `json:"record_start"`
	RecordNext       *uint64 `json:"record_next"`
	ErrorCode        *string `json:"error_code"`
	Error            *string `json:"error"`
}

// appendBatch serves POST /{bucket}/{stream}/append-batch: the body is
// frames of a u32 big-endian length and that many bytes; each frame is
// appended as its own append (same Content-Type, producer headers cover the
// whole batch), all in one replicated write. The answer is 200 with a JSON
// array of per-frame acknowledgements, or 204 with Prefer: return=minimal
// when every frame succeeded.
func (g *Gateway) appendBatch(w http.ResponseWriter, r *http.Request, t target) {
	h := r.Header
	prod, hasProd, err := ParseProducer(h)
	if err != nil {
		badRequest(w, err)
		return
	}
	match, hasMatch, err := parseRecordMatch(h)
	if err != nil {
		badRequest(w, err)
		return
	}
	ct, _ := headerValue(h, hContentType)
	if strings.TrimSpace(ct) == "" {
		badRequest(w, ErrMissingType)
		return
	}
	if err := checkContentType(ct); err != nil {
		badRequest(w, err)
		return
	}
	seq, err := ParseStreamSeq(h)
	if err != nil {
		badRequest(w, err)
		return
	}
	maxBatchBytes := g.cfg.MaxBodyBytes
	body, err := g.readBody(r, maxBatchBytes+4*maxBatchFrames)
	if err != nil {
		var de *errcode.Error
		if errors.As(err, &de) && de.Code == errcode.PayloadTooLarge {
			err = errcode.New(errcode.PayloadTooLarge, "an append batch holds at most %d bytes", maxBatchBytes)
		}
		writeError(w, err)
		return
	}
	defer body.Release()
	frames, err := parseFrames(body.Bytes())
	if err != nil {
		var de *errcode.Error
		if errors.As(err, &de) {
			writeDomainError(w, de)
		} else {
			badRequest(w, err)
		}
		return
	}
	var total int
	for _, f := range frames {
		total += len(f)
	}
	if int64(total) > maxBatchBytes {
		writeDomainError(w, errcode.New(errcode.PayloadTooLarge, "an append batch holds at most %d bytes", maxBatchBytes))
		return
	}
	req := &streamv1.AppendRequest{Ref: t.ref, ContentType: ct, Frames: frames, StreamSeq: seq, Incarnation: t.incarnation}
	if hasMatch {
		req.RecordMatch = &match
	}
	if hasProd {
		req.Producer = &streamv1.Producer{Id: prod.ID, Epoch: prod.Epoch, Seq: prod.Seq}
	}
	resp, err := g.client.Append(r.Context(), req)
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	out := w.Header()
	out.Set(hStreamNextOffset, resp.GetNextOffset())
	if resp.GetClosed() {
		out[hStreamClosed] = valTrue
	}
	setAppendRecords(out, resp, ct)
	if hasProd {
		out.Set(hProducerEpoch, strconv.FormatUint(resp.GetProducerEpoch(), 10))
		out.Set(hProducerSeq, strconv.FormatUint(resp.GetProducerSeq(), 10))
	}
	acks := make([]frameAck, len(resp.GetFrames()))
	allOK := true
	for i, a := range resp.GetFrames() {
		acks[i] = toFrameAck(a, isJSONType(ct))
		if a.GetStatus() >= 300 {
			allOK = false
		}
	}
	if !resp.GetDuplicate() && allOK {
		g.metrics.bytesAppended.Add(uint64(total))
		if t.path != "" && g.cfg.Observer != nil {
			g.cfg.Observer.StreamWritten(r.Context(), t.path)
		}
	}
	if allOK && preferMinimal(h) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	doc, _ := json.Marshal(acks)
	doc = append(doc, '\n')
	out.Set(hContentType, "application/json")
	out.Set("Content-Length", strconv.Itoa(len(doc)))
	out[hCacheControl] = valNoStore
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(doc)
}

func toFrameAck(a *streamv1.FrameAck, records bool) frameAck {
	out := frameAck{Status: a.GetStatus(), StreamClosed: a.GetClosed()}
	if v := a.GetNextOffset(); v != "" {
		out.StreamNextOffset = &v
	}
	if a.GetStatus() < 300 && records {
		s, n := a.GetRecordStart(), a.GetRecordNext()
		out.RecordStart, out.RecordNext = &s, &n
	}
	if v := a.GetErrorCode(); v != "" {
		out.ErrorCode = &v
	}
	if v := a.GetError(); v != "" {
		out.Error = &v
	}
	return out
}

// preferMinimal reports Prefer: return=minimal.
func preferMinimal(h http.Header) bool {
	for _, v := range h.Values(hPrefer) {
		for item := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(item), "return=minimal") {
				return true
			}
		}
	}
	return false
}

// parseRecordMatch parses Stream-Record-Match.
func parseRecordMatch(h http.Header) (uint64, bool, error) {
	v, ok := headerValue(h, hStreamRecordMatch)
	if !ok {
		return 0, false, nil
	}
	n, good := parseCanonicalUint(strings.TrimSpace(v))
	if !good {
		return 0, false, ErrBadRecordMatch
	}
	return n, true, nil
}

// setAppendRecords sets the record headers of an append answer.
func setAppendRecords(h http.Header, resp *streamv1.AppendResponse, ct string) {
	if !isJSONType(ct) {
		return
	}
	h[hStreamRecordStart] = []string{strconv.FormatUint(resp.GetRecordStart(), 10)}
	h[hStreamRecordNext] = []string{strconv.FormatUint(resp.GetRecordNext(), 10)}
}

// setRecordRange sets Stream-Record-First/Next (JSON streams).
func setRecordRange(h http.Header, ct string, first, next uint64) {
	if !isJSONType(ct) {
		return
	}
	h[hStreamRecordFirst] = []string{strconv.FormatUint(first, 10)}
	h[hStreamRecordNext] = []string{strconv.FormatUint(next, 10)}
}

// recordParams are a read's record query parameters.
type recordParams struct {
	record      *uint64
	recordNow   bool
	tailRecords uint64
	maxRecords  uint64
	envelope    bool
}

func (p recordParams) start() bool { return p.record != nil || p.recordNow || p.tailRecords > 0 }

// parseRecordParams parses record, tail_records, max_records and
// record_view; hasOffset says whether the query named an offset.
func parseRecordParams(q url.Values, hasOffset bool) (recordParams, error) {
	var p recordParams
	if v, ok := q["record"]; ok {
		switch {
		case len(v) != 1:
			return p, ErrBadRecordParam
		case v[0] == "now":
			p.recordNow = true
		default:
			n, good := parseCanonicalUint(v[0])
			if !good {
				return p, ErrBadRecordParam
			}
			p.record = &n
		}
	}
	for _, f := range []struct {
		name string
		dst  *uint64
	}{{"tail_records", &p.tailRecords}, {"max_records", &p.maxRecords}} {
		if v, ok := q[f.name]; ok {
			n, good := uint64(0), len(v) == 1
			if good {
				n, good = parseCanonicalUint(v[0])
			}
			if !good || n == 0 {
				return p, ErrBadRecordCount
			}
			*f.dst = n
		}
	}
	if (p.record != nil || p.recordNow) && p.tailRecords > 0 || p.start() && hasOffset {
		return p, ErrRecordAndOffset
	}
	if p.maxRecords > 0 {
		if !p.start() {
			return p, ErrMaxRecordsStart
		}
		if _, ok := q["max_bytes"]; ok {
			return p, ErrMaxRecordsBytes
		}
	}
	if v, ok := q["record_view"]; ok {
		if len(v) != 1 || v[0] != "envelope" {
			return p, ErrBadRecordView
		}
		p.envelope = true
	}
	return p, nil
}

// recordQuery parses the record=N query of a snapshot publish or a
// retention (PUT …/snapshot?record=N, PUT …/retention?record=N): nil
// without one.
func recordQuery(rawQuery string) (*uint64, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, ErrBadQuery
	}
	v, ok := q["record"]
	if !ok {
		return nil, nil
	}
	if len(v) != 1 {
		return nil, ErrRecordPosition
	}
	n, good := parseCanonicalUint(v[0])
	if !good {
		return nil, ErrRecordPosition
	}
	return &n, nil
}

// apply adds the record parameters to a read request.
func (p recordParams) apply(req *streamv1.ReadRequest) *streamv1.ReadRequest {
	req.Record, req.RecordNow, req.TailRecords, req.MaxRecords = p.record, p.recordNow, p.tailRecords, p.maxRecords
	return req
}
