// Package stream is the replicated state machine of one Raft group: its
// buckets and streams, their bytes, producers, closure, TTLs and fork links.
//
// Every replica applies the same commands (storagev1.Command) in log order
// and reaches the same state. Apply never reads the local clock or any other
// group: a command carries the proposing leader's clock (now_ms), and
// anything that needs another group (a fork's source, a bucket) is resolved
// by the engine before it proposes.
//
// # Stored form and offsets
//
// A stream's bytes are kept in stored form: the request bytes for ordinary
// streams, and for JSON streams one compact JSON value per line, each
// followed by '\n'. A position is a byte index in stored form; the protocol
// offset is FormatOffset(position). Records are the end positions of the
// stream's own appends (one per append, whatever its size), used to cut
// reads on append boundaries and to resolve fork sub-offsets.
//
// # JSON record coordinates
//
// Every message of a JSON stream has a zero-based ordinal (its record),
// never renumbered: record_next counts the messages of the stream's view,
// record_first is the first retained one (SetRetention carries the ordinal
// at its position), and a fork starts at base_record, the source's ordinal
// at its base. No per-message index is kept (see records.go): hot_record
// is the ordinal of the hot window's first message, and every cold-index
// entry (chunk, external payload, page) carries first_record/next_record,
// the ordinals of its first message and of the one after its last. The
// leader sets them on the chunks and pages it flushes, apply checks them
// against the bytes it drops; a compaction's chunk takes the range of the
// entries it replaces. A record is located by finding the one entry (or
// the hot window) that holds it and counting '\n' inside it, from the
// nearest of the hot window's record checkpoints (derived on each replica,
// never replicated: see records.go).
//
// A snapshot written before record numbering existed has no record
// fields: installing it numbers each JSON stream that holds messages but
// has a record tail of 0 from its hot window's start (numberLegacyRecords).
//
// An Append with frames is an append batch: the frames are appended as
// one write, each its own append (record end), in one log entry.
//
// # Producers
//
// A stream keeps the state of its idempotent producers (id, epoch, last
// sequence, when it last wrote, the record range of its last write), in
// its state and its snapshots, bounded so that memory does not grow with
// the number of producers a stream ever saw:
//
//   - a Producer-Id (and a Stream-Seq, of which a stream keeps the last)
//     is at most 256 bytes of UTF-8 without control characters (the
//     engine refuses anything else before it proposes), so a producer
//     costs a few hundred bytes;
//   - at most MaxProducers (4096) producers per stream: a write by a
//     producer the stream does not know, when the stream already keeps
//     MaxProducers, evicts the one that wrote least recently (by the
//     leader's clock of its last accepted write; on a tie, the smallest
//     id);
//   - a producer idle for more than ProducerTTLMs (7 days, by the clock of
//     the command) is forgotten when it writes next: its state counts as
//     absent, so that write must start a sequence at 0. Idle producers are
//     not swept otherwise; they count towards the bound until evicted.
//
// A forgotten or evicted producer's retry of an old write is not
// recognized as a duplicate (the protocol allows this expiry). Both rules
// use only command clocks and replicated state, so every replica evicts
// the same producers.
//
// # Lifetimes
//
// A stream's sliding TTL (at most MaxTTLSeconds, 100 years) and Expires-At
// (after the Unix epoch) are checked by the engine before it proposes.
// Apply and every reader compute expiry with saturating arithmetic
// (Meta.ExpiryMs), so a value that passed no check means "not for a long
// time", never "already expired".
//
// # Forks
//
// A fork holds a ForkOrigin: its source (bucket, stream, incarnation) and
// the position where it diverges. Its own data starts at that position
// (base); reads below base go to the source, recursively. A source counts
// its forks (fork_refs); deleting a stream with forks soft-deletes it, and
// the last release of a soft-deleted source removes it.
//
// # New history
//
// StartHistory (proposed by the group's leader alone: an accepted recovery
// plan, or a restore) starts a new history of the group. The stream bytes
// do not change; what clients may have derived from the history before
// does:
//
//   - every stream that is not soft-deleted takes a new incarnation, the
//     entry's index plus the group's incarnation offset (or its
//     incarnation plus one, should an imported state hold a larger one):
//     above every incarnation the group issued, equal on every replica. It keeps its previous token and its tail as
//     previous_incarnation and inherited_offset (HEAD answers them); a
//     stream not written since its last history event keeps naming the
//     token from before that event, with the same tail. A request naming
//     the old token gets 412 with the new one;
//   - every producer state is marked epoch_closed: a retry of a seq it
//     kept is still a duplicate, a new write in that epoch answers 403
//     (PRODUCER_STALE_EPOCH with producer_outcome "epoch-closed;by=history",
//     the epoch and the last seq kept), a higher epoch at seq 0 opens it;
//   - the old incarnation's objects stay in the stream's index and new ones
//     go under the new incarnation's prefix. When objects or forks may
//     name the old incarnation (index entries, external payloads, a
//     snapshot object, fork references), the stream lists it in earlier
//     with its tail (kept): its prefix stays live for the orphan sweep and
//     is collected with the stream, a fork naming it still reads the bytes
//     below kept and still releases its reference;
//   - the group records the event (HistoryRecord: event_index, plan_term,
//     point, reason, the previous event); a StartHistory of the recorded
//     plan_term changes nothing and answers the recorded event_index, a
//     lower one is refused.
//
// # Incarnations
//
// A stream's incarnation (its token, and the number in its cold prefix) is
// the log index of the entry that created it or gave it a new history,
// plus the group's incarnation_offset: 0 in a group never imported, so
// that the incarnations of existing logs are unchanged.
//
// # Backups
//
// ImportGroup replaces the state of an empty group (no bucket record, no
// purge fence, never imported, and no stream but vacant ones: never
// written, linked to no fork, in a reserved "__" bucket, as the node's own
// roles create at start) with a backup's snapshot of a group, as one
// entry, and answers how many streams took a new incarnation. Apply
// decodes the snapshot and validates it (storage/backupfmt
// ValidateSnapshot); anything wrong is refused (INVALID_ARGUMENT) and
// changes nothing, and an import into a group that is not empty is
// refused with GROUP_NOT_EMPTY. A repeat of the applied import (the same
// BLAKE3 digest of the group object) is a duplicate that changes nothing
// and answers the recorded import; a group takes one import. The state
// installed is the source's (buckets, streams with their hot bytes, cold
// indexes, producers, snapshots, attributes, fences, usage counters, the
// buckets' creation times, GC reclaim counters), except:
//
//   - the applied index is this group's (the log is the target's);
//   - the GC queue is empty: the source's names objects no stream
//     references, which a backup does not copy, and this group's own may
//     name a prefix the import reuses (what it names is left to the orphan
//     sweep); gc_next_seq is the larger of both;
//   - the GC holds are this group's, its usage counters are added to the
//     source's;
//   - incarnation_offset becomes the source's applied index plus its
//     offset (or this group's offset, if larger): above every incarnation
//     the source issued, so no token or cold prefix made after the import
//     is one the source used;
//   - a new history starts through the same code as StartHistory, reason
//     "restore", point the source's applied index, plan term the one of
//     this group's latest event (0 without one; its previous event is that
//     one, not the source's): every stream takes a new incarnation with
//     previous_incarnation and inherited_offset, earlier keeps the source
//     incarnation its objects are under, producer epochs close;
//   - imported records the import (digest, index, clock, the source's
//     applied index, streams).
//
// HoldColdGC sets one holder's hold on the group's cold GC until until_ms
// (at most MaxGCHolds holders; until_ms at or before the command's clock
// releases it, and holds already over are dropped by every such command).
// GCHeld(now) reports an unexpired hold by the caller's clock: while one
// holds, the node hands out none of the group's GC queue and answers the
// orphan sweep UNAVAILABLE (storage/cold).
//
// # Bucket deletes
//
// A bucket record has a generation, the index its CreateBucket applied at
// (0 for records from before generations). FenceBucket{bucket, generation}
// records a deletion fence in a group (a fence only rises; with lift it
// removes the fence of exactly that generation); a CreateStream carries
// bucket_generation, and apply refuses it with BUCKET_NOT_FOUND when the
// group's fence of the bucket is at or above it, and drops the fence when
// it is below. buckets.go describes the two-phase delete built on it.
//
// # Feature levels
//
// A group has a feature level (features.go): the replicated behaviours its
// leader may use. It starts at BaselineFeatureLevel (1, stored as 0) and
// only goes up: SetFeatureLevel raises it, answers the same level as a
// duplicate and refuses a lower one (FEATURE_LEVEL_UNSUPPORTED) or 0
// (INVALID_ARGUMENT). A gated command is refused in apply below its level
// (RequireFeatureLevel is the leader's check before proposing). A
// SetFeatureLevel above MaxFeatureLevel, or a snapshot whose feature_level
// is above it, is not applied at all: Apply and Restore return a
// *FeatureLevelError (errors.Is ErrFeatureLevelUnsupported) whose
// HaltGroup makes the Raft host stop applying the group on this node
// instead of stopping the node. ImportGroup refuses a snapshot above the
// group's level and keeps the group's level. FeatureProbe (Command field
// 40, counted in Snapshot.feature_probes) exists only in a build made with
// -tags featuretest, at level 2; a release build does not know it
// (ErrUnknownCommand).
//
// # Snapshot encoding
//
// Snapshot() is storagev1.Snapshot marshalled with deterministic protobuf
// encoding: format 2, buckets sorted, streams sorted by (bucket, stream),
// producers sorted by id, data the bytes of the stream's hot window (from
// cold_end to the tail, external payloads left out and listed in
// hot_external), its cold index and attributes, the GC queue, the purge
// fences, the per-bucket usage counters (sorted by bucket) with the write
// unit they were counted in (write_unit_bytes; a snapshot with another
// unit is refused), the buckets' creation times, the latest history event
// (absent in snapshots from before it existed: no history), the
// incarnation offset, the import record, the GC holds, the bucket records'
// generations (bucket_generations, group 0), the bucket-delete fences
// (bucket_fences; both absent in snapshots from before them: generation 0
// and no fence), and the feature level and probe count (both absent, 0, in
// a group never raised). The same state always yields the same bytes. Format 1 (no cold tier: data
// from base) is still restored.
//
// A capture reuses the encoding of every stream unchanged since the last
// one (snapshot_cache.go): each applied command marks stale the streams it
// names, and a command type that may change others marks them all.
//
// # Cold tier
//
// A stream's own bytes [base, tail) are split at cold_end: below it they
// are in the cold index (chunks, external payloads and sealed pages, see
// cold.go and storage/tier), above it in the hot window. Commands that
// move the split (ColdFlush), retire index entries (SetRetention,
// ColdRetire, ColdSwap) or remove streams queue the objects that become
// garbage in the group's replicated GC queue.
//
// # Application snapshots
//
// A stream holds at most one application snapshot (StreamState.snapshot, a
// SnapshotRef; snapshot_ext.go): its position (an append or message
// boundary, at or above the retention, at or below the tail), its digest
// (lower-case hex SHA-256 of the content type, a NUL byte and the body),
// its content type and size, and either the key of its object in the cold
// store, "{ColdPrefix}s/{position:020d}-{digest}-{nonce}", or, without a
// cold store, its bytes inline (data). PublishSnapshot replaces it: the
// same position and digest is a duplicate; a different digest at the same
// position, a failed match or a position past the tail is refused; the
// replaced object is queued for GC after grace_ms. Removing the stream
// collects the object with the stream's prefix.
package stream
