package stream

import (
	"bytes"
	"sort"
	"strconv"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// JSON record coordinates.
//
// Every message of a JSON stream has a zero-based ordinal, its record; a
// stream counts them (record_next) and never renumbers them. No index per
// message is kept: the hot window knows the ordinal of its first message
// (hot_record), every cold-index entry the ordinals of its first message
// and of the one after its last (ColdRef.first_record/next_record, pages
// included), and an external payload in the hot window carries the same
// pair in its reference. Locating a record (or the record at a position)
// finds the one entry holding it and counts '\n' inside it.
//
// In the hot window that count is bounded by checkpoints (marks): each
// replica keeps, for a JSON stream, the (position, ordinal) of a message
// boundary at least every recordStep bytes, found by binary search. They
// are derived from the hot bytes (set as appends apply, dropped with the
// bytes a flush moves out, rebuilt when a snapshot is installed) and never
// replicated, so no command or snapshot format changes and a release
// without them applies the same log alike. Cold objects are indexed the
// same way by the tier reader (storage/tier).

// recordStep is the most hot bytes a record lookup counts '\n' in beyond
// a checkpoint (plus one message, or one external payload, whose range its
// reference carries).
const recordStep = 64 << 10

// recordMark is a record checkpoint: rec is the JSON record ordinal of the
// message starting at pos (a message boundary of the hot window).
type recordMark struct{ pos, rec uint64 }

// lastMark is the newest checkpoint, or the hot window's start.
func (s *stream) lastMark() recordMark {
	if n := len(s.marks); n > 0 {
		return s.marks[n-1]
	}
	return recordMark{s.buf.Base(), s.meta.GetHotRecord()}
}

// markRecords adds the checkpoints of an append that applied at start
// (body, or an external payload when body is nil): at each message end
// (or the payload's end) that is recordStep or more past the checkpoint
// before it. The rule is rebuildMarks', so that a replica that applied the
// appends and one that installed a snapshot keep the same checkpoints; a
// body is walked only when its end is that far past the last checkpoint.
func (s *stream) markRecords(start uint64, body []byte) {
	if !s.meta.GetJson() {
		return
	}
	end := s.buf.End()
	last := s.lastMark().pos
	if end-last < recordStep {
		return
	}
	if body == nil {
		s.marks = append(s.marks, recordMark{end, s.meta.GetRecordNext()})
		return
	}
	s.markMessages(body, start, s.meta.GetRecordNext()-countRecords(body), last)
}

// markMessages adds a checkpoint at each message end in seg (which starts
// at position start, after record rec) that is recordStep or more past
// the checkpoint before it (at last), and returns the record and the last
// checkpoint after seg: the one rule of markRecords and rebuildMarks.
func (s *stream) markMessages(seg []byte, start, rec, last uint64) (uint64, uint64) {
	for p := 0; ; {
		i := bytes.IndexByte(seg[p:], '\n')
		if i < 0 {
			return rec, last
		}
		p += i + 1
		rec++
		if pos := start + uint64(p); pos-last >= recordStep {
			s.marks = append(s.marks, recordMark{pos, rec})
			last = pos
		}
	}
}

// trimMarks drops the checkpoints below the hot window after a flush.
func (s *stream) trimMarks() {
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].pos >= s.buf.Base() })
	if i > 0 {
		s.marks = append([]recordMark(nil), s.marks[i:]...)
	}
}

// rebuildMarks derives the checkpoints of an installed hot window (a
// restored or imported snapshot): one pass over its bytes.
func (s *stream) rebuildMarks() {
	s.marks = nil
	if !s.meta.GetJson() {
		return
	}
	last, rec := s.buf.Base(), s.meta.GetHotRecord()
	from, to := s.buf.Base(), s.buf.End()
	for from < to {
		if _, he, tag, hole := s.buf.Hole(from); hole {
			rec, from = tag.(*storagev1.ColdRef).GetNextRecord(), he
		} else {
			stop := s.buf.NextHole(from, to)
			for _, seg := range s.buf.Segments(from, stop) {
				rec, last = s.markMessages(seg, from, rec, last)
				from += uint64(len(seg))
			}
			from = stop
		}
		if from-last >= recordStep {
			s.marks = append(s.marks, recordMark{from, rec})
			last = from
		}
	}
}

// markAt is the newest checkpoint at or below hot position pos.
func (s *stream) markAt(pos uint64) recordMark {
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].pos > pos })
	if i == 0 {
		return recordMark{s.buf.Base(), s.meta.GetHotRecord()}
	}
	return s.marks[i-1]
}

// markOf is the newest checkpoint whose record is at or below n.
func (s *stream) markOf(n uint64) recordMark {
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].rec > n })
	if i == 0 {
		return recordMark{s.buf.Base(), s.meta.GetHotRecord()}
	}
	return s.marks[i-1]
}

// numberLegacyRecords numbers the messages of a JSON stream restored from
// a snapshot written before record numbering existed, whose record fields
// were then absent: such a stream holds messages past its base, yet its
// record tail is 0 (a numbered stream with bytes has a record tail of at
// least 1). Left alone, its next message would take ordinal 0 while older
// messages precede it, and lookups would count them in the hot window but
// not in the tail. Its hot window is numbered from base_record (0 unless a
// fork) at its start: a stream whose bytes are all hot (every stream
// without a cold store) gets the ordinals it would have had from its first
// message; the first retained record is the ordinal at the retention (at
// the hot window's start when the retention lies below it). Messages that
// older release had flushed to cold objects (their index entries carry no
// record range) have no ordinal: record reads start at the hot window.
//
// The numbering depends on the snapshot alone, so every replica that
// installs it numbers alike. Log entries the older release wrote and a
// replica replays after such a snapshot are another matter (a cold flush
// without record ranges is refused): docs/architecture.md describes the
// upgrade (snapshot every group first).
func (s *stream) numberLegacyRecords() {
	m := &s.meta
	if !m.GetJson() || m.GetRecordNext() != 0 || s.buf.End() <= m.GetBase() {
		return
	}
	first := m.GetBaseRecord()
	m.HotRecord = first
	m.RecordNext = first + s.hotRecords(s.buf.Base(), s.buf.End())
	m.RecordFirst = first
	if r := m.GetRetained(); r > s.buf.Base() {
		m.RecordFirst = first + s.hotRecords(s.buf.Base(), min(r, s.buf.End()))
	}
}

// FrameResult is the outcome of one frame of an append batch.
type FrameResult struct {
	// End is the position after the frame.
	End uint64
	// RecordStart and RecordNext are the frame's JSON record range.
	RecordStart, RecordNext uint64
}

// countRecords is the number of JSON messages in stored-form bytes.
func countRecords(b []byte) uint64 { return uint64(bytes.Count(b, []byte{'\n'})) }

// addRecords counts the records that body (or ext, whose next_record holds
// its relative count) adds to a JSON stream, and rebases ref (the clone of
// ext placed in the hot window) to absolute ordinals.
func (s *stream) addRecords(body []byte, ref *storagev1.ColdRef) {
	if !s.meta.GetJson() {
		return
	}
	n := countRecords(body)
	if ref != nil {
		n = ref.GetNextRecord() - ref.GetFirstRecord()
		ref.FirstRecord, ref.NextRecord = s.meta.GetRecordNext(), s.meta.GetRecordNext()+n
	}
	s.meta.RecordNext += n
}

// batchBody concatenates an append batch's frames and returns the record
// ends (relative) that make each frame its own append.
func batchBody(frames [][]byte) ([]byte, []uint64) {
	var n int
	for _, f := range frames {
		n += len(f)
	}
	body := make([]byte, 0, n)
	rel := make([]uint64, 0, len(frames))
	for _, f := range frames {
		body = append(body, f...)
		rel = append(rel, uint64(len(body)))
	}
	return body, rel
}

// frameResults describes each frame of a batch appended at start (position)
// and first (record ordinal).
func (s *stream) frameResults(frames [][]byte, start, first uint64) []FrameResult {
	out := make([]FrameResult, len(frames))
	pos, rec := start, first
	for i, f := range frames {
		pos += uint64(len(f))
		n := uint64(0)
		if s.meta.GetJson() {
			n = countRecords(f)
		}
		out[i] = FrameResult{End: pos, RecordStart: rec, RecordNext: rec + n}
		rec += n
	}
	return out
}

// recordMismatch is the answer to a Stream-Record-Match that does not
// equal the stream's record tail.
func recordMismatch(s *stream, want uint64) *fault.Error {
	return fault.Errorf(fault.ErrRecordMismatch, "record tail is %d, not %d", s.meta.GetRecordNext(), want).
		With(fault.DetailRecordNext, strconv.FormatUint(s.meta.GetRecordNext(), 10)).
		With(fault.DetailNextOffset, FormatOffset(s.buf.End()))
}

// flushRecords checks (JSON streams) that a flush's entries carry the
// record ordinals of the bytes they replace, and returns the ordinal at the
// end of the flushed range.
func (s *stream) flushRecords(chunks []*storagev1.ColdRef) (uint64, *fault.Error) {
	rec := s.meta.GetHotRecord()
	if !s.meta.GetJson() {
		return rec, nil
	}
	for _, ch := range chunks {
		var n uint64
		if _, _, tag, hole := s.buf.Hole(ch.GetStart()); hole {
			ref := tag.(*storagev1.ColdRef)
			n = ref.GetNextRecord() - ref.GetFirstRecord()
		} else {
			n = s.hotRecords(ch.GetStart(), ch.GetEnd())
		}
		if ch.GetFirstRecord() != rec || ch.GetNextRecord() != rec+n {
			return 0, fault.Errorf(fault.ErrInvalidArgument, "cold flush entry [%d, %d) names records [%d, %d), want [%d, %d)",
				ch.GetStart(), ch.GetEnd(), ch.GetFirstRecord(), ch.GetNextRecord(), rec, rec+n)
		}
		rec += n
	}
	return rec, nil
}

// hotRecords counts the JSON messages in hot positions [from, to) (whole
// external payloads by their reference).
func (s *stream) hotRecords(from, to uint64) uint64 {
	var n uint64
	for from < to {
		if _, he, tag, hole := s.buf.Hole(from); hole {
			ref := tag.(*storagev1.ColdRef)
			n += ref.GetNextRecord() - ref.GetFirstRecord()
			from = he
			continue
		}
		stop := s.buf.NextHole(from, to)
		for _, seg := range s.buf.Segments(from, stop) {
			n += countRecords(seg)
		}
		from = stop
	}
	return n
}

// pageRecords sets a page reference's record range from its entries.
func pageRecords(page *storagev1.ColdRef, run []*storagev1.ColdRef) {
	page.FirstRecord, page.NextRecord = run[0].GetFirstRecord(), run[len(run)-1].GetNextRecord()
}

// swapRecords returns the compacted chunk with the record range of the
// entries it replaces (apply trusts its own index, not the command).
func swapRecords(ch *storagev1.ColdRef, run []*storagev1.ColdRef) *storagev1.ColdRef {
	ch = proto.CloneOf(ch)
	pageRecords(ch, run)
	return ch
}

// RecordPos locates JSON record n in a stream's own range: the position of
// its first byte (Tail for n == record_next), or the cold reference (an
// index entry, possibly a page, or an external payload) holding it, which
// the caller scans. ok is false when the stream (of that incarnation) is
// gone or n is outside [base_record, record_next].
func (m *Machine) RecordPos(key Key, inc uint64, n uint64) (pos uint64, ref *storagev1.ColdRef, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc || n < s.meta.GetBaseRecord() || n > s.meta.GetRecordNext() {
		return 0, nil, false
	}
	if n == s.meta.GetRecordNext() {
		return s.buf.End(), nil, true
	}
	if n < s.meta.GetHotRecord() {
		for _, lv := range s.coldLevels() {
			for _, e := range lv.GetEntries() {
				if e.GetFirstRecord() <= n && n < e.GetNextRecord() {
					return e.GetStart(), e, true
				}
			}
		}
		return 0, nil, false
	}
	mk := s.markOf(n)
	rec := mk.rec
	from, to := mk.pos, s.buf.End()
	for from < to {
		if hs, he, tag, hole := s.buf.Hole(from); hole {
			r := tag.(*storagev1.ColdRef)
			if n < r.GetNextRecord() {
				return hs, r, true
			}
			rec, from = r.GetNextRecord(), he
			continue
		}
		stop := s.buf.NextHole(from, to)
		for _, seg := range s.buf.Segments(from, stop) {
			if rec == n {
				return from, nil, true
			}
			for {
				i := bytes.IndexByte(seg, '\n')
				if i < 0 {
					break
				}
				from += uint64(i) + 1
				seg = seg[i+1:]
				rec++
				if rec == n {
					return from, nil, true
				}
			}
			from += uint64(len(seg))
		}
		from = stop
	}
	return 0, nil, false
}

// RecordAt returns the JSON record ordinal at a message boundary pos of a
// stream's own range (the number of messages before it), or the cold
// reference holding pos, which the caller scans. ok is false when the
// stream (of that incarnation) is gone or pos is outside [base, tail].
func (m *Machine) RecordAt(key Key, inc uint64, pos uint64) (rec uint64, ref *storagev1.ColdRef, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc || pos < s.meta.GetBase() || pos > s.buf.End() {
		return 0, nil, false
	}
	if pos == s.buf.End() {
		return s.meta.GetRecordNext(), nil, true
	}
	if pos < s.buf.Base() {
		ref := s.coldRef(pos)
		return 0, ref, ref != nil
	}
	if hs, _, tag, hole := s.buf.Hole(pos); hole {
		r := tag.(*storagev1.ColdRef)
		if hs == pos {
			return r.GetFirstRecord(), nil, true
		}
		return 0, r, true
	}
	mk := s.markAt(pos)
	if pos-mk.pos <= s.buf.End()-pos {
		return mk.rec + s.hotRecords(mk.pos, pos), nil, true
	}
	return s.meta.GetRecordNext() - s.hotRecords(pos, s.buf.End()), nil, true // nearer the tail
}
