// Package engine is the storage engine's front door: it places streams on
// Raft groups, validates requests, turns them into state-machine commands,
// proposes them through its Groups (package cluster) and answers from the
// applied state.
//
// Open assembles one node's storage in dependency order (state machines,
// cluster plane, WAL and Raft host, cluster side, cold tier, request
// engine) and Node.Run runs it: see Open.
//
// Reads are linearizable: every read a client observes passes the read
// barrier of the group it looks at (Groups.ReadBarrier: a read index its
// leader confirmed with a quorum, applied by this node's replica) before
// it looks at the state, one barrier per group and request. Writes check
// their preconditions on the leader's applied state, and the state
// machine checks them again when the command applies.
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
