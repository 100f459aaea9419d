// Package backupfmt is the backup format shared by the storage node (which
// exports and imports groups) and the backup service (which writes,
// verifies and restores backup sets): the group object that wraps one
// group's state-machine snapshot, its BLAKE3 digest, the walk over every
// cold object a snapshot references, and the structural validation of a
// snapshot. Like storage/coldfmt it does no I/O of its own and imports
// nothing of ours but the protobuf contracts and coldfmt, so that the
// backup service can check a backup as deeply as the node without
// importing the state machine.
//
// # Group object
//
// ursula.backup.v1.GroupObject, encoded deterministically (EncodeGroup):
// format_version (FormatVersion), the cluster id, group and group count it
// was exported from, the exporting node, that replica's Raft commit and
// applied indexes, the export time, and snapshot, the group's state-machine
// snapshot (ursula.storage.v1.Snapshot, format SnapshotFormat, as
// storage/stream encodes it: its package doc specifies the fields). Its
// digest is Digest: the lower-case hex BLAKE3-256 of the encoded object.
//
// # Snapshot validation
//
// ValidateSnapshot accepts every state a machine of this build reaches and
// refuses a snapshot an import cannot serve. The rules, where tail is a
// stream's cold_end plus its hot bytes plus the lengths of its external
// payloads:
//
//   - format is SnapshotFormat;
//   - buckets and fenced_buckets are sorted, distinct and non-empty, and
//     no bucket is in both; bucket_created_ms names live buckets only;
//     usage is sorted by bucket; GC entries have ascending sequence
//     numbers below gc_next_seq, a key, a bucket and a known kind; GC
//     holds are named and end after 0; an import record carries a digest;
//   - streams are sorted by (bucket, stream), distinct, named, and none is
//     in a fenced bucket. Buckets are recorded in group 0 only and a
//     stream may outlive its bucket (an accepted race of bucket deletion),
//     so a stream's bucket need not be listed;
//   - a stream's incarnation is in [1, applied_index +
//     incarnation_offset]; a fork's base is its fork position and its
//     origin names a source, and a stream without a fork starts at 0; a
//     soft-deleted stream has fork references;
//   - base <= cold_end <= tail <= MaxPosition; the external payloads in the hot window
//     are named, of kind EXTERNAL, non-empty, in order, from cold_end, and
//     the hot bytes fill the gaps before them; retained <= tail; record
//     ends are ascending in (cold_end, tail];
//   - the cold index: level k holds entries of level k (chunks and
//     external payloads at 0, pages above), each named and non-empty; read
//     from the highest level down they are one contiguous run that ends
//     at cold_end and starts between base and max(base, retained) (no
//     readable cold byte lacks an entry); without entries cold_end <=
//     max(base, retained);
//   - JSON streams: every run of hot bytes ends a message ('\n'); record
//     ordinals run on without a gap from the index (its first entry at or
//     above base_record, each entry's first_record its predecessor's
//     next_record, the last one's next_record hot_record) through the hot
//     window (hot_record, the messages of each run, each external
//     payload's [first_record, next_record)) to record_next; base_record
//     <= hot_record <= record_next; record_first <= record_next (every
//     stream);
//   - producers are named, sorted, distinct and at most MaxProducers; earlier incarnations are
//     ascending, below the current one, with non-decreasing kept <= tail;
//     previous_incarnation is 0 (and inherited_offset 0) or below the
//     incarnation (and inherited_offset <= tail); an application snapshot
//     lies at or below the tail, has a digest, and as many part sizes and
//     digests as part keys, each key named.
//
// What sealed pages hold is not validated here: Walk reads and verifies
// each page against its reference.
package backupfmt
