package stream

// Placement: a stream lives in group FNV-1a 64(bucket + "/" + stream) mod
// G, and its group on shard worker group mod S. Gateways route by the same
// rule (it is part of the StreamService contract, see GetClusterInfo in
// proto/ursula/stream/v1), so it never changes.

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
)

// GroupOf returns the group of a stream among groupCount groups.
func GroupOf(bucket, stream string, groupCount int) uint32 {
	h := uint64(fnvOffset)
	for i := 0; i < len(bucket); i++ {
		h ^= uint64(bucket[i])
		h *= fnvPrime
	}
	h ^= '/'
	h *= fnvPrime
	for i := 0; i < len(stream); i++ {
		h ^= uint64(stream[i])
		h *= fnvPrime
	}
	return uint32(h % uint64(groupCount))
}
