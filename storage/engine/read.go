package engine

import (
	"bytes"
	"context"
	"errors"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// maxWait bounds a long-poll wait whatever the caller asks.
const maxWait = 5 * time.Minute

// Read returns stored bytes from an offset, waiting at the tail of an open
// stream for up to wait_ms. It starts after a read barrier of the
// stream's group, so it sees every write acknowledged before it began.
func (e *Engine) Read(ctx context.Context, req *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	tail := req.GetOffset() == stream.OffsetNow || req.GetWaitMs() > 0
	if tail && !e.leads(k) {
		return nil, e.notLeader(k) // without a barrier: only the leader answers
	}
	m, err := e.readLive(ctx, k)
	if err != nil {
		return nil, err
	}
	if err := checkIncarnation(m, req.GetIncarnation()); err != nil {
		return nil, err
	}
	leader := e.leads(k)
	if !leader && tail {
		return nil, e.notLeader(k)
	}
	if !req.GetNoTouch() {
		e.touch(m)
	}
	if req.GetMaxRecords() > 0 && !hasRecordStart(req) {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "max_records needs a record start (record or tail_records)")
	}
	var pos uint64
	if hasRecordStart(req) {
		pos, err = e.recordStart(ctx, req, m, leader)
	} else {
		pos, err = startPosition(req.GetOffset(), m)
		if err == nil {
			err = e.checkMessageStart(ctx, m, pos, req.GetOffset())
		}
	}
	if err != nil {
		var de *fault.Error
		if !leader && errors.As(err, &de) && de.Kind == fault.ErrOffsetOutOfRange {
			// A lagging follower has not applied that far yet: the
			// leader can answer.
			return nil, e.notLeader(k)
		}
		return nil, err
	}
	if !leader && pos >= m.Tail {
		// A follower at its tail has nothing to serve and cannot tell
		// whether it is the stream's tail: the leader answers (else a
		// client would get an empty page that is not up to date, and a
		// router that does not know the leader could send it back here).
		return nil, e.notLeader(k)
	}
	limit := e.limit(req.GetMaxBytes())
	readAt := func(cur stream.Meta) (*streamv1.ReadResponse, error) {
		resp, err := e.readAt(ctx, cur, pos, limit)
		if err == nil {
			err = e.withRecords(ctx, cur, resp, pos, req.GetMaxRecords())
		}
		return resp, err
	}
	resp, err := readAt(m)
	if err == nil && !leader {
		// A follower serves history, but it cannot know that its tail is
		// the stream's tail: it never claims to be up to date or closed,
		// so a client continues at the leader.
		resp.UpToDate, resp.Closed = false, false
	}
	if err != nil || len(resp.GetData()) > 0 || resp.GetClosed() || req.GetWaitMs() == 0 {
		return resp, err
	}
	wait := min(time.Duration(req.GetWaitMs())*time.Millisecond, maxWait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch, cur, ok := e.machine(k).Changed(k, m.Incarnation)
		if !ok {
			if m, err = e.followHistory(k, m, req.GetIncarnation()); err != nil {
				return nil, err
			}
			resp.Incarnation = m.Incarnation
			continue
		}
		if cur.Tail > pos || cur.Closed || cur.SoftDeleted {
			if cur.SoftDeleted {
				return nil, fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", k.Stream)
			}
			return readAt(cur)
		}
		select {
		case <-ch:
		case <-timer.C:
			resp.TimedOut = true
			return resp, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Subscribe sends catch-up chunks from an offset, then every new chunk as
// it commits, until the stream is closed and delivered, deleted, or ctx
// ends. It starts after a read barrier, as Read does. The first chunk at
// the tail is sent even when empty, so that a subscriber learns the tail
// at once. The chunks of a JSON stream carry their record range
// (record_first, record_next), as reads do.
func (e *Engine) Subscribe(ctx context.Context, req *streamv1.SubscribeRequest, send func(*streamv1.ReadResponse) error) error {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return err
	}
	if !e.leads(k) {
		return e.notLeader(k)
	}
	m, err := e.readLive(ctx, k)
	if err != nil {
		return err
	}
	pos, err := startPosition(req.GetOffset(), m)
	if err == nil {
		err = e.checkMessageStart(ctx, m, pos, req.GetOffset())
	}
	if err != nil {
		return err
	}
	limit := e.limit(req.GetMaxBytes())
	// rec is the JSON record ordinal at pos: looked up once, then counted
	// along with the chunks (they are contiguous).
	var rec uint64
	if m.JSON && pos >= m.Retained {
		if rec, err = e.recordAt(ctx, m, pos); err != nil {
			return err
		}
	}
	announced := false
	for {
		e.touch(m)
		resp, err := e.readAt(ctx, m, pos, limit)
		if err != nil {
			return err
		}
		if m.JSON {
			resp.RecordFirst = rec
			rec += uint64(bytes.Count(resp.GetData(), []byte{'\n'}))
			resp.RecordNext = rec
		}
		if len(resp.GetData()) > 0 || !announced || resp.GetClosed() {
			if err := send(resp); err != nil {
				return err
			}
			announced = true
		}
		if resp.GetClosed() {
			return nil
		}
		pos = m.Tail
		if len(resp.GetData()) > 0 {
			if p, perr := stream.ParseOffset(resp.GetNextOffset()); perr == nil {
				pos = p.Pos
			}
			if !resp.GetUpToDate() {
				continue
			}
		}
		// Wait for the stream to move past pos.
		for {
			ch, cur, ok := e.machine(k).Changed(k, m.Incarnation)
			if !ok {
				// A subscription follows one incarnation: a new history
				// ends it like a recreate does, with the new token.
				_, err := e.followHistory(k, m, m.Incarnation)
				return err
			}
			if cur.SoftDeleted {
				return fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", k.Stream)
			}
			if cur.Tail > pos || cur.Closed {
				m = cur
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// followHistory answers a wait on stream m whose incarnation went away.
// When its group started a new history (the stream is the same, under a
// new incarnation that kept every byte m had), a wait pinned to another
// token answers 412 with the new one, and an unpinned wait goes on under
// the new incarnation; otherwise the stream was deleted.
func (e *Engine) followHistory(k stream.Key, m stream.Meta, pinned uint64) (stream.Meta, error) {
	cur, ok := e.machine(k).Lookup(k)
	if !ok || !cur.SameStream(m) || cur.SoftDeleted {
		return m, fault.Errorf(fault.ErrStreamNotFound, "stream %s was deleted", k.Stream)
	}
	if err := checkIncarnation(cur, pinned); err != nil {
		return m, err
	}
	return cur, nil
}

func (e *Engine) limit(asked uint64) uint64 {
	if asked == 0 || asked > e.cfg.ReadChunkBytes {
		return e.cfg.ReadChunkBytes
	}
	return asked
}

// startPosition resolves a read offset against a stream.
func startPosition(raw string, m stream.Meta) (uint64, error) {
	if raw == "" {
		raw = stream.OffsetStart
	}
	off, err := stream.ParseOffset(raw)
	if err != nil {
		return 0, err
	}
	switch {
	case off.Start:
		return m.Retained, nil
	case off.Now:
		return m.Tail, nil
	case off.Pos > m.Tail:
		return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "offset %s is beyond the tail %s", raw, stream.FormatOffset(m.Tail))
	}
	return off.Pos, nil
}

// checkMessageStart refuses a read of a JSON stream from a position inside
// a message: the bytes from there are not JSON, and the gateway would
// render them as an invalid array (every offset the server issues is a
// message boundary; a client that computes its own may not be). The start,
// the tail and the retention are boundaries; so is every append end and
// every '\n' of stored form, hot or cold (see boundary). A position below
// the retention is left to the read, which answers OFFSET_TRIMMED.
func (e *Engine) checkMessageStart(ctx context.Context, m stream.Meta, pos uint64, raw string) error {
	if !m.JSON || pos < m.Retained {
		return nil
	}
	ok, err := e.boundary(ctx, m, pos)
	if err != nil {
		return err
	}
	if !ok {
		return fault.Errorf(fault.ErrInvalidArgument, "offset %s is inside a JSON message: read from an offset the server issued", raw)
	}
	return nil
}

// readAt reads up to limit bytes of m's view (inherited history, then its
// own bytes) from pos.
func (e *Engine) readAt(ctx context.Context, m stream.Meta, pos, limit uint64) (*streamv1.ReadResponse, error) {
	if pos < m.Retained {
		return nil, stream.Trimmed(m, pos)
	}
	data, end, err := e.readView(ctx, m, pos, m.Tail, limit, nil, 0)
	if err != nil {
		return nil, err
	}
	upToDate := end >= m.Tail
	return &streamv1.ReadResponse{
		Data:        data,
		StartOffset: stream.FormatOffset(pos),
		NextOffset:  stream.FormatOffset(end),
		UpToDate:    upToDate,
		Closed:      upToDate && m.Closed,
		ContentType: m.ContentType,
		Incarnation: m.Incarnation,
	}, nil
}

// readView reads [from, to) of a stream's view into dst, following its fork
// chain for positions below its base.
func (e *Engine) readView(ctx context.Context, m stream.Meta, from, to, limit uint64, dst []byte, depth int) ([]byte, uint64, error) {
	if depth > 1024 {
		return dst, from, fault.Errorf(fault.ErrInternal, "fork chain too deep")
	}
	if from < m.Base {
		f := m.Fork
		if f == nil {
			return dst, from, fault.Errorf(fault.ErrInternal, "stream %s starts at %d but has no fork origin", m.Key.Stream, m.Base)
		}
		sk := stream.Key{Bucket: f.GetSourceBucket(), Stream: f.GetSourceStream()}
		src, ok := e.sourceAtLeast(sk, f.GetSourceIncarnation(), min(to, m.Base))
		if !ok {
			if src.LostHistory(f.GetSourceIncarnation(), min(to, m.Base)) {
				return dst, from, lostForkHistory(m, src)
			}
			return dst, from, fault.Errorf(fault.ErrUnavailable, "fork source %s of %s is not replicated here yet", sk.Stream, m.Key.Stream).With(fault.DetailRetryAfterMS, "200")
		}
		before := len(dst)
		var err error
		dst, from, err = e.readView(ctx, src, from, min(to, m.Base), limit, dst, depth+1)
		if err != nil {
			return dst, from, err
		}
		got := uint64(len(dst) - before)
		if from < m.Base || got >= limit {
			return dst, from, nil
		}
		limit -= got
	}
	// Own bytes: cold parts (index entries, external payloads) are read
	// from the object store, and the read goes on past each of them; a
	// read of hot bytes returns as the machine cut it.
	for from < to && limit > 0 {
		out, end, ref, ok := e.machine(m.Key).ReadOwn(m.Key, m.Incarnation, from, to, limit, dst)
		if !ok {
			return dst, from, fault.Errorf(fault.ErrStreamNotFound, "stream %s was deleted", m.Key.Stream)
		}
		if ref == nil {
			return out, end, nil
		}
		data, cend, err := e.cold.Read(ctx, m, ref, from, to, limit)
		if err == nil && cend <= from {
			err = fault.Errorf(fault.ErrInternal, "cold read of %s at %d made no progress", m.Key.Stream, from)
		}
		if err != nil {
			if len(dst) > 0 {
				return dst, from, nil // serve what was read; the next read reports the failure
			}
			return dst, from, err
		}
		if len(dst) == 0 && (cend >= to || uint64(len(data)) >= limit) {
			return data, cend, nil // one part: no copy
		}
		dst = append(dst, data...)
		limit -= min(limit, uint64(len(data)))
		from = cend
	}
	return dst, from, nil
}

// sourceAtLeast looks up a fork's source on this replica, waiting briefly
// when the replica has not yet applied the source's bytes up to need (its
// group may lag the fork's group on this node): each of the source group's
// applies wakes it to look again. The source may have started a new
// history since the fork was made (a later incarnation that kept the
// bytes); one that lost them is returned at once, not ok.
func (e *Engine) sourceAtLeast(k stream.Key, inc, need uint64) (stream.Meta, bool) {
	g := e.GroupOf(k)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for {
		applied := e.groups.Status(g).Applied
		src, ok := e.machine(k).Lookup(k)
		if ok && src.HoldsHistory(inc, need) && src.Tail >= need {
			return src, true
		}
		if ok && src.LostHistory(inc, need) {
			return src, false
		}
		if e.groups.WaitApplied(ctx, g, applied+1) != nil {
			return src, false
		}
	}
}
