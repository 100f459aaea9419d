package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Result is one workload's measurements against one server.
type Result struct {
	Workload  string         `json:"workload"`
	Params    map[string]any `json:"params"`
	ElapsedS  float64        `json:"elapsed_s"`
	Ops       int64          `json:"ops"`
	OpsPerSec float64        `json:"ops_per_sec"`
	Latency   Latency        `json:"latency"`
	Errors    map[string]int `json:"errors,omitempty"`
	// Workload-specific figures (deliveries for fan-out, bytes for replay).
	Extra map[string]any `json:"extra,omitempty"`
	// RSSMaxMiB is the highest VmRSS sampled while the workload ran.
	RSSMaxMiB float64 `json:"rss_max_mib,omitempty"`
	// ServerCPUS is the server's user and system CPU time during the
	// workload (/proc/<pid>/stat), and CPUPerOpUS that divided by Ops.
	ServerCPUS float64 `json:"server_cpu_s,omitempty"`
	CPUPerOpUS float64 `json:"cpu_per_op_us,omitempty"`
	// Processes breaks the server CPU and RSS down by process when the
	// server is several processes (a cluster's nodes and gateway).
	Processes map[string]*ProcUsage `json:"processes,omitempty"`
	// Parts are the workloads that ran at once (mixed), each measured as
	// if alone.
	Parts map[string]*Result `json:"parts,omitempty"`
	// Note says why figures are missing or meaningless (null server).
	Note string `json:"note,omitempty"`
}

// ProcUsage is one process's share of a workload.
type ProcUsage struct {
	ServerCPUS float64 `json:"server_cpu_s"`
	CPUPerOpUS float64 `json:"cpu_per_op_us,omitempty"`
	RSSMaxMiB  float64 `json:"rss_max_mib,omitempty"`
}

// errCounts counts errors by kind from many goroutines.
type errCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errCounts) add(kind string) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	e.m[kind]++
	e.mu.Unlock()
}

func (e *errCounts) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) == 0 {
		return nil
	}
	out := make(map[string]int, len(e.m))
	for k, v := range e.m {
		out[k] = v
	}
	return out
}

func statusKind(code int) string {
	switch code {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return "backpressure"
	default:
		return "status_" + strconv.Itoa(code)
	}
}

// refusalKind drains and closes a refused response and names it by its
// status and, when the body is a JSON error document, its code
// ("backpressure/UNAVAILABLE"), so that a report says why a server refused.
func refusalKind(resp *http.Response) string {
	defer drain(resp)
	kind := statusKind(resp.StatusCode)
	var body struct {
		Code string `json:"code"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&body) == nil && body.Code != "" {
		kind += "/" + body.Code
	}
	return kind
}

// newHTTPClient is tuned so that the client is not the bottleneck: a
// connection per concurrent request, kept alive, no compression.
func newHTTPClient(conns int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          conns + 64,
		MaxIdleConnsPerHost:   conns + 64,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ResponseHeaderTimeout: timeout,
		WriteBufferSize:       16 << 10,
		ReadBufferSize:        16 << 10,
	}
	return &http.Client{Transport: tr}
}

// bench holds what every workload needs.
type bench struct {
	base  string // server origin
	root  string // stream root path, "/v1/stream/"
	runID string // makes stream names unique per run
	pid   int    // server pid for RSS sampling, 0 if unknown
	// procs are the server's processes (one, or a cluster's nodes and
	// gateway) whose CPU and RSS are measured; empty if unknown.
	procs  []proc
	isNull bool
	logf   func(format string, args ...any)

	// measured is where the running workload's measured phase starts
	// (markMeasured); a copy of the bench (mixed makes one) shares it.
	measured *cpuMark
}

// cpuMark holds the processes' CPU times when the running workload
// started its measured phase, nil until then, and when it ended it, nil
// when it runs to the workload's end: the streams a workload creates and
// pre-fills before are not its operations' cost (the replay pre-fill,
// 20 MiB appended, replicated and flushed, doubled a cluster's CPU per
// read), nor is what it measures after for comparison (bootstrap's
// catch-up rounds, as many seconds as the bootstraps themselves).
type cpuMark struct {
	mu       sync.Mutex
	from, to []time.Duration
}

// markMeasured records the CPU times the running workload's CPU per
// operation counts from.
func (b *bench) markMeasured() {
	b.mark(func(m *cpuMark, t []time.Duration) { m.from, m.to = t, nil })
}

// endMeasured records the CPU times the running workload's CPU per
// operation counts to, when it goes on after its measured phase.
func (b *bench) endMeasured() {
	b.mark(func(m *cpuMark, t []time.Duration) { m.to = t })
}

// mark reads the processes' CPU times and records them by set.
func (b *bench) mark(set func(*cpuMark, []time.Duration)) {
	if b.measured == nil {
		return
	}
	t, err := cpuTimes(b.procs)
	if err != nil {
		return
	}
	b.measured.mu.Lock()
	defer b.measured.mu.Unlock()
	set(b.measured, t)
}

// takeMeasured returns and clears what markMeasured and endMeasured
// recorded.
func (b *bench) takeMeasured() (from, to []time.Duration) {
	if b.measured == nil {
		return nil, nil
	}
	b.measured.mu.Lock()
	defer b.measured.mu.Unlock()
	from, to = b.measured.from, b.measured.to
	b.measured.from, b.measured.to = nil, nil
	return from, to
}

func (b *bench) streamURL(name string) string { return b.base + b.root + name }

// pass calls gate if there is one.
func pass(gate func()) {
	if gate != nil {
		gate()
	}
}

func drain(resp *http.Response) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// create PUTs streams with bounded concurrency. 200, 201 and (null) 204 are
// fine.
func (b *bench) create(ctx context.Context, c *http.Client, names []string, contentType string) error {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var first atomic.Value
	for _, n := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPut, b.streamURL(n), nil)
			req.Header.Set("Content-Type", contentType)
			resp, err := c.Do(req)
			if err != nil {
				first.CompareAndSwap(nil, fmt.Errorf("create %s: %w", n, err))
				return
			}
			drain(resp)
			if resp.StatusCode/100 != 2 {
				first.CompareAndSwap(nil, fmt.Errorf("create %s: %s", n, resp.Status))
			}
		})
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return err
	}
	return nil
}

// multiStream: n streams, one append in flight per stream, producer headers.
// gate, if not nil, is called once set-up is done and returns when the
// measured part may start (mixed starts several workloads together).
func (b *bench) multiStream(ctx context.Context, streams, payloadBytes int, d time.Duration, gate func()) (*Result, error) {
	c := newHTTPClient(streams, 30*time.Second)
	defer c.CloseIdleConnections()
	names := make([]string, streams)
	for i := range names {
		names[i] = fmt.Sprintf("bench-ms-%s-%05d", b.runID, i)
	}
	if err := b.create(ctx, c, names, "application/octet-stream"); err != nil {
		return nil, err
	}
	pass(gate)
	r := b.appendRoundRobin(ctx, streams, streams, payloadBytes, func(i int) string { return names[i] }, d)
	r.Workload = "multi-stream"
	r.Params = map[string]any{"streams": streams, "payload_bytes": payloadBytes, "duration_s": d.Seconds()}
	return r, nil
}

// Fan-out payloads are fixed-size records: 16 hex digits of seq, 16 hex
// digits of the send time (Unix ns), then filler. A data event may carry
// several records if the server batches them.
const fanoutHeader = 32

func fanoutPayload(seq uint64, size int) []byte {
	p := make([]byte, size)
	copy(p, fmt.Sprintf("%016x%016x", seq, time.Now().UnixNano()))
	for i := fanoutHeader; i < size; i++ {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// fanOut: one stream, a paced writer, many SSE subscribers.
func (b *bench) fanOut(ctx context.Context, subscribers, rate, payloadBytes int, d time.Duration, gate func()) (*Result, error) {
	if payloadBytes < 48 {
		payloadBytes = 48
	}
	res := &Result{
		Workload: "fan-out",
		Params: map[string]any{"subscribers": subscribers, "writer_rate": rate,
			"payload_bytes": payloadBytes, "duration_s": d.Seconds()},
	}
	if b.isNull {
		res.Note = "not run: the null server has no SSE to subscribe to"
		return res, nil
	}
	wc := newHTTPClient(4, 30*time.Second)
	defer wc.CloseIdleConnections()
	name := "bench-fanout-" + b.runID
	if err := b.create(ctx, wc, []string{name}, "text/plain"); err != nil {
		return nil, err
	}
	url := b.streamURL(name)

	sc := newHTTPClient(subscribers, 30*time.Second)
	defer sc.CloseIdleConnections()
	subCtx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	var lat samples
	var errs errCounts
	subs := make([]*subscriber, subscribers)
	var ready sync.WaitGroup
	var wg sync.WaitGroup
	for i := range subs {
		s := &subscriber{url: url, size: payloadBytes, got: map[uint64]int{}}
		subs[i] = s
		ready.Add(1)
		wg.Go(func() { s.run(subCtx, sc, &ready, &errs) })
	}
	// Wait until every subscriber got its first control event.
	allReady := make(chan struct{})
	go func() { ready.Wait(); close(allReady) }()
	select {
	case <-allReady:
	case <-time.After(60 * time.Second):
		stopSubs()
		wg.Wait()
		return nil, fmt.Errorf("fan-out: not every subscriber connected within 60 s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b.logf("fan-out: %d subscribers connected", subscribers)
	pass(gate)

	b.markMeasured()
	rss := sampleRSS(b.procs...)
	start := time.Now()
	var sent []uint64
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for seq := uint64(0); time.Since(start) < d && ctx.Err() == nil; seq++ {
		<-tick.C
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(fanoutPayload(seq, payloadBytes)))
		req.Header.Set("Content-Type", "text/plain")
		resp, err := wc.Do(req)
		if err != nil {
			errs.add("writer_transport")
			continue
		}
		if resp.StatusCode/100 != 2 {
			errs.add("writer_" + refusalKind(resp))
			continue
		}
		drain(resp)
		sent = append(sent, seq)
	}
	tick.Stop()
	writeElapsed := time.Since(start)
	// Give the last events time to arrive.
	want := len(sent)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		for _, s := range subs {
			if s.distinct() < want {
				done = false
				break
			}
		}
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopSubs()
	wg.Wait()
	res.RSSMaxMiB = rss.Stop()

	var delivered, missing, dups, reconnects int64
	for _, s := range subs {
		lat.add(s.lat...)
		reconnects += s.reconnects
		for _, seq := range sent {
			switch n := s.got[seq]; {
			case n == 0:
				missing++
			default:
				delivered++
				dups += int64(n - 1)
			}
		}
	}
	res.ElapsedS = round3(writeElapsed.Seconds())
	res.Ops = delivered
	res.OpsPerSec = round3(float64(delivered) / writeElapsed.Seconds())
	res.Latency = lat.summary()
	res.Errors = errs.snapshot()
	res.Extra = map[string]any{
		"events_sent":         len(sent),
		"deliveries_expected": int64(len(sent)) * int64(subscribers),
		"deliveries":          delivered,
		"missing":             missing,
		"duplicates":          dups,
		"reconnects":          reconnects,
		"all_delivered":       missing == 0 && len(sent) > 0,
	}
	return res, nil
}

type subscriber struct {
	url  string
	size int

	mu         sync.Mutex
	got        map[uint64]int
	lat        []time.Duration
	reconnects int64
}

func (s *subscriber) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// run reads SSE until ctx ends, reconnecting from the last control offset
// when the server ends the response.
func (s *subscriber) run(ctx context.Context, c *http.Client, ready *sync.WaitGroup, errs *errCounts) {
	var once sync.Once
	signal := func() { once.Do(ready.Done) }
	defer signal()
	offset := "now"
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			s.mu.Lock()
			s.reconnects++
			s.mu.Unlock()
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"?offset="+offset+"&live=sse", nil)
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				errs.add("subscriber_transport")
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			drain(resp)
			errs.add("subscriber_" + statusKind(resp.StatusCode))
			time.Sleep(100 * time.Millisecond)
			continue
		}
		offset = s.read(resp.Body, offset, signal)
		resp.Body.Close()
	}
}

// read parses one SSE response and returns the last streamNextOffset. It
// is written to be cheap (no allocation per line, no JSON decoding) so that
// a thousand subscribers on the same machine as the server measure the
// server more than themselves.
func (s *subscriber) read(body io.Reader, offset string, signal func()) string {
	br := bufio.NewReaderSize(body, 64<<10)
	var (
		event  []byte
		data   []byte
		long   []byte // a line longer than the buffer, assembled
		nlines int
	)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			return offset
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			switch string(event) {
			case "data":
				s.record(data, time.Now())
			case "control":
				if off := controlOffset(data); off != "" {
					offset = off
				}
				signal()
			}
			event, data, nlines = event[:0], data[:0], 0
		case bytes.HasPrefix(line, []byte("event:")):
			event = append(event[:0], bytes.TrimSpace(line[len("event:"):])...)
		case bytes.HasPrefix(line, []byte("data:")):
			v := line[len("data:"):]
			if len(v) > 0 && v[0] == ' ' {
				v = v[1:]
			}
			if nlines > 0 {
				data = append(data, '\n')
			}
			data = append(data, v...)
			nlines++
		}
	}
}

var offsetKey = []byte(`"streamNextOffset":"`)

// controlOffset extracts streamNextOffset from a control event's flat JSON
// object (offsets need no unescaping).
func controlOffset(data []byte) string {
	i := bytes.Index(data, offsetKey)
	if i < 0 {
		return ""
	}
	rest := data[i+len(offsetKey):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

func (s *subscriber) record(data []byte, now time.Time) {
	if bytes.IndexByte(data, '\n') >= 0 {
		data = bytes.ReplaceAll(data, []byte("\n"), nil)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(data) >= fanoutHeader {
		seq, err1 := strconv.ParseUint(string(data[:16]), 16, 64)
		sentNS, err2 := strconv.ParseInt(string(data[16:32]), 16, 64)
		if err1 != nil || err2 != nil {
			return
		}
		s.got[seq]++
		s.lat = append(s.lat, now.Sub(time.Unix(0, sentNS)))
		if len(data) < s.size {
			return
		}
		data = data[s.size:]
	}
}

// replay: every client reads its own pre-filled stream from -1 to the tail,
// all clients at once, round after round for d.
func (b *bench) replay(ctx context.Context, clients, events, eventBytes int, d time.Duration, gate func()) (*Result, error) {
	c := newHTTPClient(clients, 30*time.Second)
	defer c.CloseIdleConnections()
	names := make([]string, clients)
	for i := range names {
		names[i] = fmt.Sprintf("bench-replay-%s-%04d", b.runID, i)
	}
	if err := b.create(ctx, c, names, "application/octet-stream"); err != nil {
		return nil, err
	}
	// Pre-fill: 16 streams at a time, appends in order within a stream.
	fillStart := time.Now()
	sem := make(chan struct{}, 16)
	var fillErr atomic.Value
	var wg sync.WaitGroup
	for i, n := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			ev := make([]byte, eventBytes)
			for range events {
				for j := range ev {
					ev[j] = byte(rng.Uint32())
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.streamURL(n), bytes.NewReader(ev))
				req.Header.Set("Content-Type", "application/octet-stream")
				resp, err := c.Do(req)
				if err != nil {
					fillErr.CompareAndSwap(nil, fmt.Errorf("pre-fill %s: %w", n, err))
					return
				}
				drain(resp)
				if resp.StatusCode/100 != 2 {
					fillErr.CompareAndSwap(nil, fmt.Errorf("pre-fill %s: %s", n, resp.Status))
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := fillErr.Load().(error); err != nil {
		return nil, err
	}
	b.logf("replay: pre-filled %d streams × %d × %d B in %v", clients, events, eventBytes, time.Since(fillStart).Round(time.Millisecond))
	pass(gate)

	var lat samples
	var errs errCounts
	var ok, short atomic.Int64
	want := int64(events * eventBytes)
	b.markMeasured()
	rss := sampleRSS(b.procs...)
	start := time.Now()
	rounds := 0
	for rounds == 0 || (time.Since(start) < d && ctx.Err() == nil) {
		rounds++
		gate := make(chan struct{})
		var rwg sync.WaitGroup
		for _, n := range names {
			rwg.Go(func() {
				<-gate
				t0 := time.Now()
				got, err := b.readAll(ctx, c, n)
				el := time.Since(t0)
				if err != nil {
					errs.add(err.Error())
					return
				}
				if !b.isNull && got != want {
					short.Add(1)
					errs.add("wrong_length")
					return
				}
				lat.add(el)
				ok.Add(1)
			})
		}
		close(gate)
		rwg.Wait()
	}
	elapsed := time.Since(start)
	res := &Result{
		Workload: "replay",
		Params: map[string]any{"clients": clients, "events": events, "event_bytes": eventBytes,
			"duration_s": d.Seconds()},
		ElapsedS:  round3(elapsed.Seconds()),
		Ops:       ok.Load(),
		OpsPerSec: round3(float64(ok.Load()) / elapsed.Seconds()),
		Latency:   lat.summary(),
		Errors:    errs.snapshot(),
		Extra:     map[string]any{"rounds": rounds, "bytes_per_read": want, "short_reads": short.Load()},
		RSSMaxMiB: rss.Stop(),
	}
	if b.isNull {
		res.Note = "the null server answers 204 with no body: one request per read, the latency floor"
		res.Extra["bytes_per_read"] = 0
	}
	return res, nil
}

// readAll reads a stream from -1 until Stream-Up-To-Date and returns the
// number of bytes. Errors are short kinds, used as error-count keys.
func (b *bench) readAll(ctx context.Context, c *http.Client, name string) (int64, error) {
	return b.catchUpURL(ctx, c, b.streamURL(name))
}
