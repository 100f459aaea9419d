package gateway

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// Fan-out bounds. A hub keeps every event some client of it has not taken
// yet, and the latest hubKeepRecent events so that a client that finishes
// its own catch-up a little late still joins without another read. Past
// hubMaxEvents or hubMaxBytes the oldest events are dropped anyway: a client
// that still needed them catches up with its own reads, so a slow client
// costs memory only up to these bounds and never loses events.
const (
	hubKeepRecent = 16
	hubMaxEvents  = 1024
	hubMaxBytes   = 4 << 20
	// hubBatch bounds the events a client takes from its hub at once (one
	// flush).
	hubBatch = 64

	// A hub writer writes an event to a client directly only when the
	// event is at most directMaxEvent bytes and the connection has at most
	// directMaxQueued bytes (with the event) not yet acknowledged, so that
	// the write cannot block (see socketQueue); otherwise the client's own
	// goroutine takes over.
	directMaxEvent  = 16 << 10
	directMaxQueued = 32 << 10
	// directClientsPerWriter starts another writer (up to GOMAXPROCS) for
	// every so many direct clients.
	directClientsPerWriter = 256
	// directWriteTimeout is the write deadline a hub writer keeps on its
	// connections: a last resort should a write block after all. The write
	// then fails and the response ends (the client resumes from its offset).
	directWriteTimeout = 2 * time.Second
)

// Errors that end a hub (its clients end their responses and reconnect).
var (
	errHubReplaced     = errors.New("gateway: stream was replaced while subscribed")
	errHubInconsistent = errors.New("gateway: subscription chunks are not contiguous")
)

// hubKey names the stream of a hub.
type hubKey struct{ bucket, stream string }

// hubSet holds the gateway's hubs: at most one live one per stream.
type hubSet struct {
	mu     sync.Mutex
	m      map[hubKey]*hub
	closed bool           // no hub starts any more
	wg     sync.WaitGroup // running hubs and their writers
}

// close stops new hubs from starting and waits for the running ones, which
// end with the gateway's stop context.
func (hs *hubSet) close() {
	hs.mu.Lock()
	hs.closed = true
	hs.mu.Unlock()
	hs.wg.Wait()
}

// sseEvent is one chunk of a stream as SSE, encoded once and written as is
// to every client positioned at its start.
type sseEvent struct {
	seq        uint64
	start      uint64 // byte position of data
	next       uint64 // byte position after data
	nextOffset string
	data       []byte // stored bytes; never modified (they may alias storage)
	upToDate   bool
	closed     bool
	// firstRecord and nextRecord are the JSON record range of data (JSON
	// streams; 0 otherwise).
	firstRecord, nextRecord uint64
	cursor                  uint64 // the cursor in wire's control event
	wire                    []byte // the data event (when there is data), then the control event
	control                 int    // wire[control:] is the control event
	count                   uint64 // SSE events in wire
}

// hub is the gateway's one upstream subscription to a stream, shared by all
// of the stream's SSE clients of the same incarnation. The hub's goroutine
// turns chunks into events and appends them; clients take events from their
// own sequence number on, each at its own pace, and wait on changed.
//
// A client that has taken every event and whose connection has room hands
// its writing to one of the hub's writers ("direct" mode): a writer goes
// over its clients after every append and writes the new events to each,
// which saves a goroutine wake-up per client and event. When an event
// cannot be written that way (the connection is backed up, the event is
// large, the client needs its own encoding) the writer hands the client
// back to its own goroutine, which goes on from there.
type hub struct {
	key    hubKey
	inc    uint64
	mode   sseMode
	cancel context.CancelFunc
	refs   int // clients holding the hub; guarded by hubSet.mu
	// span is the span of the request that started the hub, the parent
	// of its upstream subscription's.
	span trace.SpanContext

	mu      sync.RWMutex
	events  []*sseEvent // retained events, consecutive sequence numbers
	first   uint64      // sequence number of events[0] (the next one when empty)
	tail    uint64      // byte position after the last event
	bytes   int         // sum of len(wire) of events
	clients map[*hubClient]struct{}
	changed chan struct{} // closed and replaced by every append and by the end
	ended   chan struct{} // closed by the end
	done    bool
	scratch []byte // payload encoding buffer of the hub's goroutine

	stopped <-chan struct{} // closed when the hub stops; ends the writers
	writers []*hubWriter    // started on demand; guarded by mu
}

// hubWriter writes events to its direct clients.
type hubWriter struct {
	clients map[*sseConn]struct{} // guarded by hub.mu
	wake    chan struct{}         // buffered 1: there may be new events
}

// hubClient is one client's place in its hub.
type hubClient struct {
	seq atomic.Uint64 // the next event the client takes
}

// acquireHub returns the live hub of t's stream for incarnation inc,
// starting one that subscribes at offset (byte position pos) when there is
// none. Every acquireHub is paired with a releaseHub. A hub outlives the
// request that starts it (it ends with its last client, or the gateway),
// but its upstream subscription is traced as part of that request: the
// Subscribe call's span is a child of reqCtx's span. A request that joins
// a running hub gets a span event naming the span the hub's subscription
// descends from.
func (g *Gateway) acquireHub(reqCtx context.Context, t target, inc uint64, mode sseMode, offset string, pos uint64) *hub {
	k := hubKey{t.ref.GetBucket(), t.ref.GetStream()}
	hs := &g.hubs
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.m[k]; h != nil && h.inc == inc && h.mode == mode {
		h.refs++
		if span := trace.SpanFromContext(reqCtx); span.IsRecording() && h.span.IsValid() {
			span.AddEvent("ursula.sse.hub_joined", trace.WithAttributes(
				attrHubTraceID.String(h.span.TraceID().String()), attrHubSpanID.String(h.span.SpanID().String())))
		}
		return h
	}
	reqSpan := trace.SpanFromContext(reqCtx)
	ctx, cancel := context.WithCancel(trace.ContextWithSpan(g.stopCtx, reqSpan))
	h := &hub{
		key: k, inc: inc, mode: mode, cancel: cancel, refs: 1, stopped: ctx.Done(), span: reqSpan.SpanContext(),
		first: 0, tail: pos, clients: map[*hubClient]struct{}{}, changed: make(chan struct{}), ended: make(chan struct{}),
	}
	if hs.closed {
		// The gateway is closing: a hub that has already ended.
		cancel()
		h.done = true
		close(h.ended)
		return h
	}
	if hs.m == nil {
		hs.m = map[hubKey]*hub{}
	}
	// A hub of another incarnation keeps serving the clients it has; it is
	// no longer found by new ones.
	hs.m[k] = h
	ref := t.ref
	g.metrics.sseHubs.Add(1)
	hs.wg.Go(func() {
		defer g.metrics.sseHubs.Add(-1)
		err := h.follow(ctx, g, ref, offset)
		g.forgetHub(h)
		h.finish()
		if err != nil && ctx.Err() == nil && !errors.Is(err, errHubReplaced) {
			g.logger.Debug("sse hub ended", "bucket", k.bucket, "stream", k.stream, "err", err)
		}
	})
	return h
}

// releaseHub drops a reference; the last one stops the hub.
func (g *Gateway) releaseHub(h *hub) {
	hs := &g.hubs
	hs.mu.Lock()
	h.refs--
	last := h.refs == 0
	if last && hs.m[h.key] == h {
		delete(hs.m, h.key)
	}
	hs.mu.Unlock()
	if last {
		h.cancel()
	}
}

// forgetHub removes an ending hub so that new clients start a new one.
func (g *Gateway) forgetHub(h *hub) {
	hs := &g.hubs
	hs.mu.Lock()
	if hs.m[h.key] == h {
		delete(hs.m, h.key)
	}
	hs.mu.Unlock()
}

// follow subscribes from offset and appends an event per chunk with data
// (or closing the stream) until the subscription ends.
func (h *hub) follow(ctx context.Context, g *Gateway, ref *streamv1.StreamRef, offset string) error {
	sub, err := g.client.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref, Offset: offset, MaxBytes: g.maxBytes()})
	if err != nil {
		return err
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return err
		}
		chunk := msg.GetChunk()
		if chunk.GetIncarnation() != h.inc {
			return errHubReplaced
		}
		data, closed := chunk.GetData(), chunk.GetClosed()
		if len(data) == 0 && !closed {
			continue // the announcement of the tail
		}
		start := h.tail // only this goroutine writes tail
		if s := chunk.GetStartOffset(); s != "" {
			if p, ok := offsetPosition(s); !ok || p != start {
				return errHubInconsistent
			}
		}
		next, ok := offsetPosition(chunk.GetNextOffset())
		if !ok || next != start+uint64(len(data)) {
			return errHubInconsistent
		}
		h.publish(h.encode(chunk, start, next, time.Now()))
		if closed {
			return nil
		}
	}
}

// encode builds the event of a chunk.
func (h *hub) encode(chunk *streamv1.ReadResponse, start, next uint64, now time.Time) *sseEvent {
	data, closed := chunk.GetData(), chunk.GetClosed()
	ev := &sseEvent{
		start: start, next: next, nextOffset: chunk.GetNextOffset(), data: data,
		upToDate: chunk.GetUpToDate() || closed, closed: closed, cursor: currentCursor(now),
		firstRecord: chunk.GetRecordFirst(), nextRecord: chunk.GetRecordNext(),
	}
	payload := data
	if h.mode != sseText {
		h.scratch = ssePayload(h.scratch[:0], data, h.mode)
		payload = h.scratch
	}
	var wire []byte
	if len(data) > 0 {
		wire = make([]byte, 0, len(payload)+len(payload)/8+192)
		wire = appendSSEData(wire, payload)
		ev.count++
	} else {
		wire = make([]byte, 0, 128)
	}
	ev.control = len(wire)
	wire = appendSSEControl(wire, controlEvent{
		NextOffset: ev.nextOffset, Cursor: ev.cursor, UpToDate: ev.upToDate, Closed: closed,
		Records: h.mode == sseJSON, FirstRecord: ev.firstRecord, NextRecord: ev.nextRecord,
	})
	ev.count++
	ev.wire = wire
	if cap(h.scratch) > hubMaxBytes {
		h.scratch = nil
	}
	return ev
}

// publish appends ev, drops what is no longer needed and wakes the clients.
func (h *hub) publish(ev *sseEvent) {
	h.mu.Lock()
	ev.seq = h.first + uint64(len(h.events))
	h.events = append(h.events, ev)
	h.bytes += len(ev.wire)
	h.tail = ev.next
	h.trim()
	close(h.changed)
	h.changed = make(chan struct{})
	for _, w := range h.writers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}

// trim drops the oldest events that every client has taken (keeping the
// latest hubKeepRecent), and any beyond the bounds. h.mu is held.
func (h *hub) trim() {
	low := h.first + uint64(len(h.events))
	for c := range h.clients {
		low = min(low, c.seq.Load())
	}
	n := 0
	for left := len(h.events); left > 1; left-- {
		ev := h.events[n]
		over := h.bytes > hubMaxBytes || left > hubMaxEvents
		if !over && (ev.seq >= low || left <= hubKeepRecent) {
			break
		}
		h.bytes -= len(ev.wire)
		h.events[n] = nil
		n++
	}
	if n > 0 {
		h.events = h.events[n:]
		h.first += uint64(n)
	}
}

// finish marks the hub ended and wakes its clients.
func (h *hub) finish() {
	h.mu.Lock()
	h.done = true
	close(h.changed)
	h.changed = make(chan struct{})
	close(h.ended)
	h.mu.Unlock()
}

// join places c at byte position pos: at the first retained event that
// ends after pos, or after the last one. It reports false when events
// from pos on are no longer retained (the client must read further itself).
func (h *hub) join(c *hubClient, pos uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	base := h.tail
	if len(h.events) > 0 {
		base = h.events[0].start
	}
	if pos < base {
		return false
	}
	i := sort.Search(len(h.events), func(i int) bool {
		ev := h.events[i]
		return ev.next > pos || (ev.closed && ev.next == pos)
	})
	c.seq.Store(h.first + uint64(i))
	h.clients[c] = struct{}{}
	return true
}

// leave removes c.
func (h *hub) leave(c *hubClient) {
	h.mu.Lock()
	delete(h.clients, c)
	h.mu.Unlock()
}

// take appends to dst up to hubBatch events from c's place on and moves c
// past them. lagging is set when c's next event was dropped; done when the
// hub ended and c has taken everything; changed is closed by the next
// append.
func (h *hub) take(c *hubClient, dst []*sseEvent) (_ []*sseEvent, changed <-chan struct{}, lagging, done bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	seq := c.seq.Load()
	if seq < h.first {
		return dst, nil, true, false
	}
	i := int(seq - h.first)
	end := min(len(h.events), i+hubBatch)
	dst = append(dst, h.events[i:end]...)
	c.seq.Store(h.first + uint64(end))
	return dst, h.changed, false, h.done && end == len(h.events)
}

// goDirect hands c's writing to a writer when c has taken every event and
// its connection has room; it reports whether it did. The caller is c's own
// goroutine, which then waits on c.wake, h.ended and its context.
func (h *hub) goDirect(g *Gateway, c *sseConn) bool {
	if c.sq == nil || c.s.cursor > currentCursor(time.Now()) {
		return false
	}
	n, ok := c.sq.queued()
	if !ok || n > c.sq.room/2 {
		return false
	}
	c.queued = n
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || c.me.seq.Load() != h.first+uint64(len(h.events)) {
		return false
	}
	var w *hubWriter
	for _, cand := range h.writers {
		if w == nil || len(cand.clients) < len(w.clients) {
			w = cand
		}
	}
	if w == nil || (len(w.clients) >= directClientsPerWriter && len(h.writers) < runtime.GOMAXPROCS(0)) {
		w = &hubWriter{clients: map[*sseConn]struct{}{}, wake: make(chan struct{}, 1)}
		h.writers = append(h.writers, w)
		g.hubs.wg.Go(func() { h.runWriter(w) })
	}
	c.dmu.Lock()
	c.direct, c.writer = true, w
	c.dmu.Unlock()
	w.clients[c] = struct{}{}
	return true
}

// leaveDirect takes c back from its writer; when it returns, no writer
// touches c any more.
func (h *hub) leaveDirect(c *sseConn) {
	h.mu.Lock()
	if c.writer != nil {
		delete(c.writer.clients, c)
	}
	h.mu.Unlock()
	c.dmu.Lock()
	c.direct, c.writer = false, nil
	c.dmu.Unlock()
}

// runWriter writes new events to the writer's direct clients until the hub
// ends.
func (h *hub) runWriter(w *hubWriter) {
	var clients []*sseConn
	var evs []*sseEvent
	for {
		select {
		case <-w.wake:
		case <-h.stopped:
			return
		}
		h.mu.RLock()
		first := h.first
		evs = append(evs[:0], h.events...)
		for c := range w.clients {
			clients = append(clients, c)
		}
		h.mu.RUnlock()
		now := time.Now()
		for i, c := range clients {
			clients[i] = nil
			c.writeDirect(first, evs, now)
		}
		clients = clients[:0]
		clear(evs)
	}
}

// offsetPosition returns the byte position of a server-issued offset
// "<read seq>_<position>".
func offsetPosition(s string) (uint64, bool) {
	sep := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '_' {
			sep = i
			break
		}
	}
	if sep <= 0 || sep == len(s)-1 {
		return 0, false
	}
	var pos uint64
	for i := sep + 1; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if pos > (^uint64(0)-d)/10 {
			return 0, false
		}
		pos = pos*10 + d
	}
	return pos, true
}
