// Package multiraft runs G Raft groups (go.etcd.io/raft/v3, one RawNode per
// group) on S shard workers: group g belongs to shard g mod S, and no group
// has a goroutine of its own.
//
// Each shard worker owns its groups' RawNodes, raft storages (package
// raftlog), state machines and one journal (package wal). One iteration of
// the worker:
//
//  1. when woken, waits out the sync window under fsync "always" (fsyncs
//     start at least SyncWindow apart), yields once (runtime.Gosched) so
//     that the handlers about to propose get to, then drains its mailbox:
//     proposals, inbound Raft messages, snapshot and reachability reports,
//     and proposes everything it can;
//  2. collects the Ready of every group of the shard that has one;
//  3. persists: received snapshots (file, then journal marker), entries and
//     hard states of all those groups are encoded into the journal and
//     written with ONE write; the journal is fsynced once when fsync is
//     "always" and some Ready must be synced, and always when a batch holds
//     a membership (conf change) entry or a snapshot;
//  4. only then sends the Raft messages (Transport.Send);
//  5. applies committed entries to the state machines and completes the
//     waiting proposals on this node, then calls Advance;
//  6. repeats from 2 while any group has a Ready, so that a single voter
//     commits and applies within the same iteration. Under fsync "never"
//     it drains the mailbox again before repeating (at most
//     maxMergedDrains times per iteration, and not in the first one after
//     start, whose campaigns queued proposals wait for): the next batch's
//     entries then share a Ready with the commit of this one.
//
// Hard-state changes that only move the commit index are not a reason for a
// write of their own: they ride with the next write, or are written at the
// next tick.
//
// # Transport
//
// Raft messages carry no group id, so Transport.Send takes the group id with
// the messages of one group, and the receiving node hands them to
// Host.Step(groupID, m). Send runs on a shard worker and must not block.
//
// # Errors
//
// Propose returns *NotLeaderError (with the known leader, 0 if none) when this
// node does not lead the group, ErrOutcomeUnknown when the node lost
// leadership after the entry was appended and the log did not settle the
// entry's fate soon after (a leader that steps down keeps its pending
// proposals: one applied in the new term answers normally, one the new
// leader's log replaced answers *NotLeaderError; stepdown.go),
// ErrProposalDropped when raft
// refused the entry (nothing was appended; while the leader hands its
// leadership over the worker holds the proposal instead and answers it when
// the transfer is over, transfer.go), and ErrStopped once the host is
// stopping. A failed journal write or fsync, a failed snapshot write or
// restore, and a committed entry the state machine cannot apply (it does
// not decode, or names an operation this build does not know: Apply
// returns an error) are fatal: Run returns the error and the node stops,
// and stops again at every restart, rather than skip the entry and diverge
// from the other replicas; an fsync is never retried.
//
// One exception: an Apply or Restore error with a HaltGroup() method that
// returns true (a feature level this build does not know, storage/stream)
// halts that group on this node instead (halt.go): nothing more of it is
// applied and it takes no message, proposal, read or tick, while the node
// and its other groups go on; GroupStatus.Halted says why. A restart halts
// it again at the same point, or applies past it with a build that can.
//
// # Proposal envelope
//
// Every normal entry proposed through Host.Propose carries a 17-byte header
// before the caller's bytes:
//
//	u8  version (1)
//	u64 node id of the proposer (little-endian)
//	u64 proposal id, unique per node (little-endian; random start)
//
// The state machine sees only the caller's bytes; the header routes the
// result of Apply back to the proposer when the entry is applied on the node
// that proposed it. Empty normal entries (the ones a new leader appends) are
// not passed to the state machine.
//
// # Snapshots and log purge
//
// After SnapshotEntries applied entries or SnapshotBytes applied bytes since
// its last snapshot, a group's state machine is captured on its shard
// worker (StateMachine.CaptureSnapshot, cheap); the host's snapshot worker
// encodes the capture and writes the snapshot file durably (package
// raftlog); back on the shard worker, its marker joins the journal (it
// rides with the next write) and the in-memory log is compacted. Older
// snapshot files are removed, and journal segments whose entries are all
// covered by snapshots deleted, only after a synced flush made the markers
// durable (snapshot.go has the details). A group whose entries alone keep an
// old segment alive is snapshotted early. One group's snapshot thus never
// stalls the other groups of its shard on a disk.
//
// # Deleted data
//
// A state machine that removes data (Remover) reports it as each entry
// applies; the snapshot driver (deleted.go, at most once per
// DriveInterval on each shard worker) snapshots a group a quarter of
// DeletedDataMaxAge after a removal (at once for one replayed at startup)
// and frees journal segments that have held purged entries for a quarter
// of it, copying the live logs that keep them forward at most an eighth of
// a segment per pass; Host.Erasure reports what each group still holds.
//
// # Waiting
//
// WaitApplied returns once this node's replica of a group applied an index
// (the shard worker triggers waiters after each applied batch, etcd's
// wait.WaitTime idea); StatusChanged returns a channel closed at the next
// change of any group's leader, term or membership. Nobody polls.
//
// An operator can ask for both (Host.Snapshot, Host.PurgeLog). The request
// joins the mailbox of the group's shard worker like a proposal and runs
// there between two Ready cycles, never on the caller's goroutine: a
// snapshot request answers once the group holds a snapshot of everything it
// had applied when asked (taking one unless it already has one there); a
// purge request purges through min(upto, snapshot
// index), which the compaction at each snapshot already did for the
// in-memory log, so it deletes the journal segments that became
// purgeable. A request the worker has not started within the caller's
// bound is dropped (ErrNotStarted) and never runs later.
//
// # Reads
//
// ReadIndex gives a group's leader a linearizable read point without a
// clock: Raft's ReadIndex in its ReadOnlySafe mode notes the commit index
// and confirms with a heartbeat round that a quorum still follows this
// leader; a read served after WaitApplied(index) reflects every write
// acknowledged before it began. Concurrent readers of a group share one
// round (one raft request in flight per group; readers that arrive
// meanwhile wait for the next), at most Config.MaxReadWaiters wait per
// group (ErrTooManyReads beyond), and the worker fails them with
// *NotLeaderError as soon as the node no longer leads, since raft drops
// such requests silently. A single voter answers at once. readindex.go
// has the details.
//
// # Bootstrap and restart
//
// A group with no state in the journal is bootstrapped with Config.Voters;
// on restart the newest snapshot named by the journal is restored into the
// state machine and the log above it is replayed. A group whose only voter is
// this node campaigns as soon as its membership is applied.
package multiraft
