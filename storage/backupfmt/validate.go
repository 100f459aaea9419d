package backupfmt

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// SnapshotFormat is the state-machine snapshot format (Snapshot.format)
// this build exports and imports; storage/stream writes it.
const SnapshotFormat = 2

// Bounds no real stream reaches, which keep arithmetic on positions and the
// state a snapshot restores in range.
const (
	// MaxPosition bounds a stream's tail (4 EiB).
	MaxPosition = 1 << 62
	// MaxProducers is the most producers a stream keeps (storage/stream's
	// MaxProducers).
	MaxProducers = 4096
)

// ValidateSnapshot checks the structure of a group's state-machine snapshot
// (the rules are listed in the package doc, "Snapshot validation"): every
// state a machine of this build reaches passes, and a snapshot an import
// could not serve correctly (positions that contradict each other, an
// index with gaps, records outside the stream, unsorted or repeated
// names) is refused with an error naming the first broken rule. It reads
// nothing but the snapshot: the objects an index references are Walk's.
func ValidateSnapshot(snap *storagev1.Snapshot) error {
	if snap == nil {
		return errors.New("no snapshot")
	}
	if f := snap.GetFormat(); f != SnapshotFormat {
		return fmt.Errorf("snapshot format %d, this build reads %d", f, SnapshotFormat)
	}
	buckets, err := sortedNames("bucket", snap.GetBuckets())
	if err != nil {
		return err
	}
	fenced, err := sortedNames("fenced bucket", snap.GetFencedBuckets())
	if err != nil {
		return err
	}
	for b := range fenced {
		if buckets[b] {
			return fmt.Errorf("bucket %q is both live and fenced", b)
		}
	}
	for b := range snap.GetBucketCreatedMs() {
		if !buckets[b] {
			return fmt.Errorf("a creation time for bucket %q, which the group does not hold", b)
		}
	}
	for i, u := range snap.GetUsage() {
		if u.GetBucket() == "" || (i > 0 && u.GetBucket() <= snap.GetUsage()[i-1].GetBucket()) {
			return fmt.Errorf("usage of bucket %q is unnamed or out of order", u.GetBucket())
		}
	}
	var seq uint64
	for i, e := range snap.GetGcQueue() {
		switch {
		case i > 0 && e.GetSeq() <= seq, e.GetSeq() >= snap.GetGcNextSeq():
			return fmt.Errorf("GC entry %d is out of order or not below the next sequence %d", e.GetSeq(), snap.GetGcNextSeq())
		case e.GetKey() == "" || e.GetBucket() == "":
			return fmt.Errorf("GC entry %d names no key or bucket", e.GetSeq())
		case e.GetKind() < storagev1.GCKind_GC_KIND_OBJECT || e.GetKind() > storagev1.GCKind_GC_KIND_PAGE:
			return fmt.Errorf("GC entry %d is of kind %v", e.GetSeq(), e.GetKind())
		}
		seq = e.GetSeq()
	}
	for h, until := range snap.GetGcHolds() {
		if h == "" || until <= 0 {
			return fmt.Errorf("GC hold %q until %d", h, until)
		}
	}
	if im := snap.GetImported(); im != nil && !ValidDigest(im.GetBlake3()) {
		return fmt.Errorf("import record with digest %q", im.GetBlake3())
	}
	maxInc := addSat(snap.GetAppliedIndex(), snap.GetIncarnationOffset())
	var prev *storagev1.StreamState
	for _, st := range snap.GetStreams() {
		if prev != nil && (st.GetBucket() < prev.GetBucket() || (st.GetBucket() == prev.GetBucket() && st.GetStream() <= prev.GetStream())) {
			return fmt.Errorf("stream %s/%s is out of order or repeated", st.GetBucket(), st.GetStream())
		}
		prev = st
		if fenced[st.GetBucket()] {
			return fmt.Errorf("stream %s/%s lives in the fenced bucket", st.GetBucket(), st.GetStream())
		}
		if err := validateStream(st, maxInc); err != nil {
			return fmt.Errorf("stream %s/%s: %w", st.GetBucket(), st.GetStream(), err)
		}
	}
	return nil
}

// sortedNames checks a sorted list of distinct non-empty names.
func sortedNames(what string, names []string) (map[string]bool, error) {
	out := make(map[string]bool, len(names))
	for i, n := range names {
		if n == "" || (i > 0 && n <= names[i-1]) {
			return nil, fmt.Errorf("%s %q is empty, out of order or repeated", what, n)
		}
		out[n] = true
	}
	return out, nil
}

// addSat is a+b, saturating: values that passed no check must not wrap.
func addSat(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return ^uint64(0)
	}
	return s
}

// validateStream checks one stream; maxInc bounds the incarnations the
// group can have issued (its applied index plus its incarnation offset).
func validateStream(st *storagev1.StreamState, maxInc uint64) error {
	if st.GetBucket() == "" || st.GetStream() == "" {
		return errors.New("unnamed")
	}
	inc := st.GetIncarnation()
	if inc == 0 || inc > maxInc {
		return fmt.Errorf("incarnation %d outside [1, %d]", inc, maxInc)
	}
	base := st.GetBase()
	if f := st.GetFork(); f != nil {
		if f.GetPosition() != base {
			return fmt.Errorf("a fork at %d whose own bytes start at %d", f.GetPosition(), base)
		}
		if f.GetSourceBucket() == "" || f.GetSourceStream() == "" || f.GetSourceIncarnation() == 0 {
			return errors.New("a fork without a source")
		}
	} else if base != 0 {
		return fmt.Errorf("own bytes start at %d without a fork", base)
	}
	if st.GetSoftDeleted() && st.GetForkRefs() == 0 {
		return errors.New("soft-deleted without forks referencing it")
	}
	if st.GetColdEnd() < base {
		return fmt.Errorf("cold end %d below the base %d", st.GetColdEnd(), base)
	}
	tail, err := validateHot(st)
	if err != nil {
		return err
	}
	if st.GetRetained() > tail {
		return fmt.Errorf("retention %d beyond the tail %d", st.GetRetained(), tail)
	}
	for i, r := range st.GetRecords() {
		if r <= st.GetColdEnd() || r > tail || (i > 0 && r <= st.GetRecords()[i-1]) {
			return fmt.Errorf("record end %d out of order or outside the hot window (%d, %d]", r, st.GetColdEnd(), tail)
		}
	}
	if err := validateIndex(st); err != nil {
		return err
	}
	if st.GetRecordFirst() > st.GetRecordNext() || (st.GetJson() && (st.GetBaseRecord() > st.GetHotRecord() || st.GetHotRecord() > st.GetRecordNext())) {
		return fmt.Errorf("records: first %d, base %d, hot %d, next %d", st.GetRecordFirst(), st.GetBaseRecord(), st.GetHotRecord(), st.GetRecordNext())
	}
	if len(st.GetProducers()) > MaxProducers {
		return fmt.Errorf("%d producers, at most %d are kept", len(st.GetProducers()), MaxProducers)
	}
	for i, p := range st.GetProducers() {
		if p.GetId() == "" || (i > 0 && p.GetId() <= st.GetProducers()[i-1].GetId()) {
			return fmt.Errorf("producer %q is unnamed, out of order or repeated", p.GetId())
		}
	}
	var lastInc, lastKept uint64
	for _, e := range st.GetEarlier() {
		if e.GetIncarnation() <= lastInc || e.GetIncarnation() >= inc || e.GetKept() < lastKept || e.GetKept() > tail {
			return fmt.Errorf("earlier incarnation %d (kept %d) out of order, not below %d or beyond the tail %d", e.GetIncarnation(), e.GetKept(), inc, tail)
		}
		lastInc, lastKept = e.GetIncarnation(), e.GetKept()
	}
	switch prevInc := st.GetPreviousIncarnation(); {
	case prevInc == 0 && st.GetInheritedOffset() != 0:
		return fmt.Errorf("an inherited offset %d without a previous incarnation", st.GetInheritedOffset())
	case prevInc != 0 && (prevInc >= inc || st.GetInheritedOffset() > tail):
		return fmt.Errorf("previous incarnation %d (inherited offset %d) not below %d or beyond the tail %d", prevInc, st.GetInheritedOffset(), inc, tail)
	}
	if s := st.GetSnapshot(); s != nil {
		n := len(s.GetPartKeys())
		switch {
		case s.GetPosition() > tail:
			return fmt.Errorf("application snapshot at %d beyond the tail %d", s.GetPosition(), tail)
		case s.GetDigest() == "":
			return errors.New("application snapshot without a digest")
		case n != len(s.GetPartSizes()) || n != len(s.GetPartDigests()):
			return fmt.Errorf("application snapshot with %d part keys, %d sizes and %d digests", n, len(s.GetPartSizes()), len(s.GetPartDigests()))
		}
		for _, k := range s.GetPartKeys() {
			if k == "" {
				return errors.New("application snapshot part without a key")
			}
		}
	}
	return nil
}

// validateHot checks the hot window (data and the external payloads placed
// in it, from cold_end) and returns the stream's tail. For a JSON stream it
// also checks that every run of hot bytes holds whole messages and that the
// record ordinals run on from hot_record through the window to
// record_next.
func validateHot(st *storagev1.StreamState) (uint64, error) {
	data := st.GetData()
	pos, rec := st.GetColdEnd(), st.GetHotRecord()
	run := func(b []byte) error {
		if !st.GetJson() || len(b) == 0 {
			return nil
		}
		if b[len(b)-1] != '\n' {
			return fmt.Errorf("hot bytes ending at %d do not end a JSON message", pos)
		}
		rec += uint64(bytes.Count(b, []byte{'\n'}))
		return nil
	}
	for _, x := range st.GetHotExternal() {
		r := x.GetRef()
		switch {
		case r == nil:
			return 0, errors.New("an external payload without a reference")
		case r.GetKind() != storagev1.ColdKind_COLD_KIND_EXTERNAL || r.GetKey() == "":
			return 0, fmt.Errorf("external payload %q of kind %v", r.GetKey(), r.GetKind())
		case r.GetStart() < pos || r.GetEnd() <= r.GetStart():
			return 0, fmt.Errorf("external payload [%d, %d) out of order in the hot window at %d", r.GetStart(), r.GetEnd(), pos)
		case r.GetStart()-pos > uint64(len(data)):
			return 0, fmt.Errorf("external payload at %d lies past the hot bytes", r.GetStart())
		}
		n := r.GetStart() - pos
		if err := run(data[:n]); err != nil {
			return 0, err
		}
		data = data[n:]
		if st.GetJson() {
			if r.GetFirstRecord() != rec || r.GetNextRecord() < r.GetFirstRecord() {
				return 0, fmt.Errorf("external payload at %d holds records [%d, %d), want them from %d", r.GetStart(), r.GetFirstRecord(), r.GetNextRecord(), rec)
			}
			rec = r.GetNextRecord()
		}
		pos = r.GetEnd()
	}
	tail, carry := bits.Add64(pos, uint64(len(data)), 0)
	if carry != 0 || tail > MaxPosition {
		return 0, fmt.Errorf("the tail lies beyond %d", uint64(MaxPosition))
	}
	if err := run(data); err != nil {
		return 0, err
	}
	if st.GetJson() && rec != st.GetRecordNext() {
		return 0, fmt.Errorf("the hot window ends at record %d, the stream at %d", rec, st.GetRecordNext())
	}
	return tail, nil
}

// validateIndex checks the cold index: level k holds entries of level k
// (chunks and external payloads at 0, pages above), and read from the
// highest level down the entries are one contiguous run of positions (and,
// in a JSON stream, of record ordinals) that ends at cold_end (and
// hot_record) and starts no later than the first readable byte.
func validateIndex(st *storagev1.StreamState) error {
	levels := st.GetColdIndex()
	readable := max(st.GetBase(), st.GetRetained())
	var prev *storagev1.ColdRef
	for k := len(levels) - 1; k >= 0; k-- {
		for _, e := range levels[k].GetEntries() {
			leaf := e.GetKind() == storagev1.ColdKind_COLD_KIND_CHUNK || e.GetKind() == storagev1.ColdKind_COLD_KIND_EXTERNAL
			switch {
			case e.GetLevel() != uint32(k) || (k == 0) != leaf || (k > 0 && e.GetKind() != storagev1.ColdKind_COLD_KIND_PAGE):
				return fmt.Errorf("index entry %q of kind %v and level %d at level %d", e.GetKey(), e.GetKind(), e.GetLevel(), k)
			case e.GetKey() == "" || e.GetEnd() <= e.GetStart():
				return fmt.Errorf("index entry %q covers [%d, %d)", e.GetKey(), e.GetStart(), e.GetEnd())
			case prev == nil && (e.GetStart() < st.GetBase() || e.GetStart() > readable):
				return fmt.Errorf("the index starts at %d, outside [%d, %d]", e.GetStart(), st.GetBase(), readable)
			case prev != nil && e.GetStart() != prev.GetEnd():
				return fmt.Errorf("index entry %q starts at %d, its predecessor ends at %d", e.GetKey(), e.GetStart(), prev.GetEnd())
			}
			if st.GetJson() {
				if (prev == nil && e.GetFirstRecord() < st.GetBaseRecord()) || (prev != nil && e.GetFirstRecord() != prev.GetNextRecord()) || e.GetNextRecord() < e.GetFirstRecord() {
					return fmt.Errorf("index entry %q holds records [%d, %d), out of sequence", e.GetKey(), e.GetFirstRecord(), e.GetNextRecord())
				}
			}
			prev = e
		}
	}
	switch {
	case prev == nil && st.GetColdEnd() > readable:
		return fmt.Errorf("cold bytes [%d, %d) are readable and not indexed", readable, st.GetColdEnd())
	case prev != nil && prev.GetEnd() != st.GetColdEnd():
		return fmt.Errorf("the index ends at %d, the cold range at %d", prev.GetEnd(), st.GetColdEnd())
	case prev != nil && st.GetJson() && prev.GetNextRecord() != st.GetHotRecord():
		return fmt.Errorf("the index ends at record %d, the hot window starts at %d", prev.GetNextRecord(), st.GetHotRecord())
	}
	return nil
}
