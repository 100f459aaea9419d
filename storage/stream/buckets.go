package stream

import (
	"sort"
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// applyDeleteBucket removes a bucket record (group 0). The engine checked
// every other group for streams of the bucket before it proposed; apply
// checks this group's own streams again, so a bucket group 0 still holds
// streams of is never removed.
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
