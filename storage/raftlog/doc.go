// Package raftlog implements raft.Storage for one Raft group on top of the
// state recovered from the shard journal (package wal), plus the group's
// state-machine snapshot files.
//
// A Storage keeps the group's hard state, the metadata of its latest snapshot
// and the log entries above that snapshot in memory. The shard worker appends
// to it only after the same data has been written to the journal. It is not
// safe for concurrent use: the shard worker that owns the group is its only
// user.
//
// # Snapshot files
//
//	<dir>/snapshots/group-%04d/%016x-%016x.snap    (term, index) in hex
//
// A snapshot file is:
//
//	[0:8]   magic "URSSNAP\x00"
//	u32     format epoch (1)
//	u32     group id
//	u64     index
//	u64     term
//	u32     confstate length C
//	C bytes confstate, in the layout of package wal:
//	        u8 auto_leave, then voters, learners, voters_outgoing,
//	        learners_next, each a u32 count followed by count u64 ids
//	u64     data length D
//	u32     CRC-32C of the D data bytes
//	u32     CRC-32C of every header byte before this field
//	D bytes state-machine data (the StateMachine's snapshot encoding)
//
// Integers are little-endian; CRC-32C uses the Castagnoli polynomial.
//
// A file is written as <name>.tmp, fsynced, renamed to <name>, and the
// directory is fsynced; only then is the snapshot marker written to the
// journal. The journal's latest snapshot marker names the snapshot a restart
// must load (by index); files above it were never acknowledged and are
// removed, and so are the older ones once a newer marker is durable: a
// group keeps one snapshot file (an older one may hold streams removed
// since).
package raftlog
