package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// How the process is stopped in a durability round.
type stopKind int

const (
	sigkill stopKind = iota
	sigterm
)

func (k stopKind) String() string {
	if k == sigterm {
		return "SIGTERM"
	}
	return "SIGKILL"
}

const (
	durStreams = 4  // streams per case
	durWriters = 12 // producers, durWriters/durStreams per stream
	maxBody    = 2048
	// Graceful shutdown has a 20 s deadline; allow some slack.
	termTimeout = 30 * time.Second
)

// TestDurability checks, on real processes, that every acknowledged append
// survives a crash or a stop byte-exact at its offset, and that producers
// retrying after the restart are deduplicated:
//
//   - fsync "always", SIGKILL at a random moment during concurrent writes;
//   - fsync "never", SIGKILL: a process crash loses nothing, since the page
//     cache survives it;
//   - fsync "never", SIGTERM (graceful shutdown);
//   - the split deployment (ursula-node behind ursula-gateway), fsync
//     "always", the node SIGKILLed while the gateway stays up.
//
// Each case runs several rounds on one data directory: writers append, the
// process is stopped, restarted, the writers' in-flight requests are retried
// with the same producer tuple (200 if the first attempt was lost, 204 if it
// was persisted) and each writer appends once more (its producer state must
// have survived). At the end every stream is read from offset -1 and checked
// frame by frame.
func TestDurability(t *testing.T) {
	cases := []struct {
		split  bool
		fsync  string
		stop   stopKind
		rounds int
	}{
		{false, "always", sigkill, 3},
		{false, "never", sigkill, 3},
		{false, "never", sigterm, 2},
		{true, "always", sigkill, 2},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("all-in-one/fsync=%s/%v", tc.fsync, tc.stop)
		if tc.split {
			name = fmt.Sprintf("split/fsync=%s/node-%v", tc.fsync, tc.stop)
		}
		t.Run(name, func(t *testing.T) {
			rounds := tc.rounds
			if testing.Short() {
				rounds = 1
			}
			var d *deployment
			if tc.split {
				d = startSplit(t, tc.fsync)
			} else {
				d = startAllInOne(t, tc.fsync)
			}
			runDurability(t, d, tc.stop, rounds)
		})
	}
}

// deployment is what a durability case writes to: the gateway URL, the
// process that gets stopped and restarted, and the ones that stay up.
type deployment struct {
	url    string
	victim *Server
	others []*Server
}

func startAllInOne(t *testing.T, fsync string) *deployment {
	srv := StartServer(t, Options{
		DataDir: filepath.Join(t.TempDir(), "data"),
		Args:    []string{"-raft.wal.fsync=" + fsync},
	})
	return &deployment{url: srv.URL(), victim: srv}
}

// startSplit starts ursula-node and an ursula-gateway in front of it, each
// with free loopback ports.
func startSplit(t *testing.T, fsync string) *deployment {
	nodeBin, err := Binary("ursula-node")
	if err != nil {
		t.Fatal(err)
	}
	gwBin, err := Binary("ursula-gateway")
	if err != nil {
		t.Fatal(err)
	}
	nodeFlags, err := DefinedFlags(nodeBin, "server.listen", "server.admin_listen", "server.cluster_listen")
	if err != nil {
		t.Fatal(err)
	}
	nodeTok, gwTok := SplitTokens(t)
	node := StartServer(t, Options{
		Binary:      nodeBin,
		WorkDir:     filepath.Join(t.TempDir(), "node"),
		DataDir:     filepath.Join(t.TempDir(), "data"),
		ListenFlags: nodeFlags,
		ReadyFlag:   "server.listen",
		Args:        append([]string{"-raft.wal.fsync=" + fsync}, nodeTok...),
	})
	gw := StartServer(t, Options{
		Binary:      gwBin,
		WorkDir:     filepath.Join(t.TempDir(), "gateway"),
		ListenFlags: []string{"gateway.listen"},
		Args:        append([]string{"-upstream.nodes=" + node.Addrs["server.listen"]}, gwTok...),
	})
	return &deployment{url: gw.URL(), victim: node, others: []*Server{gw}}
}

func runDurability(t *testing.T, d *deployment, stop stopKind, rounds int) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("URSULA_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("URSULA_E2E_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with URSULA_E2E_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	c := NewClient(d.url)
	ctx := t.Context()

	streams := make([]string, durStreams)
	for i := range streams {
		streams[i] = fmt.Sprintf("e2e-durability-%d-%x", i, seed)
		resp, err := c.Create(ctx, streams[i], "application/octet-stream", nil)
		if err != nil {
			t.Fatalf("create %s: %v", streams[i], err)
		}
		if resp.Status != http.StatusCreated {
			t.Fatalf("create %s: want 201, got %v", streams[i], resp)
		}
	}
	writers := make([]*writer, durWriters)
	for i := range writers {
		writers[i] = &writer{
			id:     uint32(i),
			stream: streams[i%durStreams],
			prod:   fmt.Sprintf("e2e-writer-%d", i),
			rng:    rand.New(rand.NewPCG(seed, uint64(i)+1)),
		}
	}

	for round := 1; round <= rounds; round++ {
		var acks atomic.Int64
		var stopped atomic.Bool
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, w := range writers {
			wg.Go(func() { w.run(wctx, t, c, &acks, &stopped) })
		}

		// Stop at a random moment once writes are flowing.
		await.Until(await.DefaultTimeout, func() bool { return acks.Load() > 0 || t.Failed() })
		if acks.Load() == 0 {
			cancel()
			wg.Wait()
			t.Fatalf("round %d: no append acknowledged within %v", round, await.DefaultTimeout)
		}
		delay := time.Duration(200+rng.IntN(1300)) * time.Millisecond
		time.Sleep(delay) // pacing, not synchronization: the stop lands at a random moment
		switch stop {
		case sigkill:
			if err := d.victim.Kill(); err != nil {
				t.Fatalf("round %d: SIGKILL: %v", round, err)
			}
		case sigterm:
			if err := d.victim.Terminate(termTimeout); err != nil {
				t.Errorf("round %d: graceful shutdown: %v", round, err)
			}
		}
		stopped.Store(true)
		// Every request now fails, so the writers end by themselves.
		waitGroup(t, &wg, 60*time.Second, "writers to notice the stopped server")
		cancel()

		inflight := 0
		for _, w := range writers {
			if w.inflight != nil {
				inflight++
			}
		}
		t.Logf("round %d: %v after %v; %d appends acknowledged this round, %d in flight",
			round, stop, delay, acks.Load(), inflight)
		if t.Failed() {
			return
		}

		rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
		err := d.victim.Restart(rctx)
		for _, o := range d.others {
			if err == nil {
				err = o.WaitReady(rctx)
			}
		}
		rcancel()
		if err != nil {
			t.Fatalf("round %d: restart on the same data directory: %v", round, err)
		}
		outcomes := map[int]int{}
		for _, w := range writers {
			if w.inflight != nil {
				outcomes[w.retryInflight(ctx, t, c)]++
			}
		}
		for _, w := range writers {
			w.appendOnce(ctx, t, c)
		}
		t.Logf("round %d: retried %d in-flight appends after restart: %d deduplicated (204), %d appended (200), %d failed",
			round, inflight, outcomes[http.StatusNoContent], outcomes[http.StatusOK], inflight-outcomes[http.StatusNoContent]-outcomes[http.StatusOK])
		if t.Failed() {
			// Still read the streams back: what survived tells more.
			break
		}
	}

	total := 0
	for i, stream := range streams {
		var ws []*writer
		for _, w := range writers {
			if w.stream == stream {
				ws = append(ws, w)
			}
		}
		total += verifyStream(ctx, t, c, stream, ws, i)
	}
	t.Logf("verified %d acknowledged appends in %d streams byte-exact at their offsets", total, len(streams))
}

// ack is one acknowledged append.
type ack struct {
	seq     uint64
	payload []byte
	// start and end are byte positions; known only for 200 answers (a 204
	// duplicate does not say where the original went).
	start, end uint64
	known      bool
	// endToken is the Stream-Next-Offset of the 200 answer.
	endToken string
}

// request is an append whose outcome is unknown: the process went away
// before it answered.
type request struct {
	seq     uint64
	payload []byte
}

type writer struct {
	id       uint32
	stream   string
	prod     string
	rng      *rand.Rand
	nextSeq  uint64
	acked    []ack
	inflight *request
}

func (w *writer) producer(seq uint64) *Producer {
	return &Producer{ID: w.prod, Epoch: 0, Seq: seq}
}

// run appends with one request in flight until the server is stopped: a
// request fails at the transport level (the process is gone), or, once
// stopped is set, answers anything but 200 (a gateway whose node is gone).
func (w *writer) run(ctx context.Context, t *testing.T, c *Client, acks *atomic.Int64, stopped *atomic.Bool) {
	for ctx.Err() == nil {
		if w.inflight == nil {
			seq := w.nextSeq
			w.inflight = &request{seq: seq, payload: frame(w.id, seq, w.rng)}
			w.nextSeq++
		}
		req := w.inflight
		resp, err := c.Append(ctx, w.stream, "application/octet-stream", req.payload, w.producer(req.seq))
		if err != nil {
			return // outcome unknown: stays in flight
		}
		switch {
		case resp.Status == http.StatusOK:
			a, err := ackFrom(req, resp)
			if err != nil {
				t.Errorf("writer %d seq %d: %v", w.id, req.seq, err)
				return
			}
			w.acked = append(w.acked, a)
			w.inflight = nil
			acks.Add(1)
		case stopped.Load():
			return // outcome unknown: stays in flight
		case resp.Status == http.StatusServiceUnavailable:
			// Backpressure, or the server is shutting down: the same tuple
			// is retried, and deduplicated if it was applied after all.
			time.Sleep(20 * time.Millisecond) // pacing of the retries
		default:
			t.Errorf("writer %d (producer %s) seq %d: want 200, got %v", w.id, w.prod, req.seq, resp)
			return
		}
	}
}

// retryInflight resends the writer's in-flight append with the same producer
// tuple after a restart and returns the answer's status: 200 (the first
// attempt was lost), 204 (it was persisted and this is a duplicate), or 0
// when the retry failed the test.
func (w *writer) retryInflight(ctx context.Context, t *testing.T, c *Client) int {
	req := w.inflight
	resp := w.send(ctx, t, c, req)
	if resp == nil {
		return 0
	}
	switch resp.Status {
	case http.StatusOK:
		a, err := ackFrom(req, resp)
		if err != nil {
			t.Errorf("writer %d retry of seq %d: %v", w.id, req.seq, err)
			return 0
		}
		w.acked = append(w.acked, a)
	case http.StatusNoContent:
		if got := resp.Header.Get("Producer-Seq"); got != strconv.FormatUint(req.seq, 10) {
			t.Errorf("writer %d retry of seq %d: 204 duplicate with Producer-Seq %q, want %d (the highest accepted)",
				w.id, req.seq, got, req.seq)
		}
		w.acked = append(w.acked, ack{seq: req.seq, payload: req.payload})
	default:
		t.Errorf("writer %d (producer %s) retry of in-flight seq %d after restart: want 200 or 204, got %v",
			w.id, w.prod, req.seq, resp)
		return 0
	}
	w.inflight = nil
	return resp.Status
}

// appendOnce appends the writer's next seq and requires 200: the producer
// state survived the restart.
func (w *writer) appendOnce(ctx context.Context, t *testing.T, c *Client) {
	if w.inflight != nil {
		return // its retry already failed the test
	}
	req := &request{seq: w.nextSeq, payload: frame(w.id, w.nextSeq, w.rng)}
	w.nextSeq++
	resp := w.send(ctx, t, c, req)
	if resp == nil {
		w.inflight = req
		return
	}
	if resp.Status != http.StatusOK {
		t.Errorf("writer %d (producer %s) seq %d after restart: want 200 (producer state kept), got %v",
			w.id, w.prod, req.seq, resp)
		w.inflight = req
		return
	}
	a, err := ackFrom(req, resp)
	if err != nil {
		t.Errorf("writer %d seq %d: %v", w.id, req.seq, err)
		w.inflight = req
		return
	}
	w.acked = append(w.acked, a)
}

// send posts req, retrying 503 answers (for up to await.DefaultTimeout;
// then the 503 is the answer).
func (w *writer) send(ctx context.Context, t *testing.T, c *Client, req *request) *Response {
	var resp *Response
	var err error
	await.Until(await.DefaultTimeout, func() bool {
		resp, err = c.Append(ctx, w.stream, "application/octet-stream", req.payload, w.producer(req.seq))
		return err != nil || resp.Status != http.StatusServiceUnavailable
	})
	if err != nil {
		t.Errorf("writer %d seq %d after restart: %v", w.id, req.seq, err)
		return nil
	}
	return resp
}

func ackFrom(req *request, resp *Response) (ack, error) {
	tok := resp.NextOffset()
	end, err := ParseOffset(tok)
	if err != nil {
		return ack{}, fmt.Errorf("200 answer: Stream-Next-Offset: %w", err)
	}
	n := uint64(len(req.payload))
	if end.Pos < n {
		return ack{}, fmt.Errorf("200 answer: Stream-Next-Offset %s is before the end of a %d-byte append", tok, n)
	}
	return ack{seq: req.seq, payload: req.payload, start: end.Pos - n, end: end.Pos, known: true, endToken: tok}, nil
}

// Frames are self-describing, so a stream's bytes can be parsed back into
// appends without trusting the server:
//
//	magic "UrSl" | writer u32 | seq u64 | n u32 | body [n] | crc32c u32
//
// all big-endian; the CRC covers everything before it.
const frameMagic = "UrSl"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func frame(writer uint32, seq uint64, rng *rand.Rand) []byte {
	n := rng.IntN(maxBody + 1)
	b := make([]byte, 0, 4+4+8+4+n+4)
	b = append(b, frameMagic...)
	b = binary.BigEndian.AppendUint32(b, writer)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	for range n {
		b = append(b, byte(rng.Uint32()))
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

type parsed struct {
	writer     uint32
	seq        uint64
	start, end uint64
}

func parseFrames(data []byte) ([]parsed, error) {
	var out []parsed
	for pos := 0; pos < len(data); {
		rest := data[pos:]
		if len(rest) < 24 || string(rest[:4]) != frameMagic {
			return out, fmt.Errorf("byte %d: no frame starts here (%q...)", pos, head(rest))
		}
		n := int(binary.BigEndian.Uint32(rest[16:20]))
		size := 20 + n + 4
		if n > maxBody || len(rest) < size {
			return out, fmt.Errorf("byte %d: frame of %d body bytes is cut short (%d bytes left)", pos, n, len(rest))
		}
		if crc32.Checksum(rest[:size-4], castagnoli) != binary.BigEndian.Uint32(rest[size-4:size]) {
			return out, fmt.Errorf("byte %d: frame fails its CRC", pos)
		}
		out = append(out, parsed{
			writer: binary.BigEndian.Uint32(rest[4:8]),
			seq:    binary.BigEndian.Uint64(rest[8:16]),
			start:  uint64(pos),
			end:    uint64(pos + size),
		})
		pos += size
	}
	return out, nil
}

func head(b []byte) []byte {
	if len(b) > 24 {
		return b[:24]
	}
	return b
}

// verifyStream reads the stream from -1 and checks that it is exactly the
// writers' acknowledged appends: each once, byte-exact, at the position its
// 200 answer named. It returns the number of appends checked.
func verifyStream(ctx context.Context, t *testing.T, c *Client, stream string, ws []*writer, idx int) int {
	t.Helper()
	data, tail, err := c.ReadAll(ctx, stream)
	if err != nil {
		t.Errorf("stream %d: %v", idx, err)
		return 0
	}
	frames, err := parseFrames(data)
	if err != nil {
		t.Errorf("stream %s (%d bytes, tail %s): %v", stream, len(data), tail, err)
	}
	type key struct {
		writer uint32
		seq    uint64
	}
	at := make(map[key]parsed, len(frames))
	for _, f := range frames {
		k := key{f.writer, f.seq}
		if prev, ok := at[k]; ok {
			t.Errorf("stream %s: writer %d seq %d appears twice, at bytes %d and %d", stream, f.writer, f.seq, prev.start, f.start)
			continue
		}
		at[k] = f
	}
	want := 0
	errs := 0
	report := func(format string, args ...any) {
		if errs++; errs <= 20 {
			t.Errorf("stream %s: "+format, append([]any{stream}, args...)...)
		}
	}
	for _, w := range ws {
		for _, a := range w.acked {
			want++
			k := key{w.id, a.seq}
			f, ok := at[k]
			if !ok {
				if a.known {
					report("acknowledged append writer %d seq %d (bytes %d..%d) is missing", w.id, a.seq, a.start, a.end)
				} else {
					report("append writer %d seq %d, deduplicated (204) after the restart, is missing", w.id, a.seq)
				}
				continue
			}
			delete(at, k)
			if a.known && (f.start != a.start || f.end != a.end) {
				report("writer %d seq %d acknowledged at bytes %d..%d but found at %d..%d", w.id, a.seq, a.start, a.end, f.start, f.end)
			}
			if !bytes.Equal(data[f.start:f.end], a.payload) {
				report("writer %d seq %d at byte %d differs from what was sent", w.id, a.seq, f.start)
			}
		}
	}
	// An append still in flight (its retry failed the test already) may or
	// may not be there, but only once and intact.
	for _, w := range ws {
		if req := w.inflight; req != nil {
			k := key{w.id, req.seq}
			if f, ok := at[k]; ok {
				delete(at, k)
				want++
				if !bytes.Equal(data[f.start:f.end], req.payload) {
					report("writer %d seq %d (outcome unknown) at byte %d differs from what was sent", w.id, req.seq, f.start)
				}
			}
		}
	}
	for k, f := range at {
		report("holds writer %d seq %d at byte %d, which was never acknowledged", k.writer, k.seq, f.start)
	}
	if errs > 20 {
		t.Errorf("stream %s: %d more problems not shown", stream, errs-20)
	}
	if len(frames) != want {
		t.Errorf("stream %s: %d appends in the stream, %d expected", stream, len(frames), want)
	}

	// Offsets issued before a restart stay valid: reading from the end of an
	// acknowledged append returns exactly the bytes that follow it.
	for _, w := range ws {
		for i, a := range w.acked {
			if !a.known || i%7 != 0 {
				continue
			}
			resp, err := c.Read(ctx, stream, a.endToken)
			if err != nil {
				t.Errorf("stream %s: read at %s: %v", stream, a.endToken, err)
				return want
			}
			if resp.Status != http.StatusOK || a.end+uint64(len(resp.Body)) > uint64(len(data)) ||
				!bytes.Equal(resp.Body, data[a.end:a.end+uint64(len(resp.Body))]) {
				t.Errorf("stream %s: read at %s (issued for writer %d seq %d) does not return the bytes after byte %d: %v",
					stream, a.endToken, w.id, a.seq, a.end, resp)
				return want
			}
		}
	}
	return want
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, timeout time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}
