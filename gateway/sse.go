package gateway

import (
	"net/http"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// serveSSE serves GET ?live=sse: catch-up from the offset, then live chunks,
// as Server-Sent Events. The connection ends after SSEReconnectInterval, on
// shutdown, when the client goes away, or after the stream's closing control
// event.
func (g *Gateway) serveSSE(w http.ResponseWriter, r *http.Request, t target, p readParams) {
	ctx, cancel := g.liveContext(r, g.cfg.SSEReconnectInterval)
	defer cancel()
	stream, err := g.client.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: t.ref, Offset: p.offset, MaxBytes: g.maxBytes()})
	if err != nil {
		g.liveError(w, r, err)
		return
	}
	// The first chunk comes at once (even for an empty stream); wait for it
	// so that errors become HTTP errors and the encoding header is known.
	first, err := stream.Recv()
	if err != nil {
		g.liveError(w, r, err)
		return
	}
	chunk := first.GetChunk()
	mode := sseModeFor(chunk.GetContentType())

	h := w.Header()
	h[hContentType] = []string{"text/event-stream"}
	h[hCacheControl] = []string{"no-cache"}
	h["X-Accel-Buffering"] = []string{"no"}
	if mode == sseBase64 {
		h[hStreamSSEEncoding] = []string{"base64"}
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	g.metrics.sseClients.Add(1)
	defer g.metrics.sseClients.Add(-1)

	s := sseWriter{mode: mode, cursor: nextCursor(time.Now(), p.cursor)}
	for {
		if chunk != nil {
			out, done := s.appendChunk(chunk, time.Now())
			if len(out) > 0 {
				if _, err := w.Write(out); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
				g.metrics.bytesServed.Add(uint64(len(out)))
				g.metrics.sseEvents.Add(s.events)
				s.events = 0
			}
			if done {
				return
			}
		}
		msg, err := stream.Recv()
		if err != nil {
			// The node ended the subscription, the reconnect interval
			// passed, the client left or the gateway is stopping: end the
			// response; clients reconnect from their last offset.
			return
		}
		chunk = msg.GetChunk()
	}
}

// liveError writes the error of a live read that has not started yet.
func (g *Gateway) liveError(w http.ResponseWriter, r *http.Request, err error) {
	if g.stopCtx.Err() != nil {
		writeDomainError(w, errShuttingDown)
		return
	}
	g.upstreamError(w, r, err)
}

// sseWriter turns subscription chunks into SSE events. It remembers the
// last control event so that an empty "caught up" chunk right after a data
// chunk that already reported the same position adds nothing.
type sseWriter struct {
	mode         sseMode
	cursor       uint64 // minimum cursor for this connection
	payload      []byte
	out          []byte
	sentControl  bool
	lastOffset   string
	lastUpToDate bool
	lastClosed   bool
	events       uint64
}

// appendChunk returns the bytes to write for chunk (valid until the next
// call) and whether the response must end after them.
func (s *sseWriter) appendChunk(chunk *streamv1.ReadResponse, now time.Time) ([]byte, bool) {
	s.out = s.out[:0]
	data := chunk.GetData()
	next := chunk.GetNextOffset()
	closed := chunk.GetClosed()
	upToDate := chunk.GetUpToDate()
	if len(data) > 0 {
		s.payload = ssePayload(s.payload[:0], data, s.mode)
		s.out = appendSSEData(s.out, s.payload)
		s.events++
	} else {
		if !upToDate && !closed {
			return nil, false
		}
		if s.sentControl && s.lastOffset == next && s.lastClosed == closed && (s.lastUpToDate || !upToDate) {
			return nil, closed
		}
	}
	cur := currentCursor(now)
	if cur < s.cursor {
		cur = s.cursor
	}
	s.out = appendSSEControl(s.out, controlEvent{NextOffset: next, Cursor: cur, UpToDate: upToDate || closed, Closed: closed})
	s.events++
	s.sentControl, s.lastOffset, s.lastUpToDate, s.lastClosed = true, next, upToDate || closed, closed
	return s.out, closed
}
