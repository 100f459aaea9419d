package engine

import (
	"context"

	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// FlushCold flushes a stream's hot bytes to the cold store now, on its
// group's leader.
func (e *Engine) FlushCold(ctx context.Context, k stream.Key) error {
	if !e.cold.Enabled() {
		return fault.Errorf(fault.ErrInvalidArgument, "no cold store is configured")
	}
	if err := k.Validate(); err != nil {
		return err
	}
	if !e.leads(k) {
		return e.notLeader(k)
	}
	return e.cold.Flush(ctx, e.GroupOf(k), k)
}

// PurgeBucket erases a bucket in every group and fences it for good
// (package cold).
func (e *Engine) PurgeBucket(ctx context.Context, bucket string) (cold.PurgeReport, error) {
	if err := validBucketName(bucket); err != nil {
		return cold.PurgeReport{}, err
	}
	return e.cold.PurgeBucket(ctx, bucket)
}

// Lookup is a stream's state on this node's replica.
func (e *Engine) Lookup(k stream.Key) (stream.Meta, bool) { return e.machine(k).Lookup(k) }
