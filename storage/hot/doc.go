// Package hot holds the in-memory window of a stream's committed bytes and
// the signal that wakes live readers when it grows.
//
// A Buffer stores bytes in fixed-size chunks so that appending never copies
// what is already stored and a large history does not need one contiguous
// allocation. Buffers are not safe for concurrent mutation; the state
// machine serialises writers and lets readers in under its read lock.
package hot
