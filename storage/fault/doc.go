// Package fault is the storage engine's error vocabulary: the sentinel
// kinds of failure a caller of storage can act on (a missing stream, a
// closed one, a write that lost its leader, an overloaded group, ...) and
// Error, which carries one kind with a message and the details a protocol
// answer needs (the final offset of a closed stream, the leader to retry
// at).
//
// Storage returns these and nothing that speaks a wire protocol: the
// storage node maps each kind to its contract code (proto/ursula/errors/v1)
// at its edge, in one table (services/node). Match kinds with errors.Is.
//
// Every kind has a stable name. Names travel only between storage nodes,
// in the results of commands forwarded to a group's leader, and are never
// renamed (they equal the contract reasons of the release that introduced
// them, so nodes of consecutive releases understand each other).
package fault
