package stream

import (
	"math"
	"math/bits"
	"strconv"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// The reasons a group starts a new history (StartHistory.reason).
const (
	// HistoryAcceptLoss: an operator's recovery plan accepted that writes
	// acknowledged after the surviving replicas' last fsync may be gone.
	HistoryAcceptLoss = "accept-unsynced-loss"
	// HistoryRestore: the group was imported from a backup.
	HistoryRestore = "restore"
)

// HistoryInfo is a group's latest history event (HistoryRecord).
type HistoryInfo struct {
	// EventIndex is the log index the event applied at.
	EventIndex uint64
	PlanTerm   uint64
	Point      uint64
	Reason     string
	// AtMs is the proposing leader's clock.
	AtMs int64
	// Streams counts the streams that took a new incarnation.
	Streams uint64
	// Previous is the event before this one (its own Previous is nil).
	Previous *HistoryInfo
}

func historyInfo(h *storagev1.HistoryRecord) HistoryInfo {
	out := HistoryInfo{EventIndex: h.GetEventIndex(), PlanTerm: h.GetPlanTerm(), Point: h.GetPoint(),
		Reason: h.GetReason(), AtMs: h.GetAtMs(), Streams: h.GetStreams()}
	if p := h.GetPrevious(); p != nil {
		prev := historyInfo(p)
		out.Previous = &prev
	}
	return out
}

// History returns the group's latest history event; ok is false when the
// group never started a new history.
func (m *Machine) History() (HistoryInfo, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.history == nil {
		return HistoryInfo{}, false
	}
	return historyInfo(m.history), true
}

// applyStartHistory starts a new history of the group (see the package
// doc, "New history"). The new incarnation comes from the entry's index
// (plus the group's incarnation offset), the same on every replica; it is
// above every incarnation the group
// issued before, so it is a token no client of this state holds, and a
// cold prefix no object of the stream's earlier incarnations uses.
func (m *Machine) applyStartHistory(index uint64, now int64, c *storagev1.StartHistory) *Result {
	if h := m.history; h != nil {
		switch {
		case c.GetPlanTerm() == h.GetPlanTerm():
			// A repeat (the plan's leader retried, or a restore ran
			// again): the history it asks for is the one that started.
			return &Result{EventIndex: h.GetEventIndex()}
		case c.GetPlanTerm() < h.GetPlanTerm():
			return &Result{Err: fault.Errorf(fault.ErrInvalidArgument,
				"plan term %d is below the term %d of the group's current history", c.GetPlanTerm(), h.GetPlanTerm())}
		}
	}
	m.startHistory(index, now, c.GetPlanTerm(), c.GetPoint(), c.GetReason(), m.history)
	return &Result{EventIndex: index, Streams: m.history.GetStreams()}
}

// startHistory starts a new history of the group at index: every stream
// that is not soft-deleted takes a new incarnation, and the group records
// the event, prev as the one before it. Callers hold m.mu.
func (m *Machine) startHistory(index uint64, now int64, planTerm, point uint64, reason string, prev *storagev1.HistoryRecord) {
	inc := m.newIncarnation(index)
	var n uint64
	for _, s := range m.streams {
		// A soft-deleted stream answers no client (410) and keeps its
		// incarnation for the forks that still read it. Each stream
		// changes on its own, so the map's order does not matter.
		if !s.meta.GetSoftDeleted() {
			s.startHistory(inc)
			n++
		}
	}
	rec := &storagev1.HistoryRecord{EventIndex: index, PlanTerm: planTerm, Point: point, Reason: reason, AtMs: now, Streams: n}
	if prev != nil {
		rec.Previous = &storagev1.HistoryRecord{EventIndex: prev.GetEventIndex(), PlanTerm: prev.GetPlanTerm(), Point: prev.GetPoint(),
			Reason: prev.GetReason(), AtMs: prev.GetAtMs(), Streams: prev.GetStreams()}
	}
	m.history = rec
}

// newIncarnation is the incarnation a stream created (or given a new
// history) by the entry at index takes: the index, raised by the group's
// incarnation offset after an import so that it is above every
// incarnation the imported group issued. Saturating: an offset near the
// top (refused by imports) must not wrap to a token in use.
func (m *Machine) newIncarnation(index uint64) uint64 {
	inc, carry := bits.Add64(index, m.incarnationOffset, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return inc
}

// startHistory gives the stream a new incarnation, inc (the event's; or
// the stream's incarnation plus one, should an imported state hold a
// larger one).
func (s *stream) startHistory(inc uint64) {
	st := &s.meta
	old, tail := st.GetIncarnation(), s.buf.End()
	if s.namedElsewhere() {
		st.r().Earlier = append(st.GetEarlier(), &storagev1.EarlierIncarnation{Incarnation: old, Kept: tail})
	}
	// A stream not written since its previous history event keeps naming
	// the token from before that event: a client holding it still holds
	// every byte below the same tail, and one holding the token in between
	// could only have read those same bytes.
	if st.GetPreviousIncarnation() == 0 || st.GetInheritedOffset() != tail {
		st.r().PreviousIncarnation = old
	}
	st.r().InheritedOffset = tail
	st.Incarnation = max(inc, old+1)
	s.producers.each(func(p *storagev1.ProducerState) { p.EpochClosed = true })
	s.signal.Notify() // waiters on the old incarnation look again
}

// namedElsewhere reports whether something outside the stream's state may
// name its current incarnation: objects under its cold prefix that the
// stream references (index entries, external payloads, its application
// snapshot), or forks, whose origins carry the incarnation.
func (s *stream) namedElsewhere() bool {
	st := &s.meta
	for _, lv := range s.coldLevels() {
		if len(lv.GetEntries()) > 0 {
			return true
		}
	}
	holes := false
	s.buf.Holes(func(_, _ uint64, _ any) { holes = true })
	snap := st.GetSnapshot()
	return holes || snap.GetKey() != "" || len(snap.GetPartKeys()) > 0 || st.GetForkRefs() > 0
}

// closedEpoch answers a new write of a producer in an epoch a history
// event closed: 403 with the epoch and the last seq the new history kept.
func closedEpoch(cur *storagev1.ProducerState) *fault.Error {
	return fault.Errorf(fault.ErrProducerStaleEpoch, "producer epoch %d was closed by a new history of the stream; claim a higher epoch", cur.GetEpoch()).
		With(fault.DetailProducerEpoch, strconv.FormatUint(cur.GetEpoch(), 10)).
		With(fault.DetailProducerSeq, strconv.FormatUint(cur.GetSeq(), 10)).
		With(fault.DetailProducerOutcome, fault.ProducerOutcomeClosedByHistory)
}

// namesIncarnation reports whether inc is the stream's incarnation or one
// of its earlier ones.
func (s *stream) namesIncarnation(inc uint64) bool {
	if s.meta.GetIncarnation() == inc {
		return true
	}
	for _, e := range s.meta.GetEarlier() {
		if e.GetIncarnation() == inc {
			return true
		}
	}
	return false
}

// HoldsHistory reports whether m, a fork's source, holds the history a
// fork of its incarnation inc inherited below need: inc is m's
// incarnation, or an earlier one of it whose bytes below need every later
// incarnation kept. A source whose group started a new history without
// those bytes (they were lost) does not; neither does another stream of
// the same name.
func (m Meta) HoldsHistory(inc, need uint64) bool {
	if m.Incarnation == inc {
		return true
	}
	for _, e := range m.Earlier {
		if e.GetIncarnation() == inc {
			return need <= e.GetKept()
		}
	}
	return false
}

// LostHistory reports whether m is a later incarnation of a fork source
// of incarnation inc that no longer holds the bytes below need: a new
// history of its group started without them.
func (m Meta) LostHistory(inc, need uint64) bool {
	for _, e := range m.Earlier {
		if e.GetIncarnation() == inc {
			return need > e.GetKept()
		}
	}
	return false
}
