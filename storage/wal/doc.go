// Package wal is the per-shard segmented journal of the Raft groups hosted by
// a node.
//
// Each shard worker owns one Journal. All groups of the shard (group mod S ==
// shard) write their log entries, hard states and snapshot markers into the
// same journal, and the worker issues one write (and, when durability is
// required, one fsync) per batch across all of its groups: group commit.
//
// # Directory layout
//
//	<dir>/raft-log/topology.bin
//	<dir>/raft-log/clean_shutdown          the run state (present between a clean shutdown and the next start)
//	<dir>/raft-log/running                 the boot id of the run that recorded it (written at every start)
//	<dir>/raft-log/shard-%03d/%016d.wal    segment files, numbered by sequence
//
// # Byte order and integers
//
// All integers are little-endian and fixed width: u8, u32, u64. CRCs are
// CRC-32C (Castagnoli polynomial), as computed by hash/crc32 with
// crc32.MakeTable(crc32.Castagnoli).
//
// # topology.bin
//
// 24 bytes:
//
//	[0:8]   magic "URSTOPO\x00"
//	[8:12]  u32 format epoch (currently 1)
//	[12:16] u32 group count G
//	[16:20] u32 shard count S
//	[20:24] u32 CRC-32C of bytes [0:20]
//
// It is written once when the WAL directory is created (write to
// topology.bin.tmp, fsync, rename, fsync directory). A node refuses to start
// when the file is damaged or when G or S differ from its configuration,
// because group placement (shard = group mod S) is baked into the segments,
// and when the file is missing while a segment holds bytes (it is never
// recreated beside records).
//
// # Segments and frames
//
// A segment is a sequence of frames:
//
//	u32 payload length N (the type byte is not counted)
//	u32 CRC-32C over the type byte followed by the N payload bytes
//	u8  record type
//	N bytes payload
//
// Segments are read in ascending sequence order. The last segment is the
// active one; all others are sealed. Every segment begins with a checkpoint
// record. A new segment is started when the active one reaches the configured
// size (default 64 MiB) and on every open.
//
// The active segment's file runs on past its last frame with zero bytes,
// written a MiB at a time ahead of the frames (never past the segment
// size): an fsync after a write into blocks that exist and a size that does
// not change is a data-only flush, which costs ext4 about half the CPU and
// wall time of one that must also commit a grown file. The zeros are cut
// (truncate, then fsync) when the segment is sealed and when the journal
// is closed, so a sealed segment and the active segment of a clean
// shutdown end with their last frame. A frame never begins with zero bytes
// only (a zero length needs a type byte and a CRC over it).
//
// Record types and payloads:
//
//	1 checkpoint:
//	    u32 format epoch (1), u32 shard id, u64 segment sequence,
//	    u32 count, then count times:
//	        u32 group id, u64 term, u64 vote, u64 commit,
//	        u64 snapshot index, u64 snapshot term, confstate
//	  The shard id and sequence must match the segment's directory and file
//	  name. The hard state and latest snapshot marker of every group of the shard
//	  that has any, as of the moment the segment was created. It lets older
//	  segments be deleted without losing any group's hard state.
//	2 entries:
//	    u32 group id, u32 count, then count times:
//	        u64 index, u64 term, u8 entry type (raftpb.EntryType),
//	        u32 data length L, L bytes data
//	  Entries of one group with consecutive indexes. An entry whose index is
//	  at or below the group's last entry replaces that entry and everything
//	  after it (Raft log truncation).
//	3 hard state:
//	    u32 group id, u64 term, u64 vote, u64 commit
//	4 snapshot marker:
//	    u32 group id, u8 flags, u64 index, u64 term, confstate
//	  A state-machine snapshot of the group at (index, term) was stored
//	  durably (see package raftlog). Entries at or below index are no longer
//	  needed. Flag bit 0 ("discard") means the snapshot was received from a
//	  leader and replaces the whole log: every entry of the group recorded
//	  before the marker is dropped.
//	5 truncate:
//	    u32 group id, u64 index
//	  The group's entries above index are dropped: an operator's recovery
//	  plan cut the log back to its committed entry (package multiraft,
//	  plan.go). A release older than this record refuses a journal that
//	  holds one (unknown record type).
//
// confstate is: u8 auto_leave (0 or 1), then four lists in this order:
// voters, learners, voters_outgoing, learners_next; each list is u32 count
// followed by count u64 node ids.
//
// # Recovery
//
// Recovery replays the frames of all segments in order, keeping for each
// group the latest hard state, the latest snapshot marker and the entries
// above that marker. The checkpoint at the start of a segment sets the hard
// state and snapshot marker of the groups it lists.
//
// After a crash (no clean_shutdown record), in the active segment, zero
// bytes from a frame boundary to the end of the file are the space written
// ahead of the frames: the file is truncated there. A frame that is
// incomplete at the end of the file (and not followed by any intact
// frame), a final frame whose CRC does not match, or a damaged frame
// followed only by zero bytes or by bytes holding no intact frame (a torn
// sector of garbage) is a torn write: the file is truncated at the start of
// that frame and recovery goes on; a complete frame that failed its CRC
// puts the shard's groups behind the recovery gate (DamagedTail), since it
// looks the same as media damage of an acknowledged write, unless a whole
// 512-byte sector of it (by file offset) lies in the zeros that end the
// file: a disk writes sectors whole, so that frame is a write the power cut
// short in the space written ahead of the frames, as incomplete as a frame
// cut by the end of the file. Any other damage
// (a bad frame in a sealed segment, a bad frame followed by an intact one
// in the active segment, or a record that does not decode) refuses to
// start, with an error naming the file and the byte offset of the bad
// frame.
//
// After a clean shutdown nothing is torn: every frame was synced before the
// record was written. Recovery then refuses any bad frame, in the active
// segment too, and requires each shard's newest segment to be the one the
// record names, exactly as long: a segment cut or extended after the
// shutdown is refused with an error naming the file and the offset where it
// differs (the shorter of its length and the recorded one); a missing or a
// newer segment is refused naming it at offset 0. Every shard is recovered
// before any journal writes (a crash's torn tail aside, which is cut during
// its shard's recovery), so a refused start leaves the directory as it
// found it, the record included, and the next start refuses again.
//
// # clean_shutdown
//
// Written atomically (write to clean_shutdown.tmp, fsync, rename, fsync the
// directory) after every journal was flushed, fsynced and closed without an
// error; removed (and the directory fsynced) once every shard was recovered,
// before the first new segment is started:
//
//	[0:8]   magic "URSCLEAN"
//	[8:12]  u32 format epoch (currently 1)
//	[12:16] u32 shard count N
//	N times, by ascending shard id:
//	        u32 shard id, u64 sequence of its active segment, u64 its length in bytes
//	u32 CRC-32C of all the bytes before it
//
// A record that does not decode is damage: the start is refused.
//
// # running
//
// Written atomically at every start, once every shard was recovered and
// before the first new write; removed (and the directory fsynced) when the
// host stops on a failure:
//
//	[0:8]   magic "URSRUN01"
//	[8:n-4] the kernel's boot id (/proc/sys/kernel/random/boot_id), as text
//	u32 CRC-32C of all the bytes before it
//
// A start without clean_shutdown that finds a record of the boot it runs in
// follows a crash of the process alone: the page cache kept every frame the
// process wrote, so under fsync "never" nothing it acknowledged can be gone.
// The start syncs every segment file and the directory first; a sync that
// fails (the kernel dropped a page it could not write back) makes it a
// host crash's start. Without the record, with one of another boot, or one
// that does not decode, the host may have crashed: the unsynced tail may be
// gone (the recovery gate of storage/multiraft). A start whose boot id cannot
// be read removes the record instead of writing one.
//
// # Purge
//
// A sealed segment may be deleted once, for every group, all the entries it
// holds are at or below that group's latest snapshot index, or the group's
// whole live log was copied into a later segment (RewriteEntries: an
// ordinary entries record starting at the group's first live entry, which
// recovery reads as replacing every earlier entry of the group). Only the
// oldest segments are deleted (the remaining segments stay contiguous).
//
// A segment is dirty from when it first holds an entry at or below its
// group's snapshot (a purged entry) until it is deleted; after a restart
// its age is read from the file's modification time. The deleted-data
// bound (package multiraft, deleted.go) frees segments dirty for a quarter
// of the bound: DueThrough, SealThrough, LiveThrough, RewriteEntries, then
// Purge. The format is unchanged by it.
package wal
