// Package tier is the cold side of a stream: the object formats a flush
// writes (chunks, index pages), their keys, the block cache reads go
// through, and tiered reads that turn a cold-index reference into bytes.
//
// # Objects
//
// Every object of a stream incarnation lives under stream.ColdPrefix
// ("{bucket}/{hash of the stream name}/{incarnation}/"), so deleting a
// stream is one prefix delete and purging a bucket one "{bucket}/" delete.
// Keys carry a random suffix: an upload whose proposal fails (a stale
// leader, a lost race) can never overwrite an object a committed index
// names; it becomes an orphan the cold GC sweeps.
//
//   - c/{start}-{end}-{nonce}: a chunk, the stream bytes [start, end)
//     followed by their record ends (uint64 little endian, relative to
//     start) and an 8-byte trailer (record count, magic "UCK1"). Data comes
//     first so a position maps to an object offset without reading a header.
//   - x/{nonce}: an external payload, the stored bytes of one large append.
//   - p/{level}/{start}-{end}-{nonce}: an index page, a deterministic
//     protobuf ColdPage (see stream.EncodePage).
//
// The root of the cold store holds URSULA_FORMAT_EPOCH. A root that holds
// objects but no marker belongs to something else and is refused.
package tier
