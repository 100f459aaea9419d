package upstream

// groupOf is the gateway's half of the placement rule of the StreamService
// contract (GetClusterInfo in proto/ursula/stream/v1): a stream lives in
// group FNV-1a 64(bucket + "/" + stream) mod group_count. Nodes implement
// the same rule (storage/stream.GroupOf); both are pinned to the same test
// vectors, because the gateway must never import the storage engine.
func groupOf(bucket, stream string, groupCount int) uint32 {
	const (
		fnvOffset = 0xcbf29ce484222325
		fnvPrime  = 0x100000001b3
	)
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
