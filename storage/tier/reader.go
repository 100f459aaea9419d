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

// Reader reads stream bytes from cold-index references. Every byte it
// returns was verified against the checksum its reference carries (see
// coldfmt): an index page as a whole, a chunk's or external payload's
// footer as a whole, and its data block by block, as the cache fetches
// them. A mismatch is an error wrapping coldfmt.ErrCorrupt, and nothing of
// the object is served.
type Reader struct {
	cache *Cache
	// records holds the record indexes of JSON leaves (records.go).
	records recordIndexes
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

// Page returns the entries of a sealed index page, verified against the
// page reference's checksum.
func (r *Reader) Page(ctx context.Context, ref *storagev1.ColdRef) ([]*storagev1.ColdRef, error) {
	var entries []*storagev1.ColdRef
	body, err := r.cache.ReadSealed(ctx, ref.GetKey(), 0, int64(ref.GetSize()), func(b []byte) error {
		var err error
		entries, err = coldfmt.DecodePage(b, ref.GetCrc32C())
		return err
	})
	if err != nil {
		return nil, err
	}
	if entries == nil {
		// A cache hit: the body was verified when it was fetched.
		if entries, err = coldfmt.DecodePage(body, ref.GetCrc32C()); err != nil {
			return nil, fmt.Errorf("page %q: %w", ref.GetKey(), err)
		}
	}
	return entries, nil
}

// descend follows pages from ref, choosing the entry pick returns at each
// level, down to a chunk or external payload; what names the wanted
// position for errors.
func (r *Reader) descend(ctx context.Context, ref *storagev1.ColdRef, pick func([]*storagev1.ColdRef) *storagev1.ColdRef, what string) (*storagev1.ColdRef, error) {
	for depth := 0; ref.GetKind() == storagev1.ColdKind_COLD_KIND_PAGE; depth++ {
		if depth > 64 {
			return nil, fmt.Errorf("tier: cold index deeper than 64 levels at %q", ref.GetKey())
		}
		entries, err := r.Page(ctx, ref)
		if err != nil {
			return nil, err
		}
		next := pick(entries)
		if next == nil {
			return nil, fmt.Errorf("tier: page %q does not hold %s", ref.GetKey(), what)
		}
		ref = next
	}
	return ref, nil
}

// leafView is a chunk or external payload whose footer was read and
// verified: its data reads are verified block by block.
type leafView struct {
	r      *Reader
	ref    *storagev1.ColdRef
	footer coldfmt.Footer
}

// open reads and verifies a leaf's footer (through the cache: it is
// fetched and checked once, then shared).
func (r *Reader) open(ctx context.Context, leaf *storagev1.ColdRef) (*leafView, error) {
	switch leaf.GetKind() {
	case storagev1.ColdKind_COLD_KIND_CHUNK, storagev1.ColdKind_COLD_KIND_EXTERNAL:
	default:
		return nil, fmt.Errorf("tier: %q is not a chunk or an external payload (kind %v)", leaf.GetKey(), leaf.GetKind())
	}
	n := leaf.GetEnd() - leaf.GetStart()
	if leaf.GetEnd() < leaf.GetStart() || leaf.GetSize() < n {
		return nil, fmt.Errorf("tier: reference to %q: %d bytes [%d, %d) in a %d-byte object", leaf.GetKey(), n, leaf.GetStart(), leaf.GetEnd(), leaf.GetSize())
	}
	b, err := r.cache.ReadSealed(ctx, leaf.GetKey(), int64(n), int64(leaf.GetSize()-n), func(b []byte) error {
		f, err := coldfmt.ParseFooter(n, b)
		if err != nil {
			return err
		}
		if leaf.GetKind() == storagev1.ColdKind_COLD_KIND_CHUNK && f.Records() != int(leaf.GetRecords()) {
			return fmt.Errorf("%w: footer holds %d record ends, the reference %d", coldfmt.ErrCorrupt, f.Records(), leaf.GetRecords())
		}
		return f.Verify(leaf.GetCrc32C())
	})
	if err != nil {
		return nil, err
	}
	f, err := coldfmt.ParseFooter(n, b)
	if err != nil {
		return nil, fmt.Errorf("object %q: %w", leaf.GetKey(), err)
	}
	return &leafView{r: r, ref: leaf, footer: f}, nil
}

// read returns the leaf's bytes of stream positions [a, b), verified. The
// result must not be modified.
func (lv *leafView) read(ctx context.Context, a, b uint64) ([]byte, error) {
	start := lv.ref.GetStart()
	return lv.r.cache.ReadAt(ctx, lv.ref.GetKey(), int64(lv.footer.DataBytes()), int64(a-start), int64(b-a), footerVerifier{lv.footer})
}

// records returns the number of record ends and the absolute end i.
func (lv *leafView) recordEnd(i int) uint64 { return lv.ref.GetStart() + lv.footer.RecordEnd(i) }

// searchRecords is the smallest i whose record end satisfies ok (ok is
// monotone), or the record count.
func (lv *leafView) searchRecords(ok func(end uint64) bool) int {
	return sort.Search(lv.footer.Records(), func(i int) bool { return ok(lv.recordEnd(i)) })
}

// footerVerifier checks data blocks against a verified footer.
type footerVerifier struct{ f coldfmt.Footer }

func (v footerVerifier) Span(lo, hi int64) (int64, int64) {
	a, b := v.f.Span(uint64(lo), uint64(hi))
	return int64(a), int64(b)
}

func (v footerVerifier) Check(off int64, data []byte) error { return v.f.VerifyData(uint64(off), data) }

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
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return nil, from, err
	}
	to = min(to, leaf.GetEnd())
	if to-from <= limit {
		data, err := lv.read(ctx, from, to)
		return data, to, err
	}
	want := from + limit
	data, err := lv.read(ctx, from, want)
	if err != nil {
		return nil, from, err
	}
	if u.JSON {
		if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
			return data[:i+1], from + uint64(i) + 1, nil
		}
		// One message larger than the limit: read on to its end.
		rest, err := lv.read(ctx, want, to)
		if err != nil {
			return nil, from, err
		}
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			rest = rest[:i+1]
		}
		out := append(append(make([]byte, 0, len(data)+len(rest)), data...), rest...)
		return out, from + uint64(len(out)), nil
	}
	if lv.footer.Records() > 0 {
		i := lv.searchRecords(func(end uint64) bool { return end > want })
		if i > 0 && lv.recordEnd(i-1) > from {
			end := lv.recordEnd(i - 1)
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
			whole, err := lv.read(ctx, from, min(from+utf8.UTFMax, to))
			if err != nil {
				return nil, from, err
			}
			_, n := utf8.DecodeRune(whole)
			return whole[:n], from + uint64(n), nil
		}
	}
	return data, want, nil
}

// UnitEnd resolves a fork sub-offset inside a cold leaf: the position after
// n units (bytes, or JSON messages) of the append that starts at pos.
func (r *Reader) UnitEnd(ctx context.Context, leaf *storagev1.ColdRef, pos, n, clip uint64, json bool) (uint64, bool, error) {
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return 0, false, err
	}
	end := min(leaf.GetEnd(), clip)
	if i := lv.searchRecords(func(e uint64) bool { return e > pos }); i < lv.footer.Records() {
		end = min(end, lv.recordEnd(i))
	}
	if !json {
		return pos + n, pos+n <= end, nil
	}
	data, err := lv.read(ctx, pos, end)
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
