// Package coldfmt is the cold object format: the keys, chunk and index-page
// codecs of the objects the cold tier writes to the object store. It does
// no I/O and imports nothing of ours but the protobuf contracts, so that
// every reader of the cold store (the node, the cold-GC worker, the backup
// service) shares one definition of what an object holds without importing
// the replicated state machine.
//
// # Keys
//
// Every object of a stream incarnation lives under StreamPrefix
// ("{bucket}/{hash of the stream name}/{incarnation}/"), so deleting a
// stream is one prefix delete per incarnation it holds objects of and
// purging a bucket one BucketPrefix ("{bucket}/") delete. A stream holds
// objects of more than one incarnation after a new history of its group:
// the new incarnation's objects go under its own prefix, and the index
// keeps naming those written before under the earlier one. The hash is the hex encoding of the first 16 bytes
// of the SHA-256 of the stream name (names may hold '/' and be longer than
// an object key allows). Keys carry a random 16-hex-digit nonce: an upload
// whose proposal fails (a stale leader, a lost race) can never overwrite an
// object a committed index names; it becomes an orphan the cold GC sweeps.
//
//   - c/{start}-{end}-{nonce}: a chunk (positions zero-padded to 20
//     digits);
//   - x/{nonce}: an external payload, the stored bytes of one large append
//     (in the chunk format, without record ends);
//   - p/{level}/{start}-{end}-{nonce}: an index page;
//   - s/{position}-{digest}-{nonce}: an application snapshot;
//   - sp/{position}/{part}-{nonce}: a staged part of an application
//     snapshot (part numbers from 1, zero-padded to 5 digits).
//
// The root of the cold store holds FormatEpochKey, whose body is
// FormatEpoch and a newline. A root that holds objects but no marker
// belongs to something else and is refused.
//
// # Chunk
//
// A chunk holds the stream bytes [start, end) of one stream, n = end-start
// bytes. Integers are little-endian; CRCs are CRC-32C (Castagnoli).
//
//	data          n bytes: the stream bytes
//	block CRCs    ceil(n/B) × u32: the CRC of data block i, bytes
//	              [i·B, min((i+1)·B, n))
//	record ends   r × u64: each record end inside the chunk, relative to
//	              start, ascending, in (0, n]
//	tail, 24 bytes:
//	  u64 n
//	  u32 r
//	  u32 B, the checksum block size (at least 512; this build writes
//	      ChecksumBlockBytes, 64 KiB)
//	  u32 the footer CRC: the CRC of the block CRCs, the record ends and
//	      the 16 tail bytes before it
//	  u32 magic "UCK2" (0x324b4355)
//
// The footer is everything after the data. Data comes first so that a
// position maps to an object offset without reading a header. An external
// payload is a chunk with r = 0 (one append, no record ends inside it).
//
// # Integrity
//
// Every index reference (ColdRef, in the replicated state and in pages)
// carries crc32c, its object's checksum: for a chunk or external payload
// its footer CRC, for a page the CRC of its body (the digest its seal
// committed, which apply recomputes from its own entries). The reference
// is authoritative: it was committed through Raft before anything could
// read the object, and it binds the object to that commit, so a stale,
// swapped or truncated object is detected even when its own footer is
// consistent. The footer's stored CRC only makes an object checkable
// without its reference (tools, fuzzing). Verification is a chain: the
// reference's crc32c verifies the footer, whose block CRCs verify the
// data, so a ranged read fetches the footer (small, cached once verified)
// and just the blocks it needs, and verifies each block as it is fetched,
// before it is cached or served; it never needs the whole object. A
// page's entries carry their own crc32c, so a descent verifies every level
// and the page's digest covers the checksums of everything below it.
//
// A mismatch (or an object shorter or longer than its reference says)
// is ErrCorrupt: the reader serves none of the object's bytes; the node
// answers COLD_OBJECT_CORRUPT (502) and counts it (cold_corrupt_reads). The
// cold-GC worker verifies every chunk it compacts (a merge must never give
// damaged bytes a fresh checksum) and trusts a page's entries only when
// the page matches its GC entry's crc32c.
//
// Application snapshots are verified against the digests their
// SnapshotRef commits (the SHA-256 of content type, NUL, body; or of each
// part).
//
// # Index page
//
// The deterministic protobuf encoding of ursula.storage.v1.ColdPage: the
// PageFanout index entries (ColdRef) a seal moved one level up. Its
// digest is the CRC-32C (Castagnoli) of the encoding, which apply
// recomputes from its own state before it accepts a seal, and which the
// page's reference carries as its crc32c.
//
// # Format epoch
//
// FormatEpochKey holds FormatEpoch, "2" for this format (epoch 1 had
// chunks "UCK1" without checksums and references without crc32c). A node
// refuses a root of another epoch; there is no migration.
package coldfmt
