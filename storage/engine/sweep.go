package engine

import (
	"context"
	"errors"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// TTL expiry sweep bounds: per group and pass at most sweepEntries Expire
// entries, each removing up to sweepBatch streams (the one it names and
// sweepBatch-1 more); no entry starts once the pass has run for
// Engine.sweepBudget (defaultSweepBudget, on the engine's clock); a stream
// is removed once the leader's clock is sweepGrace past its expiry.
const (
	sweepEntries       = 16
	sweepBatch         = 257
	defaultSweepBudget = 250 * time.Millisecond
	sweepGrace         = time.Second
)

// sweepStats are the sweep's metrics.
type sweepStats struct {
	entries   uint64 // Expire entries the sweep wrote
	dueGroups int64  // groups the latest pass left with expired streams
}

// TTLExpirySweeps counts the Expire entries this node's sweeps wrote.
func (e *Engine) TTLExpirySweeps() uint64 { return e.sweepEntries.Load() }

// TTLExpirySweepDueGroups is the number of groups the latest pass left
// with expired streams for the next one.
func (e *Engine) TTLExpirySweepDueGroups() int64 { return e.sweepDue.Load() }

// sweepPass removes expired streams from the groups this node leads, in
// bounded batches (see the constants above). It returns the entries it
// wrote and the groups it left with expired streams.
func (e *Engine) sweepPass(ctx context.Context) sweepStats {
	start := e.now()
	var st sweepStats
	for g := range e.groups.GroupCount() {
		m := e.groups.Machine(uint32(g))
		if ctx.Err() != nil {
			break
		}
		if !e.groups.Status(uint32(g)).IsLeader {
			continue
		}
		due := m.Expired(stream.AddMs(e.nowMs(), -sweepGrace.Milliseconds()), sweepEntries*sweepBatch+1)
		left := len(due) > 0
		for i := 0; i < sweepEntries && len(due) > 0; i++ {
			if e.now().Sub(start) >= e.sweepBudget {
				break
			}
			n := min(len(due), sweepBatch)
			if err := e.expireBatch(ctx, uint32(g), due[:n]); err != nil {
				break
			}
			st.entries++
			due = due[n:]
		}
		if left && len(due) > 0 {
			st.dueGroups++
		}
	}
	return st
}

// expireBatch proposes one Expire entry removing the given streams.
func (e *Engine) expireBatch(ctx context.Context, g uint32, metas []stream.Meta) error {
	first := metas[0]
	c := &storagev1.Expire{Bucket: first.Key.Bucket, Stream: first.Key.Stream, Incarnation: first.Incarnation}
	for _, m := range metas[1:] {
		c.More = append(c.More, &storagev1.StreamKey{Bucket: m.Key.Bucket, Stream: m.Key.Stream, Incarnation: m.Incarnation})
	}
	_, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_Expire{Expire: c}})
	if err != nil && !errors.Is(err, fault.ErrNotLeader) {
		e.logger.Warn("expiry sweep failed", "group_id", g, "streams", len(metas), "err", err)
	}
	return err
}
