package stream

import (
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

// coldRef finds the index entry covering pos (below the hot window): level
// 0 holds the newest range, each level above an older one.
func (s *stream) coldRef(pos uint64) *storagev1.ColdRef { return s.cold.find(pos) }

// enqueueGC adds an entry to the replicated cold-GC queue.
func (m *Machine) enqueueGC(bucket string, kind storagev1.GCKind, key string, notBefore int64) {
	m.gc = append(m.gc, &storagev1.GCEntry{Seq: m.gcNextSeq, Bucket: bucket, Kind: kind, Key: key, NotBeforeMs: notBefore})
	m.gcNextSeq++
}

// enqueueGCRef queues an index entry's object; a page's entry carries its
// checksum, so the worker trusts only a page that matches it.
func (m *Machine) enqueueGCRef(bucket string, kind storagev1.GCKind, ref *storagev1.ColdRef, notBefore int64) {
	m.enqueueGC(bucket, kind, ref.GetKey(), notBefore)
	if kind == storagev1.GCKind_GC_KIND_PAGE {
		m.gc[len(m.gc)-1].Crc32C = ref.GetCrc32C()
	}
}

func (m *Machine) coldStream(bucket, name string, inc uint64) (*stream, *Result) {
	s := m.streams[Key{bucket, name}]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil, &Result{Err: fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", name)}
	}
	return s, nil
}

// applyColdFlush indexes the stream's hot range the leader flushed and
// drops it from memory. Anything that does not match this replica's state
// exactly (a stale or repeated flush, a seal over other entries) is
// refused as a whole; the objects it names become orphans for the sweep.
func (m *Machine) applyColdFlush(now int64, c *storagev1.ColdFlush) *Result {
	s, bad := m.coldStream(c.GetBucket(), c.GetStream(), c.GetIncarnation())
	if bad != nil {
		return bad
	}
	chunks := c.GetChunks()
	if len(chunks) == 0 {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold flush names no chunk")}
	}
	pos := s.meta.GetColdEnd()
	for _, ch := range chunks {
		if ch.GetStart() != pos || ch.GetEnd() <= ch.GetStart() || ch.GetEnd() > s.buf.End() || ch.GetLevel() != 0 {
			return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold flush [%d, %d) does not continue the cold range at %d", ch.GetStart(), ch.GetEnd(), pos)}
		}
		hs, he, tag, hole := s.buf.Hole(ch.GetStart())
		switch ch.GetKind() {
		case storagev1.ColdKind_COLD_KIND_EXTERNAL:
			ref, _ := tag.(*storagev1.ColdRef)
			if !hole || hs != ch.GetStart() || he != ch.GetEnd() || ref.GetKey() != ch.GetKey() {
				return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold flush indexes an external payload at %d that is not in the hot window", ch.GetStart())}
			}
		case storagev1.ColdKind_COLD_KIND_CHUNK:
			if hole || s.buf.NextHole(ch.GetStart(), ch.GetEnd()) != ch.GetEnd() {
				return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold chunk [%d, %d) overlaps an external payload", ch.GetStart(), ch.GetEnd())}
			}
		default:
			return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold flush entry of kind %v", ch.GetKind())}
		}
		pos = ch.GetEnd()
	}
	hotRecord, rerr := s.flushRecords(chunks)
	if rerr != nil {
		return &Result{Err: rerr}
	}
	levels := s.coldLevels()
	if len(levels) == 0 {
		levels = append(levels, &storagev1.ColdLevel{})
	}
	levels[0].Entries = append(levels[0].Entries, chunks...)
	levels, err := seal(levels, c.GetSeals())
	if err != nil {
		return &Result{Err: err}
	}
	s.setColdLevels(levels)
	before := coldBytes(&s.meta)
	s.meta.ColdEnd = pos
	m.coldSize.Add(coldBytes(&s.meta) - before)
	s.meta.HotRecord = hotRecord
	m.addHot(-int64(s.buf.TrimTo(pos)))
	m.unmarkHot(s)
	s.trimMarks()
	i := sort.Search(len(s.records), func(i int) bool { return s.records[i] > pos })
	s.records = append([]uint64(nil), s.records[i:]...)
	if s.buf.Len() == 0 {
		s.meta.HotSinceMs = 0
	}
	if s.meta.GetRetained() > s.meta.GetBase() {
		m.retire(now, s, c.GetGraceMs())
	}
	return &Result{Meta: s.metaView()}
}

// seal applies the leader's seals to levels, checking each against the
// entries it replaces.
func seal(levels []*storagev1.ColdLevel, seals []*storagev1.ColdSeal) ([]*storagev1.ColdLevel, *fault.Error) {
	for _, sl := range seals {
		k, n := int(sl.GetLevel()), int(sl.GetCount())
		if k >= len(levels) || n == 0 || n > len(levels[k].GetEntries()) {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "cold seal of %d entries at level %d does not match the index", n, k)
		}
		run := levels[k].Entries[:n]
		body, digest := coldfmt.EncodePage(run)
		if digest != sl.GetDigest() || uint64(len(body)) != sl.GetSize() {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "cold seal at level %d does not match this replica's entries", k)
		}
		page := &storagev1.ColdRef{
			Start: run[0].GetStart(), End: run[n-1].GetEnd(), Key: sl.GetKey(),
			Kind: storagev1.ColdKind_COLD_KIND_PAGE, Size: sl.GetSize(), Records: uint32(n), Level: uint32(k + 1),
			Crc32C: digest,
		}
		pageRecords(page, run)
		levels[k].Entries = append([]*storagev1.ColdRef(nil), levels[k].Entries[n:]...)
		if k+1 == len(levels) {
			levels = append(levels, &storagev1.ColdLevel{})
		}
		levels[k+1].Entries = append(levels[k+1].Entries, page)
	}
	return levels, nil
}

func (m *Machine) applySetRetention(c *storagev1.SetRetention) *Result {
	s, bad := m.coldStream(c.GetBucket(), c.GetStream(), c.GetIncarnation())
	if bad != nil {
		return bad
	}
	if c.GetPosition() > s.buf.End() {
		return &Result{Err: fault.Errorf(fault.ErrOffsetOutOfRange, "retention offset %s is beyond the tail %s", FormatOffset(c.GetPosition()), FormatOffset(s.buf.End()))}
	}
	if c.GetPosition() > s.meta.GetRetained() {
		before := coldBytes(&s.meta)
		s.meta.Retained = c.GetPosition()
		m.coldSize.Add(coldBytes(&s.meta) - before)
		s.meta.RecordFirst = max(s.meta.GetRecordFirst(), min(c.GetRecordFirst(), s.meta.GetRecordNext()))
		s.signal.Notify()
	}
	return &Result{Meta: s.metaView()}
}

func (m *Machine) applyColdRetire(now int64, c *storagev1.ColdRetire) *Result {
	s, bad := m.coldStream(c.GetBucket(), c.GetStream(), c.GetIncarnation())
	if bad != nil {
		return bad
	}
	m.retire(now, s, c.GetGraceMs())
	return &Result{Meta: s.metaView()}
}

// retire drops the index entries wholly below the stream's retention,
// oldest level first, and queues their objects for GC after grace. A page
// that straddles the retention stays whole.
func (m *Machine) retire(now int64, s *stream, graceMs int64) {
	levels := s.coldLevels()
	ret := s.meta.GetRetained()
	defer func() { s.setColdLevels(levels) }()
	for k := len(levels) - 1; k >= 0; k-- {
		es := levels[k].GetEntries()
		n := 0
		for n < len(es) && es[n].GetEnd() <= ret {
			kind := storagev1.GCKind_GC_KIND_OBJECT
			if es[n].GetKind() == storagev1.ColdKind_COLD_KIND_PAGE {
				kind = storagev1.GCKind_GC_KIND_PAGE
			}
			m.enqueueGCRef(s.meta.GetBucket(), kind, es[n], now+graceMs)
			n++
		}
		if n > 0 {
			levels[k].Entries = append([]*storagev1.ColdRef(nil), es[n:]...)
		}
		if n < len(es) {
			return
		}
	}
}

// applyColdSwap replaces a run of adjacent level-0 entries by one
// compacted chunk covering exactly the same range.
func (m *Machine) applyColdSwap(now int64, c *storagev1.ColdSwap) *Result {
	s, bad := m.coldStream(c.GetBucket(), c.GetStream(), c.GetIncarnation())
	if bad != nil {
		return bad
	}
	old := c.GetReplaced()
	ch := c.GetChunk()
	levels := s.coldLevels()
	if len(old) < 2 || len(levels) == 0 || ch.GetStart() != old[0].GetStart() || ch.GetEnd() != old[len(old)-1].GetEnd() ||
		ch.GetKind() != storagev1.ColdKind_COLD_KIND_CHUNK || ch.GetLevel() != 0 {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold swap does not replace a run of chunks by one chunk over the same range")}
	}
	es := levels[0].GetEntries()
	i := sort.Search(len(es), func(i int) bool { return es[i].GetStart() >= old[0].GetStart() })
	if i+len(old) > len(es) {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold swap: the replaced chunks are no longer in the index")}
	}
	for j, o := range old {
		e := es[i+j]
		if e.GetKey() != o.GetKey() || e.GetStart() != o.GetStart() || e.GetEnd() != o.GetEnd() {
			return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "cold swap: the replaced chunks are no longer in the index")}
		}
	}
	next := make([]*storagev1.ColdRef, 0, len(es)-len(old)+1)
	next = append(next, es[:i]...)
	next = append(next, swapRecords(ch, es[i:i+len(old)]))
	next = append(next, es[i+len(old):]...)
	levels[0].Entries = next
	s.setColdLevels(levels)
	for _, o := range old {
		m.enqueueGC(s.meta.GetBucket(), storagev1.GCKind_GC_KIND_OBJECT, o.GetKey(), now+c.GetGraceMs())
	}
	return &Result{Meta: s.metaView()}
}

func (m *Machine) applyGCAck(c *storagev1.GCAck) *Result {
	done := make(map[uint64]bool, len(c.GetSeqs()))
	for _, q := range c.GetSeqs() {
		done[q] = true
	}
	kept := m.gc[:0]
	for _, e := range m.gc {
		if done[e.GetSeq()] {
			m.gcReclaimed[e.GetBucket()]++
			continue
		}
		kept = append(kept, e)
	}
	clear(m.gc[len(kept):])
	m.gc = kept
	return &Result{}
}

// applyPurgeBucket erases a bucket in this group: every stream of it goes
// (forks and references notwithstanding), its objects are queued for GC,
// and the bucket is fenced for good.
func (m *Machine) applyPurgeBucket(now int64, c *storagev1.PurgeBucket) *Result {
	b := c.GetBucket()
	m.fenced[b] = struct{}{}
	delete(m.buckets, b)
	delete(m.bucketCreated, b) // usage counters stay
	delete(m.bucketGen, b)
	delete(m.bucketFences, b) // the purge fence refuses every create
	var keys []Key
	for k := range m.streams {
		if k.Bucket == b {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Stream < keys[j].Stream })
	for _, k := range keys {
		m.drop(now, k, m.streams[k]) // fork links into a purged bucket are not released: the bucket is gone
	}
	r := &Result{Removed: uint64(len(keys)), GCReclaimed: m.gcReclaimed[b]}
	for _, e := range m.gc {
		if e.GetBucket() == b {
			r.GCPending++
		}
	}
	return r
}

// ---- queries for the engine's flusher, reader and GC worker ----

// Fenced reports whether a bucket was purged.
func (m *Machine) Fenced(bucket string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.fenced[bucket]
	return ok
}

// HotStream describes one stream with bytes in its hot window.
type HotStream struct {
	Key         Key
	Incarnation uint64
	ColdEnd     uint64
	Tail        uint64
	HotBytes    uint64
	HotSinceMs  int64
}

// HotStreams appends to dst[:0] the streams holding hot positions (bytes
// or external payloads not yet indexed). The flusher asks ten times a
// second per group and passes the slice it got last time: at 100k streams
// written round-robin a fresh list each time was a quarter of the node's
// allocated bytes, and the collections it caused scanned every stream.
func (m *Machine) HotStreams(dst []HotStream) []HotStream {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := dst[:0]
	for s := range m.hot {
		k := Key{s.meta.GetBucket(), s.meta.GetStream()}
		out = append(out, HotStream{Key: k, Incarnation: s.meta.GetIncarnation(), ColdEnd: s.meta.GetColdEnd(),
			Tail: s.buf.End(), HotBytes: s.buf.Bytes(), HotSinceMs: s.meta.GetHotSinceMs()})
	}
	return out
}

// FlushPiece is one piece of a flush: hot bytes (as immutable segments of
// the hot window; record ends absolute) or an external payload already in
// the hot window.
type FlushPiece struct {
	Start, End uint64
	Data       [][]byte
	Records    []uint64
	External   *storagev1.ColdRef
	// FirstRecord/NextRecord: the piece's JSON record range.
	FirstRecord, NextRecord uint64
}

// FlushPlan returns the oldest part of a stream's hot window: pieces cut on
// append boundaries, holding at most about maxBytes of hot bytes in all
// (external payloads do not count), the stream's cold index (copied), and
// ok false when the stream is gone.
func (m *Machine) FlushPlan(key Key, inc uint64, maxBytes uint64) (pieces []FlushPiece, levels []*storagev1.ColdLevel, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil, nil, false
	}
	pos, end := s.buf.Base(), s.buf.End()
	ri := 0
	var total uint64
	rec := s.meta.GetHotRecord()
	for pos < end && total < maxBytes {
		if hs, he, tag, hole := s.buf.Hole(pos); hole && hs == pos {
			ref := tag.(*storagev1.ColdRef)
			pieces = append(pieces, FlushPiece{Start: hs, End: he, External: ref, FirstRecord: ref.GetFirstRecord(), NextRecord: ref.GetNextRecord()})
			rec = ref.GetNextRecord()
			pos = he
			continue
		}
		stop := s.buf.NextHole(pos, end)
		// Cut at the last record end within the budget (records are
		// append boundaries; a hot range always ends on one).
		cut, budget := stop, maxBytes-total
		if stop-pos > budget {
			j := sort.Search(len(s.records), func(i int) bool { return s.records[i] > pos+budget })
			if j > 0 && s.records[j-1] > pos {
				cut = s.records[j-1]
			} else if j < len(s.records) {
				cut = min(s.records[j], stop) // one append larger than the budget
			}
		}
		for ri < len(s.records) && s.records[ri] <= pos {
			ri++
		}
		var recs []uint64
		for ri < len(s.records) && s.records[ri] <= cut {
			recs = append(recs, s.records[ri])
			ri++
		}
		p := FlushPiece{Start: pos, End: cut, Data: s.buf.Segments(pos, cut), Records: recs, FirstRecord: rec, NextRecord: rec}
		if s.meta.GetJson() {
			for _, seg := range p.Data {
				p.NextRecord += countRecords(seg)
			}
		}
		rec = p.NextRecord
		pieces = append(pieces, p)
		total += cut - pos
		pos = cut
	}
	return pieces, s.coldLevels(), true
}

// ColdRefAt returns the cold reference covering pos (an index entry, or an
// external payload in the hot window); nil when pos is hot bytes or not
// covered.
func (m *Machine) ColdRefAt(key Key, inc uint64, pos uint64) *storagev1.ColdRef {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil
	}
	if pos < s.buf.Base() {
		return s.coldRef(pos)
	}
	if _, _, tag, ok := s.buf.Hole(pos); ok {
		return tag.(*storagev1.ColdRef)
	}
	return nil
}

// ColdLevels returns a copy of a stream's cold index.
func (m *Machine) ColdLevels(key Key, inc uint64) ([]*storagev1.ColdLevel, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil, false
	}
	return s.coldLevels(), true
}

// GCQueue returns up to limit entries of the cold-GC queue (copies), and
// its length.
func (m *Machine) GCQueue(limit int) ([]*storagev1.GCEntry, int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := min(limit, len(m.gc))
	out := make([]*storagev1.GCEntry, n)
	for i := range out {
		out[i] = proto.CloneOf(m.gc[i])
	}
	return out, len(m.gc)
}

// GCPending counts queued GC entries of a bucket ("" for all).
func (m *Machine) GCPending(bucket string) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var n uint64
	for _, e := range m.gc {
		if bucket == "" || e.GetBucket() == bucket {
			n++
		}
	}
	return n
}

// ColdLevel0 is a copy of one stream's newest cold-index level.
type ColdLevel0 struct {
	Incarnation uint64
	Entries     []*storagev1.ColdRef
}

// StreamsWithColdIndex lists streams whose level-0 index holds at least
// minEntries entries (compaction candidates) with a copy of that level.
func (m *Machine) StreamsWithColdIndex(minEntries int) map[Key]ColdLevel0 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[Key]ColdLevel0{}
	for k, s := range m.streams {
		if len(s.cold.enc) == 0 || s.cold.level0 < minEntries {
			continue
		}
		out[k] = ColdLevel0{s.meta.GetIncarnation(), s.coldLevels()[0].GetEntries()}
	}
	return out
}

// LivePrefixes returns every cold prefix that may hold objects a stream of
// the group references (for the orphan sweep): each stream's current
// incarnation's, and its earlier incarnations' from before a new history,
// whose objects stay in its index.
func (m *Machine) LivePrefixes() map[string]Key {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[string]Key, len(m.streams))
	for k, s := range m.streams {
		out[coldfmt.StreamPrefix(k.Bucket, k.Stream, s.meta.GetIncarnation())] = k
		for _, e := range s.meta.GetEarlier() {
			out[coldfmt.StreamPrefix(k.Bucket, k.Stream, e.GetIncarnation())] = k
		}
	}
	return out
}

// CurrentPrefixes returns the cold prefix of every stream's current
// incarnation, where new objects of the stream go.
func (m *Machine) CurrentPrefixes() map[string]Key {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[string]Key, len(m.streams))
	for k, s := range m.streams {
		out[coldfmt.StreamPrefix(k.Bucket, k.Stream, s.meta.GetIncarnation())] = k
	}
	return out
}

// CurrentPrefix is CurrentPrefixes for one stream: the prefix of its
// current incarnation, if the group holds it.
func (m *Machine) CurrentPrefix(k Key) (string, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[k]
	if s == nil {
		return "", false
	}
	return coldfmt.StreamPrefix(k.Bucket, k.Stream, s.meta.GetIncarnation()), true
}

// HotExternalKeys returns the keys of external payloads in a stream's hot
// window (referenced, but not yet in the index).
func (m *Machine) HotExternalKeys(key Key, inc uint64) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil
	}
	var keys []string
	s.buf.Holes(func(_, _ uint64, tag any) { keys = append(keys, tag.(*storagev1.ColdRef).GetKey()) })
	return keys
}
