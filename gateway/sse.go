package gateway

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// serveSSE serves GET ?live=sse: catch-up from the offset, then live chunks,
// as Server-Sent Events. The connection ends after SSEReconnectInterval, on
// shutdown, when the client goes away, or after the stream's closing control
// event.
//
// A client reads history itself (Read) until it is up to date, then follows
// the stream's hub: the gateway's one upstream subscription per stream,
// whose events are encoded once and written as is to every client. A client
// that falls behind the hub's retained events reads again itself and
// rejoins, so a slow client never holds up the others and never loses
// events.
func (g *Gateway) serveSSE(w http.ResponseWriter, r *http.Request, t target, p readParams) {
	ctx, cancel := g.liveContext(r, g.cfg.SSEReconnectInterval)
	defer cancel()
	// The first read answers at once (even for an empty stream), so that
	// errors become HTTP errors and the encoding header is known.
	// Record parameters (record=N|now, tail_records) choose where it
	// starts, as for plain reads; from then on the connection goes by
	// offset.
	resp, err := g.client.Read(ctx, p.rec.apply(&streamv1.ReadRequest{Ref: t.ref, Offset: p.offset, MaxBytes: g.maxBytes(), Incarnation: t.incarnation}))
	if err != nil {
		g.liveError(w, r, err)
		return
	}
	mode := sseModeFor(resp.GetContentType())

	h := w.Header()
	h[hContentType] = []string{"text/event-stream"}
	h[hCacheControl] = []string{"no-cache"}
	h["X-Accel-Buffering"] = []string{"no"}
	if mode == sseBase64 {
		h[hStreamSSEEncoding] = []string{"base64"}
	}
	w.WriteHeader(http.StatusOK)
	c := &sseConn{
		g: g, w: w, rc: http.NewResponseController(w), t: t, inc: resp.GetIncarnation(),
		s:    sseWriter{mode: mode, cursor: nextCursor(time.Now(), p.cursor)},
		wake: make(chan struct{}, 1),
	}
	if conn, ok := r.Context().Value(connContextKey{}).(net.Conn); ok {
		c.sq = newSocketQueue(conn)
	}
	if err := c.rc.Flush(); err != nil {
		return
	}
	g.metrics.sseClients.Add(1)
	defer g.metrics.sseClients.Add(-1)

	for {
		// Catch up with our own reads.
		for {
			if c.writeChunk(resp) {
				return
			}
			if resp.GetUpToDate() {
				break
			}
			if resp, err = c.read(ctx); err != nil {
				return
			}
		}
		if c.followHub(ctx) {
			return
		}
		if resp, err = c.read(ctx); err != nil {
			return
		}
	}
}

// sseConn is one SSE response. Its own goroutine writes it, except while
// it is direct: then its hub writer does (under dmu), until the writer
// hands it back through wake.
type sseConn struct {
	g      *Gateway
	w      http.ResponseWriter
	rc     *http.ResponseController
	t      target
	inc    uint64
	s      sseWriter
	pos    uint64 // byte position delivered up to
	offset string // pos as the server spelled it
	batch  []*sseEvent
	me     hubClient    // place in the current hub
	sq     *socketQueue // nil: never direct

	dmu      sync.Mutex
	direct   bool
	writer   *hubWriter    // set and cleared by the connection's own goroutine
	wake     chan struct{} // buffered 1: handed back
	ended    bool          // the response must end (written under dmu)
	deadline time.Time     // the write deadline set by hub writers
	queued   int           // bound of the bytes the connection has not had acknowledged
}

// read reads from the connection's position.
func (c *sseConn) read(ctx context.Context) (*streamv1.ReadResponse, error) {
	return c.g.client.Read(ctx, &streamv1.ReadRequest{Ref: c.t.ref, Offset: c.offset, MaxBytes: c.g.maxBytes()})
}

// writeChunk writes the events of one of our own reads and flushes. It
// reports whether the response must end.
func (c *sseConn) writeChunk(resp *streamv1.ReadResponse) bool {
	if resp.GetIncarnation() != c.inc {
		return true // the stream was replaced: the client starts over
	}
	next := resp.GetNextOffset()
	pos, ok := offsetPosition(next)
	if !ok {
		return true
	}
	out, done := c.s.appendChunk(resp, time.Now())
	c.pos, c.offset = pos, next
	if len(out) > 0 {
		if !c.write(out, c.s.events) || c.flush() != nil {
			return true
		}
		c.s.events = 0
		c.s.trim()
	}
	return done
}

// write writes b (holding n SSE events) to the response.
func (c *sseConn) write(b []byte, n uint64) bool {
	if _, err := c.w.Write(b); err != nil {
		return false
	}
	c.g.metrics.bytesServed.Add(uint64(len(b)))
	c.g.metrics.sseEvents.Add(n)
	return true
}

func (c *sseConn) flush() error { return c.rc.Flush() }

// followHub writes the hub's events from the connection's position on. It
// reports whether the response must end; false means the connection fell
// behind what the hub retains and must catch up with its own reads.
func (c *sseConn) followHub(ctx context.Context) bool {
	h := c.g.acquireHub(ctx, c.t, c.inc, c.s.mode, c.offset, c.pos)
	defer c.g.releaseHub(h)
	me := &c.me
	if !h.join(me, c.pos) {
		return false
	}
	defer h.leave(me)
	for {
		batch, changed, lagging, done := h.take(me, c.batch[:0])
		c.batch = batch
		if lagging {
			return false
		}
		if len(batch) == 0 {
			if done {
				return true
			}
			if h.goDirect(c.g, c) {
				select {
				case <-c.wake:
				case <-h.ended:
				case <-ctx.Done():
				}
				h.leaveDirect(c)
				select {
				case <-c.wake:
				default:
				}
				if !c.deadline.IsZero() {
					c.deadline = time.Time{}
					if c.rc.SetWriteDeadline(c.deadline) != nil {
						return true
					}
				}
				if c.ended || ctx.Err() != nil {
					return true
				}
				continue
			}
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return true
			}
		}
		end := false
		for i, ev := range batch {
			batch[i] = nil
			if !end {
				end = c.writeEvent(ev)
			}
		}
		if c.flush() != nil || end {
			return true
		}
	}
}

// writeDirect is a hub writer's turn at c: it writes the events of evs
// (whose first has sequence number first) that c has not had, as long as
// that cannot block, and hands c back to its own goroutine when it cannot
// go on.
func (c *sseConn) writeDirect(first uint64, evs []*sseEvent, now time.Time) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.direct {
		return
	}
	seq := c.me.seq.Load()
	if seq < first {
		c.handBack() // its own goroutine finds it lags
		return
	}
	i := int(seq - first)
	if i >= len(evs) {
		return
	}
	// queued bounds what the connection has not had acknowledged: the last
	// reading plus what was written since. Reading it (a system call) is
	// needed only when the bound leaves too little room.
	queued := c.queued
	for _, ev := range evs[i:] {
		queued += len(ev.wire)
	}
	if queued > c.sq.room {
		n, ok := c.sq.queued()
		if !ok {
			c.handBack()
			return
		}
		c.queued = n
	}
	queued = c.queued
	if c.deadline.Sub(now) < directWriteTimeout/2 {
		c.deadline = now.Add(directWriteTimeout)
		if c.rc.SetWriteDeadline(c.deadline) != nil {
			c.handBack()
			return
		}
	}
	wrote, stop := false, false
	for _, ev := range evs[i:] {
		queued += len(ev.wire)
		if ev.start != c.pos || c.s.cursor > ev.cursor || len(ev.wire) > directMaxEvent || queued > c.sq.room {
			stop = true
			break
		}
		if !c.write(ev.wire, ev.count) {
			c.ended = true
			break
		}
		c.g.metrics.sseDirect.Add(ev.count)
		c.queued = queued
		wrote = true
		c.s.sentControl, c.s.lastOffset, c.s.lastUpToDate, c.s.lastClosed = true, ev.nextOffset, ev.upToDate, ev.closed
		c.pos, c.offset = ev.next, ev.nextOffset
		c.me.seq.Store(ev.seq + 1)
		if ev.closed {
			c.ended = true
			break
		}
	}
	if wrote && c.flush() != nil {
		c.ended = true
	}
	if stop || c.ended {
		c.handBack()
	}
}

// handBack returns c to its own goroutine. c.dmu is held.
func (c *sseConn) handBack() {
	c.direct = false
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeEvent writes a hub event (without flushing) and reports whether the
// response must end.
func (c *sseConn) writeEvent(ev *sseEvent) bool {
	switch {
	case ev.start > c.pos:
		return true // a gap: cannot happen; the client resumes from its offset
	case ev.next < c.pos, ev.next == c.pos && !ev.closed:
		return false // already delivered by our own reads
	case ev.start == c.pos && c.s.cursor <= ev.cursor:
		// The common case: the shared bytes.
		if !c.write(ev.wire, ev.count) {
			return true
		}
		c.s.sentControl, c.s.lastOffset, c.s.lastUpToDate, c.s.lastClosed = true, ev.nextOffset, ev.upToDate, ev.closed
	default:
		// Part of the event, or a cursor of our own: encode it for us.
		var data []byte
		if ev.next > c.pos {
			data = ev.data[c.pos-ev.start:]
		}
		first := ev.nextRecord
		if ev.next > c.pos {
			first = ev.firstRecord + uint64(bytes.Count(ev.data[:c.pos-ev.start], []byte{'\n'}))
		}
		out, _ := c.s.appendChunk(&streamv1.ReadResponse{
			Data: data, NextOffset: ev.nextOffset, UpToDate: ev.upToDate, Closed: ev.closed,
			RecordFirst: first, RecordNext: ev.nextRecord,
		}, time.Now())
		if len(out) > 0 && !c.write(out, c.s.events) {
			return true
		}
		c.s.events = 0
		c.s.trim()
	}
	c.pos, c.offset = ev.next, ev.nextOffset
	return ev.closed
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

// sseKeepBuf bounds the encoding buffers a connection keeps between
// chunks: one grown by a large chunk is dropped once written, so that
// thousands of mostly idle connections do not each keep a chunk's worth.
const sseKeepBuf = 64 << 10

// trim drops buffers grown past sseKeepBuf.
func (s *sseWriter) trim() {
	if cap(s.out) > sseKeepBuf {
		s.out = nil
	}
	if cap(s.payload) > sseKeepBuf {
		s.payload = nil
	}
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
	s.out = appendSSEControl(s.out, controlEvent{
		NextOffset: next, Cursor: cur, UpToDate: upToDate || closed, Closed: closed,
		Records: s.mode == sseJSON, FirstRecord: chunk.GetRecordFirst(), NextRecord: chunk.GetRecordNext(),
	})
	s.events++
	s.sentControl, s.lastOffset, s.lastUpToDate, s.lastClosed = true, next, upToDate || closed, closed
	return s.out, closed
}
