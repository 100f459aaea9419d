package engine

import "github.com/ursula/ursula/storage/stream"

// Usage aggregates every bucket's usage over this node's replicas of all
// groups: committed counters from replicated state and current gauges.
// Buckets with nothing counted and no streams are left out.
func (e *Engine) Usage() map[string]stream.BucketUsage {
	out := map[string]stream.BucketUsage{}
	for g := range e.groups.GroupCount() {
		m := e.groups.Machine(uint32(g))
		for b, u := range m.Usage() {
			t := out[b]
			t.CommittedAppendBytes += u.CommittedAppendBytes
			t.CommittedRecords += u.CommittedRecords
			t.CommittedWriteUnits += u.CommittedWriteUnits
			t.RetainedBytes += u.RetainedBytes
			t.StreamCount += u.StreamCount
			out[b] = t
		}
	}
	return out
}
