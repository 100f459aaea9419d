package tier

import (
	"bytes"
	"context"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/stream"
)

// LeafByRecord descends from ref (a page, chunk or external payload whose
// record range holds JSON record n) to the chunk or external payload
// holding it.
func (r *Reader) LeafByRecord(ctx context.Context, ref *storagev1.ColdRef, n uint64) (*storagev1.ColdRef, error) {
	for depth := 0; ref.GetKind() == storagev1.ColdKind_COLD_KIND_PAGE; depth++ {
		if depth > 64 {
			return nil, fmt.Errorf("tier: cold index deeper than 64 levels at %q", ref.GetKey())
		}
		body, err := r.cache.ReadAt(ctx, ref.GetKey(), int64(ref.GetSize()), 0, int64(ref.GetSize()))
		if err != nil {
			return nil, err
		}
		entries, err := stream.DecodePage(body)
		if err != nil {
			return nil, fmt.Errorf("tier: page %q: %w", ref.GetKey(), err)
		}
		var next *storagev1.ColdRef
		for _, e := range entries {
			if e.GetFirstRecord() <= n && n < e.GetNextRecord() {
				next = e
				break
			}
		}
		if next == nil {
			return nil, fmt.Errorf("tier: page %q does not hold record %d", ref.GetKey(), n)
		}
		ref = next
	}
	return ref, nil
}

// RecordPos returns the position where JSON record n starts inside leaf
// (a chunk or external payload whose record range holds n).
func (r *Reader) RecordPos(ctx context.Context, leaf *storagev1.ColdRef, n uint64) (uint64, error) {
	if n < leaf.GetFirstRecord() || n >= leaf.GetNextRecord() {
		return 0, fmt.Errorf("tier: record %d outside object %q [%d, %d)", n, leaf.GetKey(), leaf.GetFirstRecord(), leaf.GetNextRecord())
	}
	data, err := r.cache.ReadAt(ctx, leaf.GetKey(), int64(leaf.GetSize()), 0, int64(leaf.GetEnd()-leaf.GetStart()))
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
	data, err := r.cache.ReadAt(ctx, leaf.GetKey(), int64(leaf.GetSize()), 0, int64(pos-leaf.GetStart()))
	if err != nil {
		return 0, err
	}
	return leaf.GetFirstRecord() + uint64(bytes.Count(data, []byte{'\n'})), nil
}
