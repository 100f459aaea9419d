package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// mixedParts are the workloads mixed runs at once, in report order.
var mixedParts = []string{"multi-stream", "fan-out", "replay"}

// barrier lets n parties start together: each arrives once (after its
// set-up, or when it gives up) and waits until all have arrived.
type barrier struct {
	mu   sync.Mutex
	left int
	all  chan struct{}
}

func newBarrier(n int) *barrier {
	b := &barrier{left: n, all: make(chan struct{})}
	if n <= 0 {
		close(b.all)
	}
	return b
}

func (b *barrier) arrive() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left == 0 {
		return
	}
	b.left--
	if b.left == 0 {
		close(b.all)
	}
}

// party is one party's gate: arrive (at most once) and wait for the rest.
// The returned done arrives too, for a party that ends before its gate.
func (b *barrier) party(ctx context.Context) (gate, done func()) {
	var once sync.Once
	arrive := func() { once.Do(b.arrive) }
	return func() {
		arrive()
		select {
		case <-b.all:
		case <-ctx.Done():
		}
	}, arrive
}

// mixed runs multi-stream, fan-out and replay at once, each with its usual
// parameters, measured from a common start once all three are set up. Its
// result holds each part's figures (Parts); the report sets each part's p99
// beside the p99 of the same workload run alone against the same server.
func (b *bench) mixed(ctx context.Context, c config) (*Result, error) {
	res := &Result{
		Workload: "mixed",
		Params:   map[string]any{"parts": mixedParts, "duration_s": c.duration.Seconds()},
	}
	if b.isNull {
		res.Note = "not run: the null server has no SSE to subscribe to"
		return res, nil
	}
	// Streams of their own: the parts alone ran on this server already,
	// and their stream names derive from the run id.
	own := *b
	own.runID = runID() + "-mixed"
	b = &own
	bar := newBarrier(len(mixedParts))
	results := make([]*Result, len(mixedParts))
	errs := make([]error, len(mixedParts))
	var wg sync.WaitGroup
	start := time.Now()
	for i, w := range mixedParts {
		gate, done := bar.party(ctx)
		wg.Go(func() {
			defer done()
			switch w {
			case "multi-stream":
				results[i], errs[i] = b.multiStream(ctx, c.streams, c.payload, c.duration, gate)
			case "fan-out":
				results[i], errs[i] = b.fanOut(ctx, c.subscribers, c.writerRate, c.payload, c.duration, gate)
			case "replay":
				results[i], errs[i] = b.replay(ctx, c.replayCl, c.replayEv, c.replayBytes, c.duration, gate)
			}
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", w, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.Parts = map[string]*Result{}
	for i, w := range mixedParts {
		r := results[i]
		res.Parts[w] = r
		res.Ops += r.Ops
		res.RSSMaxMiB = max(res.RSSMaxMiB, r.RSSMaxMiB)
		for k, v := range r.Errors {
			if res.Errors == nil {
				res.Errors = map[string]int{}
			}
			res.Errors[w+": "+k] += v
		}
	}
	res.ElapsedS = round3(time.Since(start).Seconds())
	return res, nil
}

// MixedRatio is one part of mixed next to the same workload alone.
type MixedRatio struct {
	Workload   string
	P99MS      float64
	AloneP99MS float64
	// Ratio is P99MS / AloneP99MS, 0 when either is missing.
	Ratio float64
}

// mixedRatios compares each part of a server's mixed result with the same
// workload alone in the same run.
func mixedRatios(s *ServerRun) []MixedRatio {
	m := s.Workloads["mixed"]
	if m == nil || m.Parts == nil {
		return nil
	}
	var out []MixedRatio
	for _, w := range mixedParts {
		p := m.Parts[w]
		if p == nil {
			continue
		}
		r := MixedRatio{Workload: w, P99MS: p.Latency.P99MS}
		if a := s.Workloads[w]; a != nil && a.Latency.Count > 0 {
			r.AloneP99MS = a.Latency.P99MS
			if a.Latency.P99MS > 0 && p.Latency.Count > 0 {
				r.Ratio = round3(p.Latency.P99MS / a.Latency.P99MS)
			}
		}
		out = append(out, r)
	}
	return out
}
