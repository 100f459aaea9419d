package stream

import (
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

// Bounds of a compaction swap.
const (
	// MaxSwapRun bounds the chunks one compaction replaces.
	MaxSwapRun = 4096
	// MaxGCGraceMS bounds a compaction's grace before the replaced chunks
	// may be deleted (a week).
	MaxGCGraceMS = 7 * 24 * 3600 * 1000
)

// ValidateColdSwap checks a compaction's shape before it is proposed,
// wherever it comes from (the cold-GC worker, a forwarding peer): a
// bounded run, a grace within bounds, and a new chunk stored under the
// stream incarnation's own prefix, so that a swap can only point a stream
// at its own objects. Apply checks that the run is still in the index.
func ValidateColdSwap(sw *storagev1.ColdSwap) error {
	switch {
	case len(sw.GetReplaced()) < 2 || len(sw.GetReplaced()) > MaxSwapRun:
		return fault.Errorf(fault.ErrInvalidArgument, "a compaction replaces 2 to %d chunks", MaxSwapRun)
	case sw.GetGraceMs() < 0 || sw.GetGraceMs() > MaxGCGraceMS:
		return fault.Errorf(fault.ErrInvalidArgument, "a compaction's grace must be 0 to %d ms", MaxGCGraceMS)
	case sw.GetIncarnation() == 0:
		return fault.Errorf(fault.ErrInvalidArgument, "a compaction names no stream incarnation")
	}
	if err := (Key{Bucket: sw.GetBucket(), Stream: sw.GetStream()}).Validate(); err != nil {
		return err
	}
	prefix := coldfmt.StreamPrefix(sw.GetBucket(), sw.GetStream(), sw.GetIncarnation())
	if k := sw.GetChunk().GetKey(); !strings.HasPrefix(k, prefix) || strings.Contains(k[len(prefix):], "..") {
		return fault.Errorf(fault.ErrInvalidArgument, "the compacted chunk %q is not under the stream's prefix %q", k, prefix)
	}
	return nil
}
