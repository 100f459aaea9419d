package stream

import (
	"sort"
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// Deleting a bucket runs in two phases across the groups, so that a
// stream create in another group cannot race it (engine.DeleteBucket):
//
//  1. FenceBucket in every group records a deletion fence of the bucket
//     record's generation. A CreateStream carries the generation of the
//     bucket record its proposer checked; one of a fenced generation (or
//     an earlier one) that applies after the fence is refused with
//     BUCKET_NOT_FOUND. So once the fence applied in a group, every create
//     of the record being deleted either applied before it, and the delete
//     sees the stream, or is refused.
//  2. After every fence applied (and a read barrier of every group), the
//     engine counts the bucket's streams: none, and DeleteBucket removes
//     the record in group 0; some, and the delete fails and FenceBucket
//     with lift removes the fences again.
//
// The fences of a deleted bucket stay; a later CreateBucket applies at a
// higher index, so its record's generation is above them and its streams
// pass. The first such create in a group drops the fence: a late create of
// the old record that applies after it lands in the new record, which
// exists, as if it had run after the bucket was created again; a delete
// of the new record fences the group again, above both. A bucket
// recorded before generations is generation 0, as are the built-in "__"
// buckets, which are never deleted.

// applyFenceBucket installs (or, with lift, removes) a deletion fence. A
// fence only rises: a lift removes the fence of its own generation only,
// and a fence of an earlier generation never replaces a later one.
func (m *Machine) applyFenceBucket(c *storagev1.FenceBucket) *Result {
	if err := m.requireLevel(BucketFenceLevel, "a bucket-delete fence"); err != nil {
		return &Result{Err: err}
	}
	b, gen := c.GetBucket(), c.GetGeneration()
	have, ok := m.bucketFences[b]
	switch {
	case c.GetLift():
		if ok && have == gen {
			delete(m.bucketFences, b)
		}
	case !ok || gen > have:
		m.bucketFences[b] = gen
	}
	return &Result{}
}

// checkBucketFence refuses a create of a bucket record generation this
// group holds a deletion fence of (or of a later one); a create of a
// newer record drops the fence, which can refuse nothing any more.
// Callers hold m.mu.
func (m *Machine) checkBucketFence(b string, gen uint64) *Result {
	fence, ok := m.bucketFences[b]
	switch {
	case !ok:
		return nil
	case gen <= fence:
		return &Result{Err: fault.Errorf(fault.ErrBucketNotFound, "bucket %s was deleted (generation %d)", b, fence)}
	}
	delete(m.bucketFences, b)
	return nil
}

// BucketGeneration returns a bucket record's generation (group 0): the
// index its CreateBucket applied at, 0 for one recorded before
// generations. ok is false when there is no record.
func (m *Machine) BucketGeneration(b string) (gen uint64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if _, ok := m.buckets[b]; !ok {
		return 0, false
	}
	return m.bucketGen[b], true
}

// BucketFence returns this group's deletion fence of bucket b, if any.
func (m *Machine) BucketFence(b string) (gen uint64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	gen, ok = m.bucketFences[b]
	return gen, ok
}

// applyDeleteBucket removes a bucket record (group 0). The engine fenced
// and checked every group for streams of the bucket before it proposed;
// apply checks this group's own streams again, so a bucket group 0 still
// holds streams of is never removed.
func (m *Machine) applyDeleteBucket(c *storagev1.DeleteBucket) *Result {
	b := c.GetBucket()
	if _, ok := m.buckets[b]; !ok {
		return &Result{Err: fault.Errorf(fault.ErrBucketNotFound, "bucket %s not found", b)}
	}
	if n := m.bucketStreams(b); n > 0 {
		return &Result{Err: fault.Errorf(fault.ErrBucketExists, "bucket %s is not empty (%d streams)", b, n)}
	}
	delete(m.buckets, b)
	delete(m.bucketCreated, b)
	delete(m.bucketGen, b)
	return &Result{}
}

// bucketStreams counts the streams of bucket b in this group, soft-deleted
// ones included (they still hold bytes). Callers hold m.mu.
func (m *Machine) bucketStreams(b string) int {
	n := 0
	for k := range m.streams {
		if k.Bucket == b {
			n++
		}
	}
	return n
}

// BucketCreated returns when a bucket was created (0 when unknown: a
// bucket from a snapshot taken before the time was recorded). ok is false
// when this group has no record of it.
func (m *Machine) BucketCreated(b string) (ms int64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if _, ok := m.buckets[b]; !ok {
		return 0, false
	}
	return m.bucketCreated[b], true
}

// Listing is one stream as a bucket listing shows it.
type Listing struct {
	Meta        Meta
	CreatedMs   int64
	LastWriteMs int64
}

// ListStreams returns up to limit streams of bucket b whose id starts with
// prefix and sorts after after, in id order, leaving out streams expired
// at nowMs. It scans the group's streams (a listing is an occasional
// operation; no per-bucket index is kept).
func (m *Machine) ListStreams(b, prefix, after string, limit int, nowMs int64) []Listing {
	m.mu.RLock()
	var out []Listing
	for k, s := range m.streams {
		if k.Bucket != b || !strings.HasPrefix(k.Stream, prefix) || k.Stream <= after {
			continue
		}
		mv := s.metaView()
		if !mv.SoftDeleted && mv.ExpiredAt(nowMs) {
			continue
		}
		out = append(out, Listing{Meta: mv, CreatedMs: s.meta.GetCreatedMs(), LastWriteMs: s.meta.GetLastWriteMs()})
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Meta.Key.Stream < out[j].Meta.Key.Stream })
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// CountStreams counts the streams of bucket b in this group.
func (m *Machine) CountStreams(b string) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bucketStreams(b)
}
