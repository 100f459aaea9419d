// Package tier is the read side of the cold store: the block cache reads go
// through, tiered reads that turn a cold-index reference into bytes, and
// the format-epoch check of a cold root.
//
// The object formats and keys are package coldfmt's.
package tier
