// Package tier is the read side of the cold store: the block cache reads go
// through, tiered reads that turn a cold-index reference into bytes, and
// the format-epoch check of a cold root.
//
// Nothing unverified is served or cached: the cache checks every block it
// fetches with the reader's Verifier on the fill path (a chunk's data
// against its footer's block CRCs, widened to whole checksum blocks when
// a cache block is smaller), and sealed ranges (a chunk's footer, a page,
// a small snapshot) as a whole; a failed check is returned to every reader
// waiting on that fetch, counted (checksum_failures) and not cached. The
// integrity chain and what is authoritative are described in coldfmt.
//
// The object formats and keys are package coldfmt's.
package tier
