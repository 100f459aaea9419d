package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// memoryGrowth appends warmup bytes, lets the server settle and samples its
// RSS, then appends up to total bytes and samples again: with the cold tier
// moving committed bytes out of memory, the second figure must not exceed
// the first by more than the hot cap. Appends of 64 KiB stay below the
// external-payload threshold, so every byte goes through the hot window
// and a flush. A 503 (cold-write backpressure) is retried after a pause.
func (b *bench) memoryGrowth(ctx context.Context, warmup, total int64) (*Result, error) {
	const (
		streams = 8
		writers = 16
		chunk   = 64 << 10
	)
	c := newHTTPClient(writers, 60*time.Second)
	names := make([]string, streams)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%s-mem-%d", b.runID, i)
	}
	if err := b.create(ctx, c, names, "application/octet-stream"); err != nil {
		return nil, err
	}
	body := bytes.Repeat([]byte("ursula-memory-growth-"), chunk/21+1)[:chunk]
	var written, backpressure atomic.Int64
	var errs errCounts
	var lat samples
	appendUpTo := func(limit int64) error {
		var wg sync.WaitGroup
		var first atomic.Value
		for w := range writers {
			wg.Go(func() {
				name := names[w%streams]
				for written.Add(chunk) <= limit {
					for {
						if ctx.Err() != nil {
							return
						}
						start := time.Now()
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.streamURL(name), bytes.NewReader(body))
						req.Header.Set("Content-Type", "application/octet-stream")
						resp, err := c.Do(req)
						if err != nil {
							first.CompareAndSwap(nil, err)
							return
						}
						drain(resp)
						if resp.StatusCode == http.StatusServiceUnavailable {
							backpressure.Add(1)
							time.Sleep(50 * time.Millisecond)
							continue
						}
						if resp.StatusCode/100 != 2 {
							errs.add(statusKind(resp.StatusCode))
							first.CompareAndSwap(nil, fmt.Errorf("append: %s", resp.Status))
							return
						}
						lat.add(time.Since(start))
						break
					}
				}
			})
		}
		wg.Wait()
		written.Store(limit)
		if err, _ := first.Load().(error); err != nil {
			return err
		}
		return ctx.Err()
	}
	settle := func() float64 {
		// Give the flushes time to drain the hot windows and the
		// collector time to return what they freed, then sample.
		time.Sleep(3 * time.Second)
		v, _ := procStatusMiB(b.pid, "VmRSS")
		return v
	}
	rss := sampleRSS(b.procs...)
	start := time.Now()
	if err := appendUpTo(warmup); err != nil {
		rss.Stop()
		return nil, err
	}
	atWarmup := settle()
	mid := time.Now()
	if err := appendUpTo(total); err != nil {
		rss.Stop()
		return nil, err
	}
	elapsed := time.Since(mid)
	atTotal := settle()
	peak := rss.Stop()
	n := total / chunk
	return &Result{
		Workload:  "memory",
		Params:    map[string]any{"warmup_bytes": warmup, "total_bytes": total, "append_bytes": chunk, "streams": streams, "writers": writers},
		ElapsedS:  round3(time.Since(start).Seconds()),
		Ops:       n,
		OpsPerSec: round3(float64((total-warmup)/chunk) / elapsed.Seconds()),
		Latency:   lat.summary(),
		Errors:    errs.snapshot(),
		RSSMaxMiB: peak,
		Extra: map[string]any{
			"rss_after_warmup_mib": atWarmup,
			"rss_after_total_mib":  atTotal,
			"append_mib_per_s":     round3(float64(total-warmup) / (1 << 20) / elapsed.Seconds()),
			"backpressure_retries": backpressure.Load(),
			"warmup_label":         strconv.FormatInt(warmup>>20, 10) + " MiB",
			"total_label":          strconv.FormatInt(total>>20, 10) + " MiB",
		},
	}, nil
}
