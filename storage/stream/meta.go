package stream

import (
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// streamMeta is a stream's metadata as the machine holds it: the fields of
// storagev1.StreamState, under the same names and with the same getters,
// less the parts the stream keeps elsewhere (its bytes, records, cold
// index, hot externals and producers).
//
// It is not the generated message because a node may hold a million of
// them. The message is 496 bytes of fields, most of them pointers or
// slices the collector scans, for every stream: at a million idle streams
// it was the largest object per stream and marking such objects took
// about half the node's CPU under load. This struct keeps what most
// streams use in 192 bytes, its pointers first, and moves what few use (a
// fork, an application snapshot, attributes, history, Stream-Seq, an
// Expires-At text) behind one pointer, nil until one of them is set. The
// stream holds it by value, so that a stream and its metadata are one
// object.
//
// fillProto and metaFromProto convert at the edges (snapshot capture and
// restore); TestStreamMetaCarriesEveryField fails when the message gains a
// field this struct does not carry.
type streamMeta struct {
	Bucket      string
	Stream      string
	ContentType string
	ClosedBy    *storagev1.ProducerRef
	rare        *metaRare

	Incarnation uint64
	TtlSeconds  uint64
	ExpiresAtMs int64
	CreatedMs   int64
	TouchedMs   int64
	LastWriteMs int64
	ForkRefs    uint64
	Base        uint64
	ColdEnd     uint64
	Retained    uint64
	HotSinceMs  int64
	RecordFirst uint64
	RecordNext  uint64
	HotRecord   uint64
	BaseRecord  uint64
	Json        bool
	HasTtl      bool
	Closed      bool
	SoftDeleted bool
	HasAttrs    bool
}

// metaRare holds the metadata few streams have.
type metaRare struct {
	ExpiresAt           string
	LastStreamSeq       string
	AttrsTitle          string
	AttrsMetadata       []byte
	Fork                *storagev1.ForkOrigin
	Snapshot            *storagev1.SnapshotRef
	Earlier             []*storagev1.EarlierIncarnation
	PreviousIncarnation uint64
	InheritedOffset     uint64
}

// r returns the rare fields for writing, allocating them on first use.
func (m *streamMeta) r() *metaRare {
	if m.rare == nil {
		m.rare = &metaRare{}
	}
	return m.rare
}

// noRare is what a stream without rare fields reads.
var noRare metaRare

// ro returns the rare fields for reading.
func (m *streamMeta) ro() *metaRare {
	if m == nil || m.rare == nil {
		return &noRare
	}
	return m.rare
}

// The getters mirror the generated ones, nil receiver included, so that
// code reading a stream's metadata reads like code reading the message.

func (m *streamMeta) GetBucket() string {
	if m == nil {
		return ""
	}
	return m.Bucket
}

func (m *streamMeta) GetStream() string {
	if m == nil {
		return ""
	}
	return m.Stream
}

func (m *streamMeta) GetContentType() string {
	if m == nil {
		return ""
	}
	return m.ContentType
}

func (m *streamMeta) GetClosedBy() *storagev1.ProducerRef {
	if m == nil {
		return nil
	}
	return m.ClosedBy
}

func (m *streamMeta) GetIncarnation() uint64 {
	if m == nil {
		return 0
	}
	return m.Incarnation
}

func (m *streamMeta) GetTtlSeconds() uint64 {
	if m == nil {
		return 0
	}
	return m.TtlSeconds
}

func (m *streamMeta) GetExpiresAtMs() int64 {
	if m == nil {
		return 0
	}
	return m.ExpiresAtMs
}

func (m *streamMeta) GetCreatedMs() int64 {
	if m == nil {
		return 0
	}
	return m.CreatedMs
}

func (m *streamMeta) GetTouchedMs() int64 {
	if m == nil {
		return 0
	}
	return m.TouchedMs
}

func (m *streamMeta) GetLastWriteMs() int64 {
	if m == nil {
		return 0
	}
	return m.LastWriteMs
}

func (m *streamMeta) GetForkRefs() uint64 {
	if m == nil {
		return 0
	}
	return m.ForkRefs
}

func (m *streamMeta) GetBase() uint64 {
	if m == nil {
		return 0
	}
	return m.Base
}

func (m *streamMeta) GetColdEnd() uint64 {
	if m == nil {
		return 0
	}
	return m.ColdEnd
}

func (m *streamMeta) GetRetained() uint64 {
	if m == nil {
		return 0
	}
	return m.Retained
}

func (m *streamMeta) GetHotSinceMs() int64 {
	if m == nil {
		return 0
	}
	return m.HotSinceMs
}

func (m *streamMeta) GetRecordFirst() uint64 {
	if m == nil {
		return 0
	}
	return m.RecordFirst
}

func (m *streamMeta) GetRecordNext() uint64 {
	if m == nil {
		return 0
	}
	return m.RecordNext
}

func (m *streamMeta) GetHotRecord() uint64 {
	if m == nil {
		return 0
	}
	return m.HotRecord
}

func (m *streamMeta) GetBaseRecord() uint64 {
	if m == nil {
		return 0
	}
	return m.BaseRecord
}

func (m *streamMeta) GetJson() bool        { return m != nil && m.Json }
func (m *streamMeta) GetHasTtl() bool      { return m != nil && m.HasTtl }
func (m *streamMeta) GetClosed() bool      { return m != nil && m.Closed }
func (m *streamMeta) GetSoftDeleted() bool { return m != nil && m.SoftDeleted }
func (m *streamMeta) GetHasAttrs() bool    { return m != nil && m.HasAttrs }

func (m *streamMeta) GetExpiresAt() string           { return m.ro().ExpiresAt }
func (m *streamMeta) GetLastStreamSeq() string       { return m.ro().LastStreamSeq }
func (m *streamMeta) GetAttrsTitle() string          { return m.ro().AttrsTitle }
func (m *streamMeta) GetAttrsMetadata() []byte       { return m.ro().AttrsMetadata }
func (m *streamMeta) GetFork() *storagev1.ForkOrigin { return m.ro().Fork }
func (m *streamMeta) GetSnapshot() *storagev1.SnapshotRef {
	return m.ro().Snapshot
}
func (m *streamMeta) GetEarlier() []*storagev1.EarlierIncarnation { return m.ro().Earlier }
func (m *streamMeta) GetPreviousIncarnation() uint64              { return m.ro().PreviousIncarnation }
func (m *streamMeta) GetInheritedOffset() uint64                  { return m.ro().InheritedOffset }

// fillProto sets st's metadata fields to m's, sharing its strings, slices
// and submessages (a capture reuses one message for every stream it
// encodes).
func (m *streamMeta) fillProto(st *storagev1.StreamState) {
	x := m.ro()
	st.Bucket, st.Stream, st.ContentType = m.Bucket, m.Stream, m.ContentType
	st.Incarnation, st.CreatedMs, st.TouchedMs, st.LastWriteMs = m.Incarnation, m.CreatedMs, m.TouchedMs, m.LastWriteMs
	st.Json, st.HasTtl, st.TtlSeconds = m.Json, m.HasTtl, m.TtlSeconds
	st.ExpiresAt, st.ExpiresAtMs = x.ExpiresAt, m.ExpiresAtMs
	st.Closed, st.ClosedBy, st.LastStreamSeq = m.Closed, m.ClosedBy, x.LastStreamSeq
	st.Fork, st.ForkRefs, st.SoftDeleted = x.Fork, m.ForkRefs, m.SoftDeleted
	st.Base, st.ColdEnd, st.Retained, st.HotSinceMs = m.Base, m.ColdEnd, m.Retained, m.HotSinceMs
	st.Snapshot = x.Snapshot
	st.AttrsTitle, st.AttrsMetadata, st.HasAttrs = x.AttrsTitle, x.AttrsMetadata, m.HasAttrs
	st.RecordFirst, st.RecordNext, st.HotRecord, st.BaseRecord = m.RecordFirst, m.RecordNext, m.HotRecord, m.BaseRecord
	st.PreviousIncarnation, st.InheritedOffset, st.Earlier = x.PreviousIncarnation, x.InheritedOffset, x.Earlier
}

// metaFromProto takes st's metadata fields (not its data, records, cold
// index, hot externals or producers), sharing its strings, slices and
// submessages.
func metaFromProto(st *storagev1.StreamState) streamMeta {
	m := streamMeta{
		Bucket:      st.GetBucket(),
		Stream:      st.GetStream(),
		ContentType: st.GetContentType(),
		ClosedBy:    st.GetClosedBy(),
		Incarnation: st.GetIncarnation(),
		TtlSeconds:  st.GetTtlSeconds(),
		ExpiresAtMs: st.GetExpiresAtMs(),
		CreatedMs:   st.GetCreatedMs(),
		TouchedMs:   st.GetTouchedMs(),
		LastWriteMs: st.GetLastWriteMs(),
		ForkRefs:    st.GetForkRefs(),
		Base:        st.GetBase(),
		ColdEnd:     st.GetColdEnd(),
		Retained:    st.GetRetained(),
		HotSinceMs:  st.GetHotSinceMs(),
		RecordFirst: st.GetRecordFirst(),
		RecordNext:  st.GetRecordNext(),
		HotRecord:   st.GetHotRecord(),
		BaseRecord:  st.GetBaseRecord(),
		Json:        st.GetJson(),
		HasTtl:      st.GetHasTtl(),
		Closed:      st.GetClosed(),
		SoftDeleted: st.GetSoftDeleted(),
		HasAttrs:    st.GetHasAttrs(),
	}
	x := metaRare{
		ExpiresAt:           st.GetExpiresAt(),
		LastStreamSeq:       st.GetLastStreamSeq(),
		AttrsTitle:          st.GetAttrsTitle(),
		AttrsMetadata:       st.GetAttrsMetadata(),
		Fork:                st.GetFork(),
		Snapshot:            st.GetSnapshot(),
		Earlier:             st.GetEarlier(),
		PreviousIncarnation: st.GetPreviousIncarnation(),
		InheritedOffset:     st.GetInheritedOffset(),
	}
	if x.ExpiresAt != "" || x.LastStreamSeq != "" || x.AttrsTitle != "" || x.AttrsMetadata != nil || x.Fork != nil ||
		x.Snapshot != nil || x.Earlier != nil || x.PreviousIncarnation != 0 || x.InheritedOffset != 0 {
		m.rare = &x
	}
	return m
}
