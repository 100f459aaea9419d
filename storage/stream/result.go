package stream

import (
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// EncodeResult renders a result for a node that forwarded its command.
func EncodeResult(r *Result) *storagev1.ApplyResult {
	out := &storagev1.ApplyResult{
		Created:       r.Created,
		Duplicate:     r.Duplicate,
		ProducerEpoch: r.ProducerEpoch,
		ProducerSeq:   r.ProducerSeq,
		Release:       r.Release,
		Tail:          r.Meta.Tail,
		Index:         r.Index,
		Removed:       r.Removed,
		GcPending:     r.GCPending,
		GcReclaimed:   r.GCReclaimed,
		Meta: &storagev1.StreamState{
			Bucket:      r.Meta.Key.Bucket,
			Stream:      r.Meta.Key.Stream,
			Incarnation: r.Meta.Incarnation,
			ContentType: r.Meta.ContentType,
			Json:        r.Meta.JSON,
			HasTtl:      r.Meta.HasTTL,
			TtlSeconds:  r.Meta.TTLSeconds,
			ExpiresAt:   r.Meta.ExpiresAt,
			ExpiresAtMs: r.Meta.ExpiresAtMs,
			TouchedMs:   r.Meta.ReplTouchedMs,
			Closed:      r.Meta.Closed,
			SoftDeleted: r.Meta.SoftDeleted,
			Base:        r.Meta.Base,
			ColdEnd:     r.Meta.ColdEnd,
			Retained:    r.Meta.Retained,
			Fork:        r.Meta.Fork,
			ForkRefs:    r.Meta.ForkRefs,

			PreviousIncarnation: r.Meta.PreviousIncarnation,
			InheritedOffset:     r.Meta.InheritedOffset,
		},
	}
	if r.Err != nil {
		out.ErrorCode = r.Err.Kind.Name()
		out.ErrorMessage = r.Err.Message
		out.ErrorMetadata = r.Err.Details
	}
	return out
}

// DecodeResult is the inverse of EncodeResult.
func DecodeResult(a *storagev1.ApplyResult) *Result {
	m := a.GetMeta()
	r := &Result{
		Created:       a.GetCreated(),
		Duplicate:     a.GetDuplicate(),
		ProducerEpoch: a.GetProducerEpoch(),
		ProducerSeq:   a.GetProducerSeq(),
		Release:       a.GetRelease(),
		Index:         a.GetIndex(),
		Removed:       a.GetRemoved(),
		GCPending:     a.GetGcPending(),
		GCReclaimed:   a.GetGcReclaimed(),
		Meta: Meta{
			Key:           Key{m.GetBucket(), m.GetStream()},
			Incarnation:   m.GetIncarnation(),
			ContentType:   m.GetContentType(),
			JSON:          m.GetJson(),
			HasTTL:        m.GetHasTtl(),
			TTLSeconds:    m.GetTtlSeconds(),
			ExpiresAt:     m.GetExpiresAt(),
			ExpiresAtMs:   m.GetExpiresAtMs(),
			TouchedMs:     m.GetTouchedMs(),
			ReplTouchedMs: m.GetTouchedMs(),
			Closed:        m.GetClosed(),
			SoftDeleted:   m.GetSoftDeleted(),
			Base:          m.GetBase(),
			ColdEnd:       m.GetColdEnd(),
			Retained:      m.GetRetained(),
			Tail:          a.GetTail(),
			Fork:          m.GetFork(),
			ForkRefs:      m.GetForkRefs(),

			PreviousIncarnation: m.GetPreviousIncarnation(),
			InheritedOffset:     m.GetInheritedOffset(),
		},
	}
	if name := a.GetErrorCode(); name != "" {
		k, ok := fault.ByName(name)
		if !ok {
			// A newer leader's kind: this node cannot act on it.
			k = fault.ErrInternal
		}
		r.Err = &fault.Error{Kind: k, Message: a.GetErrorMessage(), Details: a.GetErrorMetadata()}
	}
	return r
}
