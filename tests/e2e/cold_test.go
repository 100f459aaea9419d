package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/services/platform/placement"
	"github.com/ursula/ursula/storage/objstore/objstoretest"
)

// coldS3Bucket is the S3 bucket of the cold-tier tests; each test has a
// test S3 server of its own and a date-stamped prefix in it.
const coldS3Bucket = "ursula-cold"

// datedPrefix is an S3 key prefix naming the test and the moment it ran.
func datedPrefix(name string) string {
	return name + "-" + time.Now().UTC().Format("20060102T150405Z")
}

// TestColdMemoryBounded (the issue's check: "2 GiB appended through one
// node with a 64 MiB hot cap; resident memory stays bounded and every byte
// reads back"): bin/ursula with the S3 cold store, a 64 MiB hot cap per
// group and the default flush thresholds takes 2 GiB of 64 KiB appends from
// memWriters concurrent producers into memStreams streams. Every append is
// retried on 503 until it is accepted. The server's resident set is
// sampled every 100 ms and its high-water mark (VmHWM) read at the end:
// both must stay within memRSSBound. Then every stream is read back from
// offset -1, page by page, and checked append by append against what was
// acknowledged, and the metrics must show cold flushes and the hot window
// within its cap.
//
// The streams are placed in one Raft group, so that the group's hot cap
// bounds every hot byte of the workload and the memory bound below follows
// from the cap and not from how many groups the streams hash to.
func TestColdMemoryBounded(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("samples the server's resident set from /proc")
	}
	start := time.Now()
	s3 := objstoretest.NewS3Server(t)
	args, env := ColdS3Args(t, s3, coldS3Bucket, datedPrefix("memory-bounded"))
	args = append(args, "-cold.hot-cap-bytes="+strconv.Itoa(memHotCap))
	srv := StartServer(t, Options{Args: args, Env: env})
	c := NewClient(srv.URL())
	ctx := t.Context()

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	streams := streamsInOneGroup(fmt.Sprintf("cold-mem-%x", seed), memStreams, memGroupCount)
	for _, s := range streams {
		resp, err := c.Create(ctx, s, "application/octet-stream", nil)
		if err != nil {
			t.Fatalf("create %s: %v", s, err)
		}
		if resp.Status != http.StatusCreated {
			t.Fatalf("create %s: want 201, got %v", s, resp)
		}
	}
	group := placement.Group(DSBucket, streams[0], memGroupCount)

	sampler := startMemSampler(srv, 100*time.Millisecond)
	defer sampler.stop()

	perWriter := memTotalBytes / memAppendBytes / memWriters
	writers := make([]*memWriter, memWriters)
	var wg sync.WaitGroup
	for i := range writers {
		writers[i] = &memWriter{
			id: i, stream: streams[i%memStreams], seed: seed,
			ends: make([]uint64, perWriter),
		}
		wg.Go(func() { writers[i].run(ctx, t, c) })
	}
	wg.Wait()
	writeTime := time.Since(start)
	writeRSS := sampler.snapshot()
	var refused, overloaded, dups int
	for _, w := range writers {
		refused += w.refused
		overloaded += w.overloaded
		dups += w.dups
	}
	t.Logf("wrote %d MiB in %d appends of %d KiB through %d producers in %v: %d answers 503 (%d OVERLOADED), %d duplicates (204); peak RSS so far %d MiB",
		memTotalBytes>>20, memTotalBytes/memAppendBytes, memAppendBytes>>10, memWriters, writeTime.Round(time.Millisecond),
		refused, overloaded, dups, writeRSS.peakRSS>>20)
	if t.Failed() {
		return
	}

	readStart := time.Now()
	var rg sync.WaitGroup
	for i, s := range streams {
		var ws []*memWriter
		for _, w := range writers {
			if w.stream == s {
				ws = append(ws, w)
			}
		}
		rg.Go(func() { verifyMemStream(ctx, t, c, s, i, ws, seed) })
	}
	rg.Wait()
	readTime := time.Since(readStart)

	m := srv.NodeMetrics(t)
	sampler.stop()
	st := sampler.snapshot()
	hwm, err := procStatusBytes(srv.PID(), "VmHWM")
	if err != nil {
		t.Fatalf("read the server's VmHWM: %v", err)
	}
	t.Logf("read back and verified %d MiB in %v; total %v", memTotalBytes>>20, readTime.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("RSS: peak sampled %d MiB while writing, %d MiB overall (%d samples), VmHWM %d MiB; bound %d MiB",
		writeRSS.peakRSS>>20, st.peakRSS>>20, st.samples, hwm>>20, memRSSBound>>20)
	t.Logf("hot bytes: peak %d KiB awaiting flush on the node, %d KiB in group %d (cap %d KiB); %d metric samples",
		st.peakHot>>10, st.peakGroupHot>>10, group, memHotCap>>10, st.metricSamples)
	t.Logf("metrics: cold_flushes %v, cold_uploads %v, cold_upload_bytes %v, cold_upload_errors %v, cold_backpressure_writes %v, cold_cache_hits %v, cold_cache_misses %v",
		m["cold_flushes"], m["cold_uploads"], m["cold_upload_bytes"], m["cold_upload_errors"], m["cold_backpressure_writes"], m["cold_cache_hits"], m["cold_cache_misses"])

	if st.samples == 0 || st.metricSamples == 0 {
		t.Errorf("sampler took %d RSS and %d metric samples (errors: %v)", st.samples, st.metricSamples, st.err)
	}
	if st.peakRSS > memRSSBound || hwm > memRSSBound {
		t.Errorf("resident memory not bounded: sampled peak %d MiB, VmHWM %d MiB, bound %d MiB",
			st.peakRSS>>20, hwm>>20, memRSSBound>>20)
	}
	if f, _ := m["cold_flushes"].(float64); f <= 0 {
		t.Errorf("cold_flushes = %v after %d MiB, want > 0", m["cold_flushes"], memTotalBytes>>20)
	}
	// A group admits a write while its hot bytes are below the cap, so
	// each producer's one request in flight can take it past by one
	// append.
	groupLimit := uint64(memHotCap + memWriters*memAppendBytes)
	if st.peakGroupHot > groupLimit {
		t.Errorf("group %d held %d hot bytes, above its cap %d plus one append per producer (%d)", group, st.peakGroupHot, memHotCap, groupLimit)
	}
	if limit := uint64(memHotCap * memGroupCount); st.peakHot > limit {
		t.Errorf("hot_bytes_awaiting_flush reached %d, above the cap times the group count (%d)", st.peakHot, limit)
	}
	if st.peakHot > groupLimit {
		t.Errorf("hot_bytes_awaiting_flush reached %d with every stream in group %d, above %d", st.peakHot, group, groupLimit)
	}
}

const (
	memTotalBytes  = 2 << 30
	memAppendBytes = 64 << 10
	memStreams     = 4
	memWriters     = 8 // two producers per stream
	memHotCap      = 64 << 20
	// memGroupCount is bin/ursula's default raft.group-count.
	memGroupCount = 64
	// memRSSBound is what TestColdMemoryBounded holds the server's
	// resident set to: TODO after measuring.
	memRSSBound = 400 << 20
	// memMaxRefusedFor bounds how long one append may keep being refused.
	memMaxRefusedFor = 2 * time.Minute
)

// streamsInOneGroup returns n stream names of the Durable Streams bucket
// that placement puts in the same one of groupCount groups.
func streamsInOneGroup(prefix string, n, groupCount int) []string {
	first := prefix + "-0"
	g := placement.Group(DSBucket, first, groupCount)
	names := []string{first}
	for i := 1; len(names) < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if placement.Group(DSBucket, name, groupCount) == g {
			names = append(names, name)
		}
	}
	return names
}

// memBlock fills b (memAppendBytes) with writer's append seq:
//
//	magic "UrCo" | writer u32 | seq u64 | PCG(seed^writer, seq) output
//
// so a stream's bytes can be checked block by block without keeping them.
func memBlock(b []byte, seed uint64, writer int, seq uint64) {
	copy(b, memMagic)
	binary.BigEndian.PutUint32(b[4:], uint32(writer))
	binary.BigEndian.PutUint64(b[8:], seq)
	rng := rand.NewPCG(seed^uint64(writer), seq)
	for i := 16; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

const memMagic = "UrCo"

// memWriter is one idempotent producer appending len(ends) blocks to its
// stream, one request in flight.
type memWriter struct {
	id     int
	stream string
	seed   uint64
	// ends holds the byte position each seq's 200 answer named as
	// Stream-Next-Offset (0 for a 204 duplicate, which names none).
	ends []uint64
	// refused counts 503 answers, overloaded those with code OVERLOADED;
	// dups counts 204 answers (a retried append an earlier attempt had
	// already appended).
	refused, overloaded, dups int
}

func (w *memWriter) run(ctx context.Context, t *testing.T, c *Client) {
	body := make([]byte, memAppendBytes)
	prod := &Producer{ID: fmt.Sprintf("cold-mem-writer-%d", w.id)}
	for seq := range uint64(len(w.ends)) {
		memBlock(body, w.seed, w.id, seq)
		prod.Seq = seq
		first := time.Now()
		for accepted := false; !accepted; {
			resp, err := c.Append(ctx, w.stream, "application/octet-stream", body, prod)
			if err != nil {
				t.Errorf("writer %d seq %d: %v", w.id, seq, err)
				return
			}
			switch resp.Status {
			case http.StatusOK:
				end, err := ParseOffset(resp.NextOffset())
				if err != nil {
					t.Errorf("writer %d seq %d: 200 answer: %v", w.id, seq, err)
					return
				}
				w.ends[seq] = end.Pos
				accepted = true
			case http.StatusNoContent:
				w.dups++
				accepted = true
			case http.StatusServiceUnavailable:
				w.refused++
				wait, err := retryAfter(resp)
				if err != nil {
					t.Errorf("writer %d seq %d: %v", w.id, seq, err)
					return
				}
				if errorCode(resp) == "OVERLOADED" {
					w.overloaded++
				}
				if time.Since(first) > memMaxRefusedFor {
					t.Errorf("writer %d seq %d: still refused after %v: %v", w.id, seq, memMaxRefusedFor, resp)
					return
				}
				// Retry-After is in whole seconds; a shorter wait only
				// costs the server a refusal.
				time.Sleep(min(wait, 100*time.Millisecond))
			default:
				t.Errorf("writer %d seq %d: want 200, 204 or 503, got %v", w.id, seq, resp)
				return
			}
		}
	}
}

// retryAfter parses a 503 answer's Retry-After (seconds), which must be
// there.
func retryAfter(resp *Response) (time.Duration, error) {
	v := resp.Header.Get("Retry-After")
	secs, err := strconv.Atoi(v)
	if err != nil || secs < 0 {
		return 0, fmt.Errorf("%d answer without a valid Retry-After (%q): %v", resp.Status, v, resp)
	}
	return time.Duration(secs) * time.Second, nil
}

// errorCode is the code of a JSON error body, "" if it has none.
func errorCode(resp *Response) string {
	var body struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(resp.Body, &body) != nil {
		return ""
	}
	return body.Code
}

// verifyMemStream reads a stream from offset -1 page by page and checks
// that it is exactly its writers' appends, each once, in each writer's
// order, byte-exact, at the positions the 200 answers named.
func verifyMemStream(ctx context.Context, t *testing.T, c *Client, stream string, idx int, ws []*memWriter, seed uint64) {
	byID := map[int]*memWriter{}
	next := map[int]uint64{}
	var want uint64
	for _, w := range ws {
		byID[w.id] = w
		want += uint64(len(w.ends)) * memAppendBytes
	}
	expect := make([]byte, memAppendBytes)
	var carry []byte
	var pos uint64 // stream position of carry[0]
	offset := "-1"
	for pages := 0; ; pages++ {
		resp, err := c.Read(ctx, stream, offset)
		if err != nil {
			t.Errorf("stream %d: read at %s: %v", idx, offset, err)
			return
		}
		if resp.Status != http.StatusOK {
			t.Errorf("stream %d: read at %s: %v", idx, offset, resp)
			return
		}
		nextOff, err := ParseOffset(resp.NextOffset())
		if err != nil {
			t.Errorf("stream %d: read at %s: %v", idx, offset, err)
			return
		}
		if got := pos + uint64(len(carry)) + uint64(len(resp.Body)); nextOff.Pos != got {
			t.Errorf("stream %d: read at %s: %d bytes end at byte %d, but Stream-Next-Offset names byte %d",
				idx, offset, len(resp.Body), got, nextOff.Pos)
			return
		}
		carry = append(carry, resp.Body...)
		for len(carry) >= memAppendBytes {
			blk := carry[:memAppendBytes]
			if string(blk[:4]) != memMagic {
				t.Errorf("stream %d: byte %d: no block starts here (%q)", idx, pos, clip(blk[:24]))
				return
			}
			id := int(binary.BigEndian.Uint32(blk[4:]))
			seq := binary.BigEndian.Uint64(blk[8:])
			w := byID[id]
			switch {
			case w == nil:
				t.Errorf("stream %d: byte %d: block of writer %d, which writes another stream", idx, pos, id)
				return
			case seq != next[id]:
				t.Errorf("stream %d: byte %d: writer %d seq %d, want seq %d (lost or duplicated appends)", idx, pos, id, seq, next[id])
				return
			case seq >= uint64(len(w.ends)):
				t.Errorf("stream %d: byte %d: writer %d seq %d was never sent", idx, pos, id, seq)
				return
			}
			memBlock(expect, seed, id, seq)
			if !bytes.Equal(blk, expect) {
				t.Errorf("stream %d: byte %d: writer %d seq %d differs from what was appended", idx, pos, id, seq)
				return
			}
			if end := w.ends[seq]; end != 0 && end != pos+memAppendBytes {
				t.Errorf("stream %d: writer %d seq %d is at byte %d, but its append was acknowledged ending at byte %d",
					idx, id, seq, pos, end)
				return
			}
			next[id]++
			pos += memAppendBytes
			carry = carry[memAppendBytes:]
		}
		carry = append([]byte(nil), carry...) // do not pin the page
		if resp.UpToDate() {
			break
		}
		if len(resp.Body) == 0 {
			t.Errorf("stream %d: read at %s: empty page that is not up to date", idx, offset)
			return
		}
		offset = resp.NextOffset()
	}
	if len(carry) != 0 {
		t.Errorf("stream %d: ends with %d bytes of a partial block at byte %d", idx, len(carry), pos)
	}
	if pos != want {
		t.Errorf("stream %d: %d bytes, want %d", idx, pos, want)
	}
	for _, w := range ws {
		if next[w.id] != uint64(len(w.ends)) {
			t.Errorf("stream %d: writer %d has %d appends in the stream, %d were acknowledged", idx, w.id, next[w.id], len(w.ends))
		}
	}
}

// memSampler samples a server's resident set every interval, and its
// /__ursula/metrics every fifth sample, until stopped.
type memSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	mu sync.Mutex
	st memStats
}

type memStats struct {
	peakRSS, samples uint64
	// peakHot is the highest hot_bytes_awaiting_flush, peakGroupHot the
	// highest hot_bytes of any group.
	peakHot, peakGroupHot uint64
	metricSamples         uint64
	err                   error // the last sampling error
}

func startMemSampler(srv *Server, interval time.Duration) *memSampler {
	s := &memSampler{done: make(chan struct{})}
	pid := srv.PID()
	metricsURL := "http://" + srv.Addrs["node.listen"] + "/__ursula/metrics"
	s.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 0; ; n++ {
			rss, err := procStatusBytes(pid, "VmRSS")
			s.mu.Lock()
			if err != nil {
				s.st.err = err
			} else {
				s.st.peakRSS = max(s.st.peakRSS, rss)
				s.st.samples++
			}
			s.mu.Unlock()
			if n%5 == 0 {
				s.sampleMetrics(metricsURL)
			}
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	})
	return s
}

func (s *memSampler) sampleMetrics(url string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var m struct {
		Hot    uint64 `json:"hot_bytes_awaiting_flush"`
		Groups []struct {
			Hot uint64 `json:"hot_bytes"`
		} `json:"raft_groups"`
	}
	_, err := getJSON(ctx, url, &m)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.st.err = err
		return
	}
	s.st.metricSamples++
	s.st.peakHot = max(s.st.peakHot, m.Hot)
	for _, g := range m.Groups {
		s.st.peakGroupHot = max(s.st.peakGroupHot, g.Hot)
	}
}

func (s *memSampler) snapshot() memStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *memSampler) stop() {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
}

// procStatusBytes reads a "kB" field (VmRSS, VmHWM) of /proc/<pid>/status.
func procStatusBytes(pid int, field string) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, field, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}
