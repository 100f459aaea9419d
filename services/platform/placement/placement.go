package placement

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
)

// Group returns the group of a stream among groupCount groups.
func Group(bucket, stream string, groupCount int) uint32 {
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
