package tier

import (
	"bytes"
	"context"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// LeafByRecord descends from ref (a page, chunk or external payload whose
// record range holds JSON record n) to the chunk or external payload
// holding it.
func (r *Reader) LeafByRecord(ctx context.Context, ref *storagev1.ColdRef, n uint64) (*storagev1.ColdRef, error) {
	return r.descend(ctx, ref, func(entries []*storagev1.ColdRef) *storagev1.ColdRef {
		for _, e := range entries {
			if e.GetFirstRecord() <= n && n < e.GetNextRecord() {
				return e
			}
		}
		return nil
	}, fmt.Sprintf("record %d", n))
}

// RecordPos returns the position where JSON record n starts inside leaf
// (a chunk or external payload whose record range holds n).
func (r *Reader) RecordPos(ctx context.Context, leaf *storagev1.ColdRef, n uint64) (uint64, error) {
	if n < leaf.GetFirstRecord() || n >= leaf.GetNextRecord() {
		return 0, fmt.Errorf("tier: record %d outside object %q [%d, %d)", n, leaf.GetKey(), leaf.GetFirstRecord(), leaf.GetNextRecord())
	}
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return 0, err
	}
	data, err := lv.read(ctx, leaf.GetStart(), leaf.GetEnd())
	if err != nil {
		return 0, err
	}
	p := 0
	for k := leaf.GetFirstRecord(); k < n; k++ {
		j := bytes.IndexByte(data[p:], '\n')
		if j < 0 {
			return 0, fmt.Errorf("tier: object %q holds fewer records than its index entry says", leaf.GetKey())
		}
		p += j + 1
	}
	return leaf.GetStart() + uint64(p), nil
}

// RecordAt returns the JSON record ordinal at position pos inside leaf:
// the leaf's first record plus the messages before pos.
func (r *Reader) RecordAt(ctx context.Context, leaf *storagev1.ColdRef, pos uint64) (uint64, error) {
	if pos < leaf.GetStart() || pos > leaf.GetEnd() {
		return 0, fmt.Errorf("tier: position %d outside object %q [%d, %d)", pos, leaf.GetKey(), leaf.GetStart(), leaf.GetEnd())
	}
	if pos == leaf.GetStart() {
		return leaf.GetFirstRecord(), nil
	}
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return 0, err
	}
	data, err := lv.read(ctx, leaf.GetStart(), pos)
	if err != nil {
		return 0, err
	}
	return leaf.GetFirstRecord() + uint64(bytes.Count(data, []byte{'\n'})), nil
}
