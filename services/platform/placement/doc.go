// Package placement maps a stream to its Raft group. Nodes and gateways
// must agree on it exactly, so it lives here, in one place:
// group = FNV-1a 64(bucket + "/" + stream) mod G, and shard = group mod S.
package placement
