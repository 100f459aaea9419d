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
// stream is one prefix delete and purging a bucket one BucketPrefix
// ("{bucket}/") delete. The hash is the hex encoding of the first 16 bytes
// of the SHA-256 of the stream name (names may hold '/' and be longer than
// an object key allows). Keys carry a random 16-hex-digit nonce: an upload
// whose proposal fails (a stale leader, a lost race) can never overwrite an
// object a committed index names; it becomes an orphan the cold GC sweeps.
//
//   - c/{start}-{end}-{nonce}: a chunk (positions zero-padded to 20
//     digits);
//   - x/{nonce}: an external payload, the stored bytes of one large append;
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
// The stream bytes [start, end), then one uint64 little-endian per record
// end inside the chunk (relative to start, ascending), then an 8-byte
// trailer: the record count (uint32 little endian) and the magic "UCK1"
// (0x314b4355 little endian). Data comes first so that a position maps to
// an object offset without reading a header.
//
// # Index page
//
// The deterministic protobuf encoding of ursula.storage.v1.ColdPage: the
// PageFanout index entries (ColdRef) a seal moved one level up. Its
// digest is the CRC-32C (Castagnoli) of the encoding, which apply
// recomputes from its own state before it accepts a seal.
package coldfmt
