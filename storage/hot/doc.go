// Package hot holds the in-memory window of a stream's committed bytes and
// the signal that wakes live readers when it grows.
//
// A Buffer stores bytes in chunks of at most about a MiB that grow by
// doubling, so that a large history does not need one contiguous
// allocation, an idle stream holds little spare room, and a read within one
// chunk (every read of a stream of up to a MiB) is a slice of it, not a
// copy. Stored bytes are immutable, which is what makes handing out such
// slices safe. Buffers are not safe for concurrent mutation; the state
// machine serialises writers and lets readers in under its read lock.
package hot
