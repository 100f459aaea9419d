package stream

import (
	"strconv"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// Attrs are a stream's attributes: a title and a JSON object of metadata
// (compact JSON bytes). An empty title or metadata is absent.
type Attrs struct {
	Title    string
	Metadata []byte
}

// applySetAttrs replaces a stream's attributes (an empty command clears
// them). Closed streams accept it; offsets and tails do not change.
func (m *Machine) applySetAttrs(c *storagev1.SetAttrs) *Result {
	key := Key{c.GetBucket(), c.GetStream()}
	s := m.streams[key]
	if s == nil {
		return &Result{Err: fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", key.Stream)}
	}
	if inc := c.GetIncarnation(); inc != 0 && inc != s.meta.GetIncarnation() {
		return &Result{Err: fault.Errorf(fault.ErrIncarnationMismatch, "stream %s was recreated", key.Stream).
			With(fault.DetailIncarnation, strconv.FormatUint(s.meta.GetIncarnation(), 10))}
	}
	if s.meta.GetSoftDeleted() {
		return &Result{Err: fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", key.Stream)}
	}
	st := &s.meta
	title, md := c.GetTitle(), append([]byte(nil), c.GetMetadata()...)
	if len(md) == 0 {
		md = nil
	}
	if st.rare != nil || title != "" || md != nil {
		x := st.r()
		x.AttrsTitle, x.AttrsMetadata = title, md
	}
	st.HasAttrs = title != "" || md != nil
	return &Result{Meta: s.metaView()}
}

// Attrs returns a stream's attributes; set is false when it has none.
// ok is false when the stream (of that incarnation, unless inc is 0) does
// not exist.
func (m *Machine) Attrs(key Key, inc uint64) (a Attrs, set, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || (inc != 0 && s.meta.GetIncarnation() != inc) {
		return Attrs{}, false, false
	}
	if !s.meta.GetHasAttrs() {
		return Attrs{}, false, true
	}
	return Attrs{Title: s.meta.GetAttrsTitle(), Metadata: append([]byte(nil), s.meta.GetAttrsMetadata()...)}, true, true
}
