package tier

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"unicode/utf8"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
)

// Reader reads stream bytes from cold-index references.
type Reader struct {
	cache *Cache
}

// NewReader returns a reader over a cache.
func NewReader(c *Cache) *Reader { return &Reader{cache: c} }

// Cache is the reader's block cache.
func (r *Reader) Cache() *Cache { return r.cache }

// Leaf descends from ref (a page, chunk or external payload covering pos)
// to the chunk or external payload holding pos.
func (r *Reader) Leaf(ctx context.Context, ref *storagev1.ColdRef, pos uint64) (*storagev1.ColdRef, error) {
	return r.descend(ctx, ref, func(entries []*storagev1.ColdRef) *storagev1.ColdRef {
		return coldfmt.FindRef(entries, pos)
	}, fmt.Sprintf("position %d", pos))
}

// descend follows pages from ref, choosing the entry pick returns at each
// level, down to a chunk or external payload; what names the wanted
// position for errors.
func (r *Reader) descend(ctx context.Context, ref *storagev1.ColdRef, pick func([]*storagev1.ColdRef) *storagev1.ColdRef, what string) (*storagev1.ColdRef, error) {
	for depth := 0; ref.GetKind() == storagev1.ColdKind_COLD_KIND_PAGE; depth++ {
		if depth > 64 {
			return nil, fmt.Errorf("tier: cold index deeper than 64 levels at %q", ref.GetKey())
		}
		body, err := r.cache.ReadAt(ctx, ref.GetKey(), int64(ref.GetSize()), 0, int64(ref.GetSize()))
		if err != nil {
			return nil, err
		}
		entries, err := coldfmt.DecodePage(body)
		if err != nil {
			return nil, fmt.Errorf("tier: page %q: %w", ref.GetKey(), err)
		}
		next := pick(entries)
		if next == nil {
			return nil, fmt.Errorf("tier: page %q does not hold %s", ref.GetKey(), what)
		}
		ref = next
	}
	return ref, nil
}

// Unit describes how a stream's reads may be cut.
type Unit struct {
	JSON bool // cut after a '\n' (one message per line)
	Text bool // never cut inside a UTF-8 sequence
}

// Read returns the bytes of leaf (a chunk or external payload) from from,
// up to limit bytes and not past to, cut on an append boundary where one
// exists (JSON: a message; text: a rune). The result must not be modified.
func (r *Reader) Read(ctx context.Context, leaf *storagev1.ColdRef, from, to, limit uint64, u Unit) ([]byte, uint64, error) {
	if from < leaf.GetStart() || from >= leaf.GetEnd() {
		return nil, from, fmt.Errorf("tier: position %d outside object %q [%d, %d)", from, leaf.GetKey(), leaf.GetStart(), leaf.GetEnd())
	}
	to = min(to, leaf.GetEnd())
	size := int64(leaf.GetSize())
	get := func(a, b uint64) ([]byte, error) {
		return r.cache.ReadAt(ctx, leaf.GetKey(), size, int64(a-leaf.GetStart()), int64(b-a))
	}
	if to-from <= limit {
		data, err := get(from, to)
		return data, to, err
	}
	want := from + limit
	data, err := get(from, want)
	if err != nil {
		return nil, from, err
	}
	if u.JSON {
		if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
			return data[:i+1], from + uint64(i) + 1, nil
		}
		// One message larger than the limit: read on to its end.
		rest, err := get(want, to)
		if err != nil {
			return nil, from, err
		}
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			rest = rest[:i+1]
		}
		out := append(append(make([]byte, 0, len(data)+len(rest)), data...), rest...)
		return out, from + uint64(len(out)), nil
	}
	if leaf.GetKind() == storagev1.ColdKind_COLD_KIND_CHUNK && leaf.GetRecords() > 0 {
		recs, err := r.records(ctx, leaf)
		if err != nil {
			return nil, from, err
		}
		i := sort.Search(len(recs), func(i int) bool { return recs[i] > want })
		if i > 0 && recs[i-1] > from {
			end := recs[i-1]
			return data[:end-from], end, nil
		}
	}
	if u.Text {
		for p := len(data); p > 0 && len(data)-p < utf8.UTFMax; p-- {
			if !utf8.RuneStart(data[p-1]) {
				continue
			}
			if utf8.FullRune(data[p-1:]) {
				break
			}
			if p > 1 {
				return data[:p-1], from + uint64(p-1), nil
			}
			// A limit inside the first rune: return that rune whole.
			whole, err := get(from, min(from+utf8.UTFMax, to))
			if err != nil {
				return nil, from, err
			}
			_, n := utf8.DecodeRune(whole)
			return whole[:n], from + uint64(n), nil
		}
	}
	return data, want, nil
}

// records reads a chunk's record ends.
func (r *Reader) records(ctx context.Context, leaf *storagev1.ColdRef) ([]uint64, error) {
	n := leaf.GetEnd() - leaf.GetStart()
	tail, err := r.cache.ReadAt(ctx, leaf.GetKey(), int64(leaf.GetSize()), int64(n), int64(leaf.GetSize()-n))
	if err != nil {
		return nil, err
	}
	return coldfmt.DecodeRecords(leaf.GetStart(), tail)
}

// UnitEnd resolves a fork sub-offset inside a cold leaf: the position after
// n units (bytes, or JSON messages) of the append that starts at pos.
func (r *Reader) UnitEnd(ctx context.Context, leaf *storagev1.ColdRef, pos, n, clip uint64, json bool) (uint64, bool, error) {
	end := min(leaf.GetEnd(), clip)
	if leaf.GetKind() == storagev1.ColdKind_COLD_KIND_CHUNK && leaf.GetRecords() > 0 {
		recs, err := r.records(ctx, leaf)
		if err != nil {
			return 0, false, err
		}
		i := sort.Search(len(recs), func(i int) bool { return recs[i] > pos })
		if i < len(recs) {
			end = min(end, recs[i])
		}
	}
	if !json {
		return pos + n, pos+n <= end, nil
	}
	data, err := r.cache.ReadAt(ctx, leaf.GetKey(), int64(leaf.GetSize()), int64(pos-leaf.GetStart()), int64(end-pos))
	if err != nil {
		return 0, false, err
	}
	p := 0
	for k := uint64(0); k < n; k++ {
		j := bytes.IndexByte(data[p:], '\n')
		if j < 0 {
			return 0, false, nil
		}
		p += j + 1
	}
	return pos + uint64(p), true, nil
}
