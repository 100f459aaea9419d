// Package engine is the storage engine's front door: it places streams on
// Raft groups, validates requests, turns them into state-machine commands,
// proposes them through its Groups (package cluster) and answers from the
// applied state.
//
// Open assembles one node's storage in dependency order (state machines,
// cluster plane, WAL and Raft host, cluster side, cold tier, request
// engine) and Node.Run runs it: see Open.
//
// Placement: group = FNV-1a 64(bucket + "/" + stream) mod G
// (stream.GroupOf). Bucket records live in group 0.
//
// Work that spans groups is orchestrated here, never inside apply: a fork
// first takes a reference in its source's group (AddForkRef), then creates
// the fork in its own group, and releases the reference if that fails;
// removing a fork releases its reference, which may remove a soft-deleted
// source and cascade up the chain. A leaked reference (a crash between the
// two steps) keeps a source's bytes alive; it never loses data.
//
// Expiry is decided by the leader from its clock and the replicated (plus
// locally observed) last touch, and carried out by an Expire command; reads
// restart a sliding TTL locally and persist that with a Touch command at
// most about once a second per stream.
package engine
