package stream

import (
	"fmt"
	"maps"
	"math/bits"
	"strings"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/fault"
)

// Bounds of backup commands.
const (
	// MaxGCHolds bounds the holders holding a group's cold GC at once:
	// each is state in every replica and snapshot.
	MaxGCHolds = 64
	// MaxHolderBytes bounds a holder's name.
	MaxHolderBytes = 256
	// maxIncarnationOffset bounds an import's incarnation offset, so
	// that indexes above it never reach the top of the incarnation range
	// (newIncarnation saturates there).
	maxIncarnationOffset = 1 << 62
)

// ImportInfo is a group's import from a backup (ImportRecord).
type ImportInfo struct {
	// Blake3 is the digest of the group object imported.
	Blake3 string
	// Index is the log index the import applied at.
	Index uint64
	// AtMs is the proposing leader's clock.
	AtMs int64
	// SourceAppliedIndex is the source group's applied index in the
	// backup.
	SourceAppliedIndex uint64
	// Streams counts the streams that took a new incarnation.
	Streams uint64
}

func importInfo(r *storagev1.ImportRecord) ImportInfo {
	return ImportInfo{Blake3: r.GetBlake3(), Index: r.GetIndex(), AtMs: r.GetAtMs(),
		SourceAppliedIndex: r.GetSourceAppliedIndex(), Streams: r.GetStreams()}
}

// Imported returns the group's import; ok is false when the group never
// took one.
func (m *Machine) Imported() (ImportInfo, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.imported == nil {
		return ImportInfo{}, false
	}
	return importInfo(m.imported), true
}

// CheckImport tells how an import of the group object with digest blake3
// would apply on this replica now: a repeat (the import it repeats), a
// refusal (GROUP_NOT_EMPTY), or neither (nil, nil: it would replace the
// state). The engine asks before it proposes an import, so that an
// import that cannot apply costs no log entry; apply decides again.
func (m *Machine) CheckImport(blake3 string) (*ImportInfo, *fault.Error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.checkImport(blake3)
}

// checkImport is CheckImport; callers hold m.mu.
func (m *Machine) checkImport(blake3 string) (*ImportInfo, *fault.Error) {
	if im := m.imported; im != nil && im.GetBlake3() == blake3 {
		info := importInfo(im)
		return &info, nil
	}
	streams := 0
	for _, s := range m.streams {
		if !s.vacant() {
			streams++
		}
	}
	var why string
	switch {
	case m.imported != nil:
		// One import per group: a second one would mix two backups'
		// incarnations and drop what the first restored.
		why = fmt.Sprintf("took the import of another group object (blake3 %s) at index %d", m.imported.GetBlake3(), m.imported.GetIndex())
	case len(m.buckets) > 0:
		why = fmt.Sprintf("holds %d buckets", len(m.buckets))
	case streams > 0:
		why = fmt.Sprintf("holds %d streams", streams)
	case len(m.fenced) > 0:
		why = fmt.Sprintf("holds %d purged buckets", len(m.fenced))
	default:
		return nil, nil
	}
	return nil, fault.Errorf(fault.ErrGroupNotEmpty, "group %d %s: an import replaces the state of an empty group only", m.group, why)
}

// vacant reports a stream an import may replace: in a reserved bucket
// ("__…"), never written (no byte, producer or snapshot) and linked to no
// fork. The node's own roles create such streams when they start (the
// subscription state of an all-in-one process), so a fresh cluster's
// groups are empty but for them; they hold nothing to lose and no object.
func (s *stream) vacant() bool {
	st := &s.meta
	return strings.HasPrefix(st.GetBucket(), "__") && s.buf.End() == 0 && s.producers.len() == 0 && st.GetSnapshot() == nil &&
		st.GetFork() == nil && st.GetForkRefs() == 0 && len(st.GetEarlier()) == 0
}

// applyImportGroup replaces an empty group's state with a backup's
// snapshot of a group and starts a new history of it (package doc,
// "Backups"). A repeat of the import applied changes nothing; anything
// wrong with the snapshot is refused and changes nothing.
func (m *Machine) applyImportGroup(index uint64, now int64, c *storagev1.ImportGroup) *Result {
	if !backupfmt.ValidDigest(c.GetBlake3()) {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "an import names the group object's BLAKE3 digest (64 lower-case hex digits), not %q", c.GetBlake3())}
	}
	if rep, refused := m.checkImport(c.GetBlake3()); refused != nil {
		return &Result{Err: refused}
	} else if rep != nil {
		return &Result{Duplicate: true, EventIndex: rep.Index, Streams: rep.Streams}
	}
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(c.GetSnapshot(), &snap); err != nil {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot does not decode: %v", err)}
	}
	if err := backupfmt.ValidateSnapshot(&snap); err != nil {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot is not valid: %v", err)}
	}
	// An import never raises the group's feature level: the snapshot may
	// hold state of behaviours some voter does not know. The operator
	// raises the target first (every voter is checked then).
	if l, have := effectiveLevel(snap.GetFeatureLevel()), effectiveLevel(m.featureLevel); l > have {
		return &Result{Err: fault.Errorf(fault.ErrFeatureLevelUnsupported, "the imported snapshot is at feature level %d; group %d is at %d: raise the cluster's feature level first", l, m.group, have)}
	}
	// Above every incarnation the source issued (validated: none exceeds
	// its applied index plus its offset) and every one this group did.
	offset, carry := bits.Add64(snap.GetAppliedIndex(), snap.GetIncarnationOffset(), 0)
	if carry != 0 || offset > maxIncarnationOffset {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot's incarnations reach %d, beyond %d", offset, uint64(maxIncarnationOffset))}
	}
	st, hotBytes, err := decodeState(&snap)
	if err != nil {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot does not restore: %v", err)}
	}
	// The target keeps what belongs to its own log and cold store. The
	// source's GC queue names objects no stream references: the backup
	// did not copy them. This group's own queue is dropped too, because
	// a prefix entry of a stream deleted here may name a prefix the
	// import reuses (same name, same incarnation number); what it names
	// is left to the orphan sweep. Sequence numbers stay unique.
	st.gc = nil
	st.gcNextSeq = max(st.gcNextSeq, m.gcNextSeq)
	st.gcHolds = maps.Clone(m.gcHolds)
	pruneHolds(st.gcHolds, now)
	for b, u := range m.usage {
		// Usage counters only grow: this group's own count stays.
		if cur := st.usage[b]; cur != nil {
			cur.CommittedAppendBytes += u.GetCommittedAppendBytes()
			cur.CommittedRecords += u.GetCommittedRecords()
			cur.CommittedWriteUnits += u.GetCommittedWriteUnits()
		} else {
			st.usage[b] = proto.CloneOf(u)
		}
	}
	st.incarnationOffset = max(offset, m.incarnationOffset)
	if st.featureLevel = max(st.featureLevel, m.featureLevel); st.featureLevel <= BaselineFeatureLevel {
		st.featureLevel = 0 // the baseline is stored as 0, as in a group never raised
	}
	// The restore event continues this group's history: its plan term is
	// the one of the group's latest event (0: none), so that a plan of
	// this cluster, whose term is above every term it saw, still starts a
	// history after it, and a late repeat of that latest plan stays a
	// repeat. Point names where the source's history stopped.
	prev := m.history
	st.history = nil
	m.install(st, hotBytes)
	m.startHistory(index, now, prev.GetPlanTerm(), snap.GetAppliedIndex(), HistoryRestore, prev)
	n := m.history.GetStreams()
	m.imported = &storagev1.ImportRecord{Blake3: c.GetBlake3(), Index: index, AtMs: now,
		SourceAppliedIndex: snap.GetAppliedIndex(), Streams: n}
	return &Result{EventIndex: index, Streams: n}
}

// applyHoldColdGC sets, replaces or (until_ms at or before now) releases
// one holder's hold on the group's cold GC; holds already over are
// dropped on the way.
func (m *Machine) applyHoldColdGC(now int64, c *storagev1.HoldColdGC) *Result {
	h := c.GetHolder()
	if h == "" || len(h) > MaxHolderBytes {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "a GC holder is named by 1 to %d bytes", MaxHolderBytes)}
	}
	pruneHolds(m.gcHolds, now)
	if c.GetUntilMs() <= now {
		delete(m.gcHolds, h)
		return &Result{}
	}
	if _, ok := m.gcHolds[h]; !ok && len(m.gcHolds) >= MaxGCHolds {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "group %d already has %d GC holders, the most it keeps", m.group, MaxGCHolds)}
	}
	m.gcHolds[h] = c.GetUntilMs()
	return &Result{}
}

func pruneHolds(holds map[string]int64, now int64) {
	maps.DeleteFunc(holds, func(_ string, until int64) bool { return until <= now })
}

// GCHeld reports whether a hold on the group's cold GC is unexpired at
// nowMs (a node's clock: holds end by the clock of whoever asks, and are
// dropped from the state by the next hold command).
func (m *Machine) GCHeld(nowMs int64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, until := range m.gcHolds {
		if until > nowMs {
			return true
		}
	}
	return false
}

// GCHolds returns the group's holds (holder → until, ms), expired ones
// included until a hold command drops them.
func (m *Machine) GCHolds() map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return maps.Clone(m.gcHolds)
}
