package stream

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// Application snapshots (the protocol's /snapshot resources, not the Raft
// snapshot of snapshot.go): a stream holds at most one, a SnapshotRef in
// its StreamState. Its body lives in the cold store under the stream's
// prefix (key), in staged parts committed as one snapshot (part_keys, in
// order, part_sizes bytes each) or, without a cold store, inline (data).

// SnapshotDigest is the digest of a snapshot: the lower-case hex SHA-256 of
// the content type, a NUL byte, and the body. The same bytes with the same
// type always have the same digest.
func SnapshotDigest(contentType string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(contentType))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// applyPublishSnapshot replaces a stream's snapshot. The engine checked
// that the position is an append boundary (bytes never change, so that
// stays true); apply checks what may have moved since: the tail, the
// retention and the current snapshot. Publishing the snapshot that is
// already there is a duplicate; the replaced snapshot's object is queued
// for GC after the grace.
func (m *Machine) applyPublishSnapshot(now int64, c *storagev1.PublishSnapshot) *Result {
	s, bad := m.coldStream(c.GetBucket(), c.GetStream(), c.GetIncarnation())
	if bad != nil {
		return bad
	}
	st := &s.meta
	if st.GetSoftDeleted() {
		return &Result{Err: fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", c.GetStream())}
	}
	ref := c.GetSnapshot()
	pos := ref.GetPosition()
	if ref.GetDigest() == "" {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "snapshot without a digest")}
	}
	if n := len(ref.GetPartKeys()); n != len(ref.GetPartSizes()) || n != len(ref.GetPartDigests()) {
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "snapshot with %d part keys, %d part sizes and %d part digests", n, len(ref.GetPartSizes()), len(ref.GetPartDigests()))}
	}
	if pos > s.buf.End() {
		return &Result{Err: fault.Errorf(fault.ErrSnapshotConflict, "snapshot offset %s is beyond the tail %s", FormatOffset(pos), FormatOffset(s.buf.End()))}
	}
	if pos < st.GetRetained() {
		return &Result{Err: fault.Errorf(fault.ErrOffsetTrimmed, "snapshot offset %s is below the stream's retention %s", FormatOffset(pos), FormatOffset(st.GetRetained())).
			With(fault.DetailNextOffset, FormatOffset(st.GetRetained()))}
	}
	cur := st.GetSnapshot()
	if cur != nil && cur.GetPosition() == pos && cur.GetDigest() == ref.GetDigest() {
		return &Result{Meta: s.metaView(), Duplicate: true}
	}
	if match := c.GetMatch(); match != "" && match != cur.GetDigest() {
		return &Result{Err: fault.Errorf(fault.ErrSnapshotConflict, "Stream-Snapshot-Match %q does not match the latest snapshot's digest %q", match, cur.GetDigest())}
	}
	if cur != nil && cur.GetPosition() == pos {
		return &Result{Err: fault.Errorf(fault.ErrSnapshotConflict, "a different snapshot exists at offset %s", FormatOffset(pos))}
	}
	st.r().Snapshot = proto.CloneOf(ref)
	for _, k := range snapshotKeys(cur) {
		if !slices.Contains(snapshotKeys(ref), k) {
			m.enqueueGC(st.GetBucket(), storagev1.GCKind_GC_KIND_OBJECT, k, now+c.GetGraceMs())
		}
	}
	return &Result{Meta: s.metaView()}
}

// snapshotKeys lists the objects a snapshot's body lives in.
func snapshotKeys(r *storagev1.SnapshotRef) []string {
	if k := r.GetKey(); k != "" {
		return append([]string{k}, r.GetPartKeys()...)
	}
	return r.GetPartKeys()
}

// SnapshotOf returns a copy of a stream's latest snapshot (nil when it has
// none, or the stream of that incarnation is gone).
func (m *Machine) SnapshotOf(key Key, inc uint64) *storagev1.SnapshotRef {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc || s.meta.GetSnapshot() == nil {
		return nil
	}
	r := s.meta.GetSnapshot()
	// The body (inline data) is immutable: shared, not copied.
	return &storagev1.SnapshotRef{Position: r.GetPosition(), Digest: r.GetDigest(), ContentType: r.GetContentType(),
		Key: r.GetKey(), Size: r.GetSize(), Data: r.GetData(),
		PartKeys: slices.Clone(r.GetPartKeys()), PartSizes: slices.Clone(r.GetPartSizes()), PartDigests: slices.Clone(r.GetPartDigests())}
}

// Boundary reports whether pos, a position of the stream's own range
// [Base, Tail], is a unit boundary: the stream's base or tail, the end of
// an append, or (JSON streams) the end of a message. When pos lies in the
// cold range or inside an external payload, Boundary cannot tell: it
// returns the cold reference covering pos-1 (the byte before pos) for the
// caller to look at. ok is false when the stream is gone or pos is
// outside its own range.
func (m *Machine) Boundary(key Key, inc uint64, pos uint64) (boundary bool, ref *storagev1.ColdRef, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc || pos < s.meta.GetBase() || pos > s.buf.End() {
		return false, nil, false
	}
	if pos == s.meta.GetBase() || pos == s.buf.End() || pos == s.buf.Base() {
		// The hot window starts where a flush cut, on an append boundary.
		return true, nil, true
	}
	if pos < s.buf.Base() {
		return false, s.coldRef(pos - 1), true
	}
	i := sort.Search(len(s.records), func(i int) bool { return s.records[i] >= pos })
	if i < len(s.records) && s.records[i] == pos {
		return true, nil, true
	}
	if _, _, tag, hole := s.buf.Hole(pos - 1); hole {
		return false, tag.(*storagev1.ColdRef), true
	}
	if s.meta.GetJson() && s.buf.ByteAt(pos-1) == '\n' {
		return true, nil, true
	}
	return false, nil, true
}
