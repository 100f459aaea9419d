package cold

import (
	"context"
	"errors"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/tier"
)

// readFailed turns a failed read of cold objects into the answer: the
// caller's cancellation as it is; an object whose bytes do not match their
// checksum COLD_OBJECT_CORRUPT, counted in CorruptReads and logged with
// the object and the stream (its bytes are never served: the tier does not
// return them); anything else COLD_STORE_FAILED, counted in ReadErrors.
// what says what was being read.
func (t *Tier) readFailed(ctx context.Context, k stream.Key, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if fault.KindOf(err) != nil {
		return err
	}
	if errors.Is(err, coldfmt.ErrCorrupt) {
		t.stats.CorruptReads.Add(1)
		t.logger.Error("cold object failed its checksum: refusing to serve it", "bucket", k.Bucket, "stream", k.Stream, "read", what, "err", err)
		return fault.Errorf(fault.ErrColdObjectCorrupt, "%s of stream %s: %v", what, k.Stream, err)
	}
	t.stats.ReadErrors.Add(1)
	return fault.Errorf(fault.ErrColdStoreFailed, "%s of stream %s: %v", what, k.Stream, err)
}

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
	return nil, from, t.readFailed(ctx, m.Key, fmt.Sprintf("read cold bytes at %d", from), err)
}

// UnitEnd resolves a fork sub-offset whose append lies in the cold range.
func (t *Tier) UnitEnd(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, pos, n, clip uint64) (uint64, bool, error) {
	if t.store == nil || ref == nil {
		return 0, false, nil
	}
	leaf, err := t.reader.Leaf(ctx, ref, pos)
	if err != nil {
		return 0, false, t.readFailed(ctx, m.Key, "read the cold index", err)
	}
	end, ok, err := t.reader.UnitEnd(ctx, leaf, pos, n, clip, m.JSON)
	if err != nil {
		return 0, false, t.readFailed(ctx, m.Key, fmt.Sprintf("resolve a sub-offset at %d", pos), err)
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
		return false, t.readFailed(ctx, m.Key, fmt.Sprintf("check the boundary at %d", pos), err)
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
		return 0, t.readFailed(ctx, m.Key, fmt.Sprintf("locate record %d", n), err)
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
		return 0, t.readFailed(ctx, m.Key, fmt.Sprintf("locate the record at %d", pos), err)
	}
	return rec, nil
}
