// Package cluster is one node's side of a cluster: it proposes commands to
// the Raft groups (forwarding to a remote leader the steps the node takes
// on its own behalf in a group it does not lead), runs read barriers,
// answers the cluster plane, and keeps leaderships and memberships
// healthy. The request engine and the cold tier reach the groups only
// through it.
//
// # The cluster plane
//
// A Network carries Raft messages and the plane's calls (probe, forward,
// read index, rebuild request, shed state). GRPC is the one nodes run: the
// Raft transport of package transport (RaftService) and ForwardService,
// client and server, every call identified by cluster id and node id and
// refused before decoding when they do not match. A forwarded command's
// refusal travels in the answer (ForwardError, the storage error kind's
// name), so a gRPC error always means the call itself failed. The Raft host
// sends through the network and the network delivers into the node: New
// attaches the network to the cluster, the one place that cycle closes.
//
// # Reads
//
// ReadBarrier makes this node's replica of a group reflect every write
// acknowledged before the call, so that whatever the engine reads next is
// linearizable: the group's leader confirms its leadership with a quorum
// heartbeat round (Raft's ReadIndex; readers waiting together share one
// round) and the replica waits until it applied that read index. A
// follower asks the leader over ForwardService.ReadIndex; a leader of an
// older release, which lacks it, is asked for a forwarded Barrier
// instead. The recovery gate opens on the same answer (read.go, gate.go).
//
// # Startup
//
// Groups without state start uninitialized. The initializer probes every
// other voter: a group is initialized only when all of them answer that
// they are empty (or hold only the initial membership, term 1, with no
// leader anywhere: the fresh-install race). When a quorum of the others
// report the same leader and term, this node is a wiped replica: it
// records that as its vote floor, asks the leader to rebuild it, and
// accepts replication only after the leader removed it from the voters.
//
// # Leadership upkeep
//
// One pass per LeadershipTick on a multi-node cluster: a draining node
// hands its leaderships away; otherwise a node leading more than its share
// hands one group to the least loaded eligible voter (caught up, not
// draining, same cluster); a leader whose log has held uncommitted entries
// for CommitStall hands leadership away (the commit-stall watchdog); a
// leader keeps its group at the configured voters (it removes a replica
// that lost its log, adds missing ones as learners, promotes caught-up
// learners); and a wiped replica asks its leaders to rebuild it.
//
// # Errors
//
// Every error is a storage error (package fault); the Raft host's errors
// are translated once, in raftError, for proposals and the operator's
// calls alike.
package cluster
