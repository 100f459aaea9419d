package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sizes of the bootstrap workload's streams: a snapshot standing for
// bootstrapHistory events of the same size before it.
const (
	bootstrapSnapshotBytes = 64 << 10
	bootstrapHistory       = 64
)

// bootstrap measures GET /{bucket}/{stream}/bootstrap: clients streams in
// one bucket, each with bootstrapHistory events of eventBytes, a 64 KiB
// snapshot at that point and a tail of events more appends; every client
// bootstraps its stream round after round for d. Then, for comparison,
// the same clients catch up on the same streams from offset -1 (history
// and tail, no snapshot) for d.
func (b *bench) bootstrap(ctx context.Context, clients, events, eventBytes int, d time.Duration) (*Result, error) {
	c := newHTTPClient(clients, 30*time.Second)
	defer c.CloseIdleConnections()
	bucket := "bench-boot-" + strings.ToLower(b.runID)
	if err := b.do(ctx, c, http.MethodPut, b.base+"/"+bucket, "", nil); err != nil {
		return nil, fmt.Errorf("create bucket: %w", err)
	}
	urls := make([]string, clients)
	for i := range urls {
		urls[i] = fmt.Sprintf("%s/%s/s-%04d", b.base, bucket, i)
	}
	fillStart := time.Now()
	sem := make(chan struct{}, 16)
	var fillErr atomic.Value
	var wg sync.WaitGroup
	for i, u := range urls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := b.fillBootstrapStream(ctx, c, u, uint64(i), events, eventBytes); err != nil {
				fillErr.CompareAndSwap(nil, err)
			}
		})
	}
	wg.Wait()
	if err, _ := fillErr.Load().(error); err != nil {
		return nil, err
	}
	b.logf("bootstrap: pre-filled %d streams × (%d events, a %d B snapshot, %d events) of %d B in %v",
		clients, bootstrapHistory, bootstrapSnapshotBytes, events, eventBytes, time.Since(fillStart).Round(time.Millisecond))

	b.markMeasured()
	rss := sampleRSS(b.procs...)
	boot := b.rounds(ctx, urls, d, func(u string) (int64, error) { return b.bootstrapOnce(ctx, c, u) },
		int64(bootstrapSnapshotBytes+events*eventBytes))
	b.endMeasured()
	catchUp := b.rounds(ctx, urls, d, func(u string) (int64, error) { return b.catchUpURL(ctx, c, u) },
		int64((bootstrapHistory+events)*eventBytes))
	res := &Result{
		Workload: "bootstrap",
		Params: map[string]any{"clients": clients, "tail_events": events, "event_bytes": eventBytes,
			"history_events": bootstrapHistory, "snapshot_bytes": bootstrapSnapshotBytes, "duration_s": d.Seconds()},
		ElapsedS:  round3(boot.elapsed.Seconds()),
		Ops:       boot.ok,
		OpsPerSec: round3(float64(boot.ok) / boot.elapsed.Seconds()),
		Latency:   boot.lat.summary(),
		Errors:    boot.errs.snapshot(),
		Extra: map[string]any{
			"rounds": boot.rounds, "min_bytes_per_bootstrap": bootstrapSnapshotBytes + events*eventBytes,
			"catch_up_ops_per_sec": round3(float64(catchUp.ok) / catchUp.elapsed.Seconds()),
			"catch_up_latency":     catchUp.lat.summary(),
			"catch_up_errors":      catchUp.errs.snapshot(),
			"catch_up_rounds":      catchUp.rounds,
		},
		RSSMaxMiB: rss.Stop(),
	}
	if b.isNull {
		res.Note = "the null server answers 204 with no body: one request per bootstrap, the latency floor"
	}
	b.logf("bootstrap: catch-up from -1 of the same streams: %.0f ops/s, p50 %.2f ms, p99 %.2f ms",
		res.Extra["catch_up_ops_per_sec"], catchUp.lat.summary().P50MS, catchUp.lat.summary().P99MS)
	return res, nil
}

// fillBootstrapStream creates one stream, appends its history, publishes
// the snapshot at the history's end and appends the tail.
func (b *bench) fillBootstrapStream(ctx context.Context, c *http.Client, u string, seed uint64, events, eventBytes int) error {
	if err := b.do(ctx, c, http.MethodPut, u, "application/octet-stream", nil); err != nil {
		return fmt.Errorf("create %s: %w", u, err)
	}
	rng := rand.New(rand.NewPCG(seed, 5))
	ev := make([]byte, eventBytes)
	var next string
	appendOne := func() error {
		for j := range ev {
			ev[j] = byte(rng.Uint32())
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(ev))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("append %s: %w", u, err)
		}
		drain(resp)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("append %s: %s", u, resp.Status)
		}
		next = resp.Header.Get("Stream-Next-Offset")
		return nil
	}
	for range bootstrapHistory {
		if err := appendOne(); err != nil {
			return err
		}
	}
	if next == "" {
		next = "0000000000000000_0000000000000000" // the null server issues no offsets
	}
	snap := make([]byte, bootstrapSnapshotBytes)
	for j := range snap {
		snap[j] = byte(rng.Uint32())
	}
	if err := b.do(ctx, c, http.MethodPut, u+"/snapshot/"+next, "application/octet-stream", snap); err != nil {
		return fmt.Errorf("publish snapshot of %s: %w", u, err)
	}
	for range events {
		if err := appendOne(); err != nil {
			return err
		}
	}
	return nil
}

// do sends one request and wants a 2xx answer.
func (b *bench) do(ctx context.Context, c *http.Client, method, u, contentType string, body []byte) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, _ := http.NewRequestWithContext(ctx, method, u, rd)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, u, resp.Status)
	}
	return nil
}

// roundStats are the figures of one measured phase.
type roundStats struct {
	lat     samples
	errs    errCounts
	ok      int64
	rounds  int
	elapsed time.Duration
}

// rounds runs op for every url at once, round after round, for d; an op
// returning fewer than want bytes counts as an error (not against null).
func (b *bench) rounds(ctx context.Context, urls []string, d time.Duration, op func(string) (int64, error), want int64) *roundStats {
	st := &roundStats{}
	var ok atomic.Int64
	start := time.Now()
	for st.rounds == 0 || (time.Since(start) < d && ctx.Err() == nil) {
		st.rounds++
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for _, u := range urls {
			wg.Go(func() {
				<-gate
				t0 := time.Now()
				got, err := op(u)
				el := time.Since(t0)
				if err != nil {
					st.errs.add(err.Error())
					return
				}
				if !b.isNull && got < want {
					st.errs.add("short")
					return
				}
				st.lat.add(el)
				ok.Add(1)
			})
		}
		close(gate)
		wg.Wait()
	}
	st.elapsed = time.Since(start)
	st.ok = ok.Load()
	return st
}

// bootstrapOnce reads one bootstrap response and returns its body size.
func (b *bench) bootstrapOnce(ctx context.Context, c *http.Client, u string) (int64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/bootstrap", nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("transport")
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return n, fmt.Errorf("body")
	}
	if b.isNull && resp.StatusCode == http.StatusNoContent {
		return n, nil
	}
	if resp.StatusCode != http.StatusOK {
		return n, fmt.Errorf("%s", statusKind(resp.StatusCode))
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/mixed") {
		return n, fmt.Errorf("not_multipart")
	}
	return n, nil
}

// catchUpURL reads a stream at u from -1 until Stream-Up-To-Date and
// returns the number of bytes. Errors are short kinds, used as error-count
// keys.
func (b *bench) catchUpURL(ctx context.Context, c *http.Client, u string) (int64, error) {
	var total int64
	offset := "-1"
	for range 10000 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"?offset="+offset, nil)
		resp, err := c.Do(req)
		if err != nil {
			return total, fmt.Errorf("transport")
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return total, fmt.Errorf("body")
		}
		total += n
		if b.isNull && resp.StatusCode == http.StatusNoContent {
			return total, nil
		}
		if resp.StatusCode != http.StatusOK {
			return total, fmt.Errorf("%s", statusKind(resp.StatusCode))
		}
		if resp.Header.Get("Stream-Up-To-Date") == "true" {
			return total, nil
		}
		next := resp.Header.Get("Stream-Next-Offset")
		if next == "" || (n == 0 && next == offset) {
			return total, fmt.Errorf("no_progress")
		}
		offset = next
	}
	return total, fmt.Errorf("too_many_pages")
}
