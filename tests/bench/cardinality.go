package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula/ursula/tests/e2e"
)

// The cardinality workload: how append throughput, CPU and memory change
// with the number of streams a server holds. For each stream count N of
// the sweep it starts a fresh server (so that no figure depends on the
// order of the sweep), creates N streams with createInFlight PUTs in
// flight, then lets -cardinality-writers writers append -payload bytes
// round-robin over the N streams for -duration, one request in flight
// each, with producer headers.
//
// Every phase is bounded: the creation by -cardinality-create-timeout, the
// appends by -duration plus the request timeout. A stream count whose
// creation does not finish in time is reported as such (how many streams
// were created, at what rate) and larger counts are not tried against
// that server.

// createInFlight is how many PUTs the creation keeps in flight.
const createInFlight = 64

// CardinalityRun is the sweep against one server.
type CardinalityRun struct {
	Server  string              `json:"server"`
	Writers int                 `json:"writers"`
	Points  []*CardinalityPoint `json:"points"`
}

// CardinalityPoint is one stream count of a sweep, on a fresh server.
type CardinalityPoint struct {
	Streams int `json:"streams"`
	// Created is how many streams the creation phase created, CreateS
	// how long it took, CreatePerSec the rate.
	Created      int64   `json:"created"`
	CreateS      float64 `json:"create_s,omitempty"`
	CreatePerSec float64 `json:"create_per_sec,omitempty"`
	// CreateCPUPerStreamUS is the server's CPU time during the creation
	// per stream created.
	CreateCPUPerStreamUS float64 `json:"create_cpu_per_stream_us,omitempty"`
	// RSSAfterCreateMiB is VmRSS once the N streams exist; RSSPeakMiB is
	// VmHWM at the end of the appends.
	RSSAfterCreateMiB float64 `json:"rss_after_create_mib,omitempty"`
	RSSPeakMiB        float64 `json:"rss_peak_mib,omitempty"`
	// Append is the append phase (its CPUPerOpUS is server CPU per
	// append).
	Append *Result `json:"append,omitempty"`
	// RatioToBase is Append's ops/s over that of the sweep's smallest
	// stream count against the same server.
	RatioToBase float64 `json:"ratio_to_base,omitempty"`
	// Skipped says why there is no Append: the creation did not finish
	// in time, the server failed, or an earlier count was not measured.
	Skipped string `json:"skipped,omitempty"`
	// Note records trouble that does not void the figures (a slow stop).
	Note string `json:"note,omitempty"`
	// At the sweep's largest count, for a server that keeps its data
	// (Ursula): seconds from starting the process again to ready, after
	// a graceful stop (StopS is how long that stop took) and after a
	// SIGKILL.
	StopS            float64 `json:"stop_s,omitempty"`
	StartAfterStopS  float64 `json:"start_after_stop_s,omitempty"`
	StartAfterCrashS float64 `json:"start_after_crash_s,omitempty"`
}

// parseCounts parses the -cardinality-streams list: positive integers,
// with k and m suffixes allowed (10k, 1m), sorted and without duplicates.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		mult := 1
		switch {
		case strings.HasSuffix(strings.ToLower(f), "k"):
			mult, f = 1_000, f[:len(f)-1]
		case strings.HasSuffix(strings.ToLower(f), "m"):
			mult, f = 1_000_000, f[:len(f)-1]
		}
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("stream count %q: want a positive integer (k and m suffixes allowed)", f)
		}
		out = append(out, n*mult)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// runSweep measures each stream count in ascending order. Once a count
// could not be measured (no Append figures), the larger ones are marked
// as not tried: they would take at least as long.
func runSweep(ctx context.Context, counts []int, measure func(ctx context.Context, n int) *CardinalityPoint) []*CardinalityPoint {
	var out []*CardinalityPoint
	stop := ""
	for _, n := range counts {
		if stop == "" && ctx.Err() != nil {
			stop = "not tried: the run was interrupted"
		}
		if stop != "" {
			out = append(out, &CardinalityPoint{Streams: n, Skipped: stop})
			continue
		}
		p := measure(ctx, n)
		out = append(out, p)
		if p.Append == nil {
			stop = fmt.Sprintf("not tried: %d streams could not be measured", n)
		}
	}
	fillRatios(out)
	return out
}

// fillRatios sets each measured point's throughput ratio to the smallest
// measured stream count's.
func fillRatios(points []*CardinalityPoint) {
	var base *CardinalityPoint
	for _, p := range points {
		if p.Append == nil || p.Append.OpsPerSec <= 0 {
			continue
		}
		if base == nil || p.Streams < base.Streams {
			base = p
		}
	}
	for _, p := range points {
		if base != nil && p.Append != nil {
			p.RatioToBase = round3(p.Append.OpsPerSec / base.Append.OpsPerSec)
		}
	}
}

// cardinality runs the sweep against the server spec starts.
func cardinality(ctx context.Context, c config, counts []int, spec serverSpec, logf func(string, ...any)) *CardinalityRun {
	run := &CardinalityRun{Server: spec.name, Writers: c.cardWriters}
	run.Points = runSweep(ctx, counts, func(ctx context.Context, n int) *CardinalityPoint {
		p := cardinalityPoint(ctx, c, n, spec, spec.durable && n == counts[len(counts)-1], logf)
		switch {
		case p.Skipped != "":
			logf("%s: cardinality %d: %s", spec.name, n, p.Skipped)
		case p.Append != nil:
			logf("%s: cardinality %d: created in %.1f s (%.0f/s), %.0f appends/s, p99 %.1f ms, %.0f µs CPU per append, RSS %.0f MiB after create, peak %.0f MiB",
				spec.name, n, p.CreateS, p.CreatePerSec, p.Append.OpsPerSec, p.Append.Latency.P99MS, p.Append.CPUPerOpUS, p.RSSAfterCreateMiB, p.RSSPeakMiB)
		}
		return p
	})
	return run
}

// clusterCardinality runs the sweep against a fresh 3-node cluster per
// stream count, through its gateway (as the cluster workloads run): CPU is
// that of the four processes, RSS that of the largest node. There are no
// restart timings: they are a single node's figure.
func clusterCardinality(ctx context.Context, c config, counts []int, serverBin string, logf func(string, ...any)) *CardinalityRun {
	run := &CardinalityRun{Server: clusterName, Writers: c.cardWriters}
	run.Points = runSweep(ctx, counts, func(ctx context.Context, n int) *CardinalityPoint {
		logf("cluster: cardinality %d: starting 3 nodes and a gateway", n)
		bc, err := startCluster(serverBin, 120*time.Second, logf)
		if err != nil {
			p := &CardinalityPoint{Streams: n, Skipped: "cluster did not start: " + oneLine(err.Error())}
			logf("cluster: cardinality %d: %s", n, p.Skipped)
			return p
		}
		defer bc.Close()
		exited := func() error {
			for _, nd := range bc.Nodes {
				if !nd.Running() {
					return fmt.Errorf("node%d exited: %v", nd.ID, nd.ExitErr())
				}
			}
			if !bc.Gateway.Running() {
				return fmt.Errorf("the gateway exited: %v", bc.Gateway.ExitErr())
			}
			return nil
		}
		p := measureCardinality(ctx, c, n, clusterName, bc.GatewayURL(), bc.procs(), exited, logf)
		switch {
		case p.Skipped != "":
			logf("cluster: cardinality %d: %s", n, p.Skipped)
		case p.Append != nil:
			logf("cluster: cardinality %d: created in %.1f s (%.0f/s), %.0f appends/s, p99 %.1f ms, %.0f µs CPU per append (4 processes), errors %v, largest node RSS %.0f MiB after create, peak %.0f MiB",
				n, p.CreateS, p.CreatePerSec, p.Append.OpsPerSec, p.Append.Latency.P99MS, p.Append.CPUPerOpUS, p.Append.Errors, p.RSSAfterCreateMiB, p.RSSPeakMiB)
		}
		return p
	})
	return run
}

// cardinalityPoint measures one stream count on a fresh server.
// With restarts it then times a start after a graceful stop and one after
// a SIGKILL, each bounded by restartTimeout.
func cardinalityPoint(ctx context.Context, c config, n int, spec serverSpec, restarts bool, logf func(string, ...any)) *CardinalityPoint {
	srv, err := startServer(ctx, spec)
	if err != nil {
		return &CardinalityPoint{Streams: n, Skipped: "server did not start: " + oneLine(err.Error())}
	}
	defer srv.Close()
	exited := func() error {
		if srv.Running() {
			return nil
		}
		return fmt.Errorf("the server exited: %v", srv.ExitErr())
	}
	p := measureCardinality(ctx, c, n, spec.name, srv.URL(), []proc{{spec.name, srv.PID()}}, exited, logf)
	if p.Append == nil {
		return p
	}
	// A server holding many streams may take long to stop; that is not
	// this workload's figure, but a failure to stop is worth a note.
	t0 := time.Now()
	if err := srv.Terminate(restartTimeout); err != nil {
		p.Note = "stop: " + oneLine(err.Error())
		return p
	}
	p.StopS = round3(time.Since(t0).Seconds())
	if !restarts {
		return p
	}
	start := func() (float64, error) {
		rctx, cancel := context.WithTimeout(ctx, restartTimeout)
		defer cancel()
		t0 := time.Now()
		err := srv.Restart(rctx)
		return round3(time.Since(t0).Seconds()), err
	}
	logf("%s: cardinality %d: start after a graceful stop", spec.name, n)
	if p.StartAfterStopS, err = start(); err != nil {
		p.Note = fmt.Sprintf("start after a graceful stop: not ready within %v: %s", restartTimeout, oneLine(err.Error()))
		p.StartAfterStopS = 0
		return p
	}
	if err := srv.Kill(); err != nil {
		p.Note = "kill: " + oneLine(err.Error())
		return p
	}
	logf("%s: cardinality %d: start after SIGKILL", spec.name, n)
	if p.StartAfterCrashS, err = start(); err != nil {
		p.Note = fmt.Sprintf("start after SIGKILL: not ready within %v: %s", restartTimeout, oneLine(err.Error()))
		p.StartAfterCrashS = 0
		return p
	}
	logf("%s: cardinality %d: stop %.1f s, start after it %.1f s, start after SIGKILL %.1f s", spec.name, n, p.StopS, p.StartAfterStopS, p.StartAfterCrashS)
	if err := srv.Terminate(restartTimeout); err != nil {
		p.Note = "stop after the restarts: " + oneLine(err.Error())
	}
	return p
}

// measureCardinality creates n streams on the server at url (whose
// processes are procs) and lets the writers append to them. CPU is summed
// over procs; the RSS figures are those of the largest process (for a
// cluster, the node holding the most), as the memory bound is per process.
// exited reports a process that is gone.
func measureCardinality(ctx context.Context, c config, n int, name string, url string, procs []proc, exited func() error, logf func(string, ...any)) *CardinalityPoint {
	p := &CardinalityPoint{Streams: n}
	b := newBench(url, procs, false, logf)
	logf("%s: cardinality: creating %d streams (%d in flight, at most %v)", name, n, createInFlight, c.cardCreateTimeout)

	cc := newHTTPClient(createInFlight, 30*time.Second)
	cc.Timeout = time.Minute // every phase bounded, bodies too
	defer cc.CloseIdleConnections()
	streamName := func(i int) string { return "bench-card-" + b.runID + "-" + strconv.Itoa(i) }
	cpu0, cpuErr := procsCPU(procs)
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(ctx, c.cardCreateTimeout)
	created, err := b.createMany(cctx, cc, n, streamName, "application/octet-stream", createInFlight)
	cancel()
	// Idle keep-alive connections would hold up a server's graceful stop
	// (the Node peer waits for them).
	cc.CloseIdleConnections()
	el := time.Since(t0)
	p.Created, p.CreateS = created, round3(el.Seconds())
	if el > 0 {
		p.CreatePerSec = round3(float64(created) / el.Seconds())
	}
	if cpu1, err := procsCPU(procs); err == nil && cpuErr == nil && created > 0 {
		p.CreateCPUPerStreamUS = round3(float64(cpu1-cpu0) / 1e3 / float64(created))
	}
	if err != nil {
		switch gone := exited(); {
		case gone != nil:
			p.Skipped = fmt.Sprintf("%v while creating streams (%d of %d created)", gone, created, n)
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			p.Skipped = fmt.Sprintf("creating %d streams did not finish within %v (%d created, %.0f/s)", n, c.cardCreateTimeout, created, p.CreatePerSec)
		default:
			p.Skipped = fmt.Sprintf("creating streams failed after %d of %d: %s", created, n, oneLine(err.Error()))
		}
		return p
	}
	p.RSSAfterCreateMiB = procsMaxMiB(procs, "VmRSS")

	logf("%s: cardinality: %d streams created in %v; %d writers append for %v", name, n, el.Round(time.Millisecond), c.cardWriters, c.duration)
	cpu0, cpuErr = procsCPU(procs)
	res := b.appendRoundRobin(ctx, n, c.cardWriters, c.payload, streamName, c.duration)
	if cpu1, err := procsCPU(procs); err == nil && cpuErr == nil && res.Ops > 0 {
		res.ServerCPUS = round3((cpu1 - cpu0).Seconds())
		res.CPUPerOpUS = round3(float64(cpu1-cpu0) / 1e3 / float64(res.Ops))
	}
	p.RSSPeakMiB = procsMaxMiB(procs, "VmHWM")
	if gone := exited(); gone != nil {
		p.Skipped = fmt.Sprintf("%v while appending", gone)
		return p
	}
	p.Append = res
	return p
}

// procsCPU is the CPU time of all procs.
func procsCPU(procs []proc) (time.Duration, error) {
	var sum time.Duration
	for _, pr := range procs {
		d, err := procCPU(pr.pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// procsMaxMiB is the largest /proc status field of procs, in MiB (0 when
// none can be read).
func procsMaxMiB(procs []proc, field string) float64 {
	var top float64
	for _, pr := range procs {
		if v, err := procStatusMiB(pr.pid, field); err == nil {
			top = max(top, v)
		}
	}
	return top
}

// restartTimeout bounds a stop and a start to ready in the cardinality
// workload.
const restartTimeout = 2 * time.Minute

// createMany creates streams name(0) … name(n-1) with inFlight PUTs in
// flight and returns how many it created. A 503 or 429 (backpressure) or a
// transport error is retried after a pause; any other failure, or ctx
// ending, stops the creation.
func (b *bench) createMany(ctx context.Context, c *http.Client, n int, name func(int) string, contentType string, inFlight int) (int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, created atomic.Int64
	var wg sync.WaitGroup
	progress := time.NewTicker(15 * time.Second)
	defer progress.Stop()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		for {
			select {
			case <-done:
				return
			case <-progress.C:
				k := created.Load()
				b.logf("create: %d of %d (%.0f/s)", k, n, float64(k)/time.Since(start).Seconds())
			}
		}
	}()
	for range min(inFlight, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := b.createOne(ctx, c, b.streamURL(name(i)), contentType); err != nil {
					cancel(err)
					return
				}
				created.Add(1)
			}
		})
	}
	wg.Wait()
	close(done)
	if created.Load() == int64(n) {
		return int64(n), nil
	}
	if err := context.Cause(ctx); err != nil {
		return created.Load(), err
	}
	return created.Load(), errors.New("bench: creation stopped early")
}

// createOne PUTs one stream, retrying backpressure and transport errors
// up to 5 times.
func (b *bench) createOne(ctx context.Context, c *http.Client, url, contentType string) error {
	var last error
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, url, nil)
		req.Header.Set("Content-Type", contentType)
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			last = err
			continue
		}
		drain(resp)
		switch {
		case resp.StatusCode/100 == 2:
			return nil
		case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
			last = fmt.Errorf("create %s: %s", url, resp.Status)
		default:
			return fmt.Errorf("create %s: %s", url, resp.Status)
		}
	}
	return last
}

// writerStreams are the streams writer w of writers appends to, in its
// round-robin order: w, w+writers, w+2·writers, … below n (stream w mod n
// when there are fewer streams than writers).
func writerStreams(w, writers, n int) []int {
	if n <= writers {
		return []int{w % n}
	}
	out := make([]int, 0, (n-w+writers-1)/writers)
	for i := w; i < n; i += writers {
		out = append(out, i)
	}
	return out
}

// appendRoundRobin: writers writers, one request in flight each, append
// payloadBytes to their streams in turn (see writerStreams), each with its
// own producer id and a sequence number per stream, for d.
func (b *bench) appendRoundRobin(ctx context.Context, n, writers, payloadBytes int, name func(int) string, d time.Duration) *Result {
	c := newHTTPClient(writers, 30*time.Second)
	c.Timeout = time.Minute // every phase bounded, bodies too
	defer c.CloseIdleConnections()
	payload := make([]byte, payloadBytes)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	var lat samples
	var errs errCounts
	var ok atomic.Int64
	b.markMeasured()
	rss := sampleRSS(b.procs...)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			mine := writerStreams(w, writers, n)
			seqs := make([]uint64, len(mine))
			prod := "bench-" + strconv.Itoa(w)
			local := make([]time.Duration, 0, 1024)
			for k := 0; time.Now().Before(end) && ctx.Err() == nil; k = (k + 1) % len(mine) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.streamURL(name(mine[k])), bytes.NewReader(payload))
				req.Header["Content-Type"] = []string{"application/octet-stream"}
				req.Header["Producer-Id"] = []string{prod}
				req.Header["Producer-Epoch"] = []string{"0"}
				req.Header["Producer-Seq"] = []string{strconv.FormatUint(seqs[k], 10)}
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					errs.add("transport")
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if resp.StatusCode/100 == 2 {
					drain(resp)
					local = append(local, time.Since(t0))
					seqs[k]++
					continue
				}
				errs.add(refusalKind(resp))
				time.Sleep(20 * time.Millisecond)
			}
			lat.add(local...)
			ok.Add(int64(len(local)))
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	return &Result{
		Workload:  "cardinality",
		Params:    map[string]any{"streams": n, "writers": writers, "payload_bytes": payloadBytes, "duration_s": d.Seconds()},
		ElapsedS:  round3(elapsed.Seconds()),
		Ops:       ok.Load(),
		OpsPerSec: round3(float64(ok.Load()) / elapsed.Seconds()),
		Latency:   lat.summary(),
		Errors:    errs.snapshot(),
		RSSMaxMiB: rss.Stop(),
	}
}

// newBench is a bench against base whose server is procs.
func newBench(base string, procs []proc, isNull bool, logf func(string, ...any)) *bench {
	b := &bench{base: strings.TrimRight(base, "/"), root: e2e.StreamRoot, runID: runID(), procs: procs, isNull: isNull, logf: logf, measured: &cpuMark{}}
	if len(procs) == 1 {
		b.pid = procs[0].pid
	}
	return b
}
