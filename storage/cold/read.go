package cold

import (
	"context"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/tier"
)

// Read reads bytes of a stream from a cold reference covering from, cut
// like a hot read (record ends, whole JSON messages, whole runes).
func (t *Tier) Read(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, from, to, limit uint64) ([]byte, uint64, error) {
	if t.store == nil {
		return nil, from, fault.Errorf(fault.ErrInternal, "stream %s has cold bytes but no cold store is configured", m.Key.Stream)
	}
	if ref == nil {
		if from < m.Retained {
			return nil, from, stream.Trimmed(m, from)
		}
		return nil, from, fault.Errorf(fault.ErrInternal, "stream %s: no cold index entry covers position %d", m.Key.Stream, from)
	}
	r := t.reader
	leaf, err := r.Leaf(ctx, ref, from)
	if err == nil {
		var data []byte
		var end uint64
		data, end, err = r.Read(ctx, leaf, from, to, limit, tier.Unit{JSON: m.JSON, Text: stream.IsText(m.ContentType)})
		if err == nil {
			return data, end, nil
		}
	}
	if ctx.Err() != nil {
		return nil, from, ctx.Err()
	}
	t.stats.ReadErrors.Add(1)
	return nil, from, fault.Errorf(fault.ErrColdStoreFailed, "read cold bytes of stream %s at %d: %v", m.Key.Stream, from, err)
}

// UnitEnd resolves a fork sub-offset whose append lies in the cold range.
func (t *Tier) UnitEnd(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, pos, n, clip uint64) (uint64, bool, error) {
	if t.store == nil || ref == nil {
		return 0, false, nil
	}
	leaf, err := t.reader.Leaf(ctx, ref, pos)
	if err != nil {
		return 0, false, fault.Errorf(fault.ErrColdStoreFailed, "read the cold index of %s: %v", m.Key.Stream, err)
	}
	end, ok, err := t.reader.UnitEnd(ctx, leaf, pos, n, clip, m.JSON)
	if err != nil {
		return 0, false, fault.Errorf(fault.ErrColdStoreFailed, "read cold bytes of %s: %v", m.Key.Stream, err)
	}
	return end, ok, nil
}

// Boundary reports whether pos, at or inside the cold range (ref covers
// pos-1), is a unit boundary of m: a record end or (JSON) a message end.
func (t *Tier) Boundary(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, pos uint64) (bool, error) {
	if t.store == nil {
		return false, fault.Errorf(fault.ErrInternal, "stream %s has cold bytes but no cold store is configured", m.Key.Stream)
	}
	leaf, err := t.reader.Leaf(ctx, ref, pos-1)
	ok := false
	if err == nil {
		ok, err = t.reader.Boundary(ctx, leaf, pos, m.JSON)
	}
	if err != nil {
		return false, fault.Errorf(fault.ErrColdStoreFailed, "read cold bytes of %s at %d: %v", m.Key.Stream, pos, err)
	}
	return ok, nil
}

// RecordPos returns the position where JSON record n of m starts, in the
// cold object ref leads to.
func (t *Tier) RecordPos(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, n uint64) (uint64, error) {
	if t.store == nil {
		return 0, fault.Errorf(fault.ErrInternal, "stream %s has cold records but no cold store is configured", m.Key.Stream)
	}
	leaf, err := t.reader.LeafByRecord(ctx, ref, n)
	var pos uint64
	if err == nil {
		pos, err = t.reader.RecordPos(ctx, leaf, n)
	}
	if err != nil {
		return 0, t.recordErr(ctx, m, err)
	}
	return pos, nil
}

// RecordAt returns the JSON record ordinal at message boundary pos of m,
// in the cold object ref leads to.
func (t *Tier) RecordAt(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, pos uint64) (uint64, error) {
	if t.store == nil {
		return 0, fault.Errorf(fault.ErrInternal, "stream %s has cold records but no cold store is configured", m.Key.Stream)
	}
	leaf, err := t.reader.Leaf(ctx, ref, pos)
	var rec uint64
	if err == nil {
		rec, err = t.reader.RecordAt(ctx, leaf, pos)
	}
	if err != nil {
		return 0, t.recordErr(ctx, m, err)
	}
	return rec, nil
}

func (t *Tier) recordErr(ctx context.Context, m stream.Meta, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	t.stats.ReadErrors.Add(1)
	return fault.Errorf(fault.ErrColdStoreFailed, "locate a record of stream %s: %v", m.Key.Stream, err)
}
