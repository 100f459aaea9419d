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
// # Forks
//
// A fork holds a ForkOrigin: its source (bucket, stream, incarnation) and
// the position where it diverges. Its own data starts at that position
// (base); reads below base go to the source, recursively. A source counts
// its forks (fork_refs); deleting a stream with forks soft-deletes it, and
// the last release of a soft-deleted source removes it.
//
// # Snapshot encoding
//
// Snapshot() is storagev1.Snapshot marshalled with deterministic protobuf
// encoding: format 2, buckets sorted, streams sorted by (bucket, stream),
// producers sorted by id, data the bytes of the stream's hot window (from
// cold_end to the tail, external payloads left out and listed in
// hot_external), its cold index, the GC queue and the purge fences. The
// same state always yields the same bytes. Format 1 (no cold tier: data
// from base) is still restored.
//
// # Cold tier
//
// A stream's own bytes [base, tail) are split at cold_end: below it they
// are in the cold index (chunks, external payloads and sealed pages, see
// cold.go and storage/tier), above it in the hot window. Commands that
// move the split (ColdFlush), retire index entries (SetRetention,
// ColdRetire, ColdSwap) or remove streams queue the objects that become
// garbage in the group's replicated GC queue.
package stream
