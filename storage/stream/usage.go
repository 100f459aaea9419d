package stream

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// WriteUnitBytes is the usage write unit: every committed, non-duplicate
// create or append counts ceil(max(bytes, 1) / WriteUnitBytes) units. It is
// persisted in snapshots; a snapshot computed with another unit is refused.
const WriteUnitBytes = 10240

// BucketUsage is a bucket's usage in one group: committed counters that
// only grow (they survive stream deletion, expiry and bucket purge) and
// current gauges.
type BucketUsage struct {
	CommittedAppendBytes uint64
	CommittedRecords     uint64
	CommittedWriteUnits  uint64
	// RetainedBytes is the own bytes the bucket's streams still hold
	// (above each stream's retention), StreamCount the streams that are
	// not soft-deleted.
	RetainedBytes uint64
	StreamCount   uint64
}

// writeUnits is the units a write of n bytes counts.
func writeUnits(n uint64) uint64 { return (max(n, 1) + WriteUnitBytes - 1) / WriteUnitBytes }

// countWrite records a committed, non-duplicate create or append of n
// stored bytes in records records. Callers hold m.mu.
func (m *Machine) countWrite(bucket string, n, records uint64) {
	u := m.usage[bucket]
	if u == nil {
		u = &storagev1.BucketUsage{Bucket: bucket}
		m.usage[bucket] = u
	}
	u.CommittedAppendBytes += n
	u.CommittedRecords += records
	u.CommittedWriteUnits += writeUnits(n)
}

// writeRecords is the number of records a write of n bytes with the given
// record ends adds (a non-empty body without ends is one record).
func writeRecords(n uint64, ends []uint64) uint64 {
	if n == 0 {
		return 0
	}
	return uint64(max(len(ends), 1))
}

// Usage returns every bucket's usage in this group: buckets with counters
// and buckets with streams.
func (m *Machine) Usage() map[string]BucketUsage {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[string]BucketUsage, len(m.usage))
	for b, u := range m.usage {
		out[b] = BucketUsage{CommittedAppendBytes: u.GetCommittedAppendBytes(), CommittedRecords: u.GetCommittedRecords(), CommittedWriteUnits: u.GetCommittedWriteUnits()}
	}
	for k, s := range m.streams {
		u := out[k.Bucket]
		if from := max(s.meta.GetBase(), s.meta.GetRetained()); s.buf.End() > from {
			u.RetainedBytes += s.buf.End() - from
		}
		if !s.meta.GetSoftDeleted() {
			u.StreamCount++
		}
		out[k.Bucket] = u
	}
	return out
}

// snapshotUsage fills a snapshot's usage fields. Callers hold m.mu.
func (m *Machine) snapshotUsage(snap *storagev1.Snapshot) {
	snap.WriteUnitBytes = WriteUnitBytes
	for _, u := range m.usage {
		snap.Usage = append(snap.Usage, proto.CloneOf(u))
	}
	sort.Slice(snap.Usage, func(i, j int) bool { return snap.Usage[i].GetBucket() < snap.Usage[j].GetBucket() })
	if len(m.bucketCreated) > 0 {
		snap.BucketCreatedMs = make(map[string]int64, len(m.bucketCreated))
		for b, ms := range m.bucketCreated {
			snap.BucketCreatedMs[b] = ms
		}
	}
}

// restoreUsage decodes a snapshot's usage fields. A snapshot without a
// unit predates usage counters and restores with none.
func restoreUsage(snap *storagev1.Snapshot) (map[string]*storagev1.BucketUsage, map[string]int64, error) {
	if w := snap.GetWriteUnitBytes(); w != 0 && w != WriteUnitBytes {
		return nil, nil, fmt.Errorf("usage write unit is %d bytes, this build counts %d", w, WriteUnitBytes)
	}
	usage := make(map[string]*storagev1.BucketUsage, len(snap.GetUsage()))
	for _, u := range snap.GetUsage() {
		usage[u.GetBucket()] = u
	}
	created := make(map[string]int64, len(snap.GetBucketCreatedMs()))
	for b, ms := range snap.GetBucketCreatedMs() {
		created[b] = ms
	}
	return usage, created, nil
}
