package tier

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"sort"
	"sync"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
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

// recordStep is the spacing of a leaf's record index: a lookup counts
// '\n' in at most this many bytes.
const recordStep = 64 << 10

// maxIndexedSteps bounds the record indexes a reader keeps (8 bytes a
// step: 8 MiB, the index of 64 GiB of cold JSON); the least recently used
// leaf's index goes first.
const maxIndexedSteps = 1 << 20

// recordIndexes holds the record index of JSON leaves a reader looked
// records up in: for each, the number of messages before every
// recordStep-th byte of its data. An index is derived from the leaf's
// verified bytes the first time a lookup needs it (one pass, through the
// block cache) and is not stored anywhere, so no object format changes:
// objects are immutable, so it never goes stale; a leaf read again after
// its index was dropped is indexed again.
type recordIndexes struct {
	mu    sync.Mutex
	lru   *list.List               // of *leafIndex, most recent first
	byKey map[string]*list.Element // object key → its element
	steps int
}

type leafIndex struct {
	key string
	// before[i] is the number of '\n' in the leaf's data before byte
	// i·recordStep (relative to the leaf's start).
	before []uint64
}

func (x *recordIndexes) get(key string) []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if el, ok := x.byKey[key]; ok {
		x.lru.MoveToFront(el)
		return el.Value.(*leafIndex).before
	}
	return nil
}

func (x *recordIndexes) put(key string, before []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byKey == nil {
		x.lru, x.byKey = list.New(), map[string]*list.Element{}
	}
	if _, ok := x.byKey[key]; ok {
		return
	}
	x.byKey[key] = x.lru.PushFront(&leafIndex{key: key, before: before})
	x.steps += len(before)
	for x.steps > maxIndexedSteps && x.lru.Len() > 1 {
		old := x.lru.Remove(x.lru.Back()).(*leafIndex)
		delete(x.byKey, old.key)
		x.steps -= len(old.before)
	}
}

// recordIndex returns the record index of a JSON leaf, building it on
// first use.
func (lv *leafView) recordIndex(ctx context.Context) ([]uint64, error) {
	key := lv.ref.GetKey()
	if before := lv.r.records.get(key); before != nil {
		return before, nil
	}
	start, end := lv.ref.GetStart(), lv.ref.GetEnd()
	before := make([]uint64, 0, (end-start+recordStep-1)/recordStep)
	var n uint64
	for a := start; a < end; a += recordStep {
		before = append(before, n)
		data, err := lv.read(ctx, a, min(a+recordStep, end))
		if err != nil {
			return nil, err
		}
		n += uint64(bytes.Count(data, []byte{'\n'}))
	}
	if claimed := lv.ref.GetNextRecord() - lv.ref.GetFirstRecord(); claimed != 0 && n != claimed {
		// (A leaf flushed before record numbering claims none: it is
		// indexed all the same.)
		return nil, fmt.Errorf("%w: object %q holds %d records, its index entry says %d", coldfmt.ErrCorrupt, key, n, lv.ref.GetNextRecord()-lv.ref.GetFirstRecord())
	}
	lv.r.records.put(key, before)
	return before, nil
}

// RecordPos returns the position where JSON record n starts inside leaf
// (a chunk or external payload whose record range holds n): its record
// index gives the step holding the message before it, and that step is
// scanned.
func (r *Reader) RecordPos(ctx context.Context, leaf *storagev1.ColdRef, n uint64) (uint64, error) {
	if n < leaf.GetFirstRecord() || n >= leaf.GetNextRecord() {
		return 0, fmt.Errorf("tier: record %d outside object %q [%d, %d)", n, leaf.GetKey(), leaf.GetFirstRecord(), leaf.GetNextRecord())
	}
	k := n - leaf.GetFirstRecord() // record n starts after the k-th '\n'
	if k == 0 {
		return leaf.GetStart(), nil
	}
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return 0, err
	}
	before, err := lv.recordIndex(ctx)
	if err != nil {
		return 0, err
	}
	j := sort.Search(len(before), func(i int) bool { return before[i] >= k }) - 1
	a := leaf.GetStart() + uint64(j)*recordStep
	data, err := lv.read(ctx, a, min(a+recordStep, leaf.GetEnd()))
	if err != nil {
		return 0, err
	}
	p := 0
	for want := k - before[j]; want > 0; want-- {
		i := bytes.IndexByte(data[p:], '\n')
		if i < 0 {
			return 0, fmt.Errorf("%w: object %q holds fewer records than its index entry says", coldfmt.ErrCorrupt, leaf.GetKey())
		}
		p += i + 1
	}
	return a + uint64(p), nil
}

// RecordAt returns the JSON record ordinal at position pos inside leaf:
// the leaf's first record plus the messages before pos (from its record
// index, and a scan of the step holding pos).
func (r *Reader) RecordAt(ctx context.Context, leaf *storagev1.ColdRef, pos uint64) (uint64, error) {
	if pos < leaf.GetStart() || pos > leaf.GetEnd() {
		return 0, fmt.Errorf("tier: position %d outside object %q [%d, %d)", pos, leaf.GetKey(), leaf.GetStart(), leaf.GetEnd())
	}
	switch pos {
	case leaf.GetStart():
		return leaf.GetFirstRecord(), nil
	case leaf.GetEnd():
		return leaf.GetNextRecord(), nil
	}
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return 0, err
	}
	before, err := lv.recordIndex(ctx)
	if err != nil {
		return 0, err
	}
	j := (pos - leaf.GetStart()) / recordStep
	a := leaf.GetStart() + j*recordStep
	data, err := lv.read(ctx, a, pos)
	if err != nil {
		return 0, err
	}
	return leaf.GetFirstRecord() + before[j] + uint64(bytes.Count(data, []byte{'\n'})), nil
}
