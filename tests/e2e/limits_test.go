package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// The findings, each against a real process: a request body that
// never finishes, responses nobody reads, bodies announced and never sent,
// and the starts the body limits refuse.

// gatewayMetrics reads the gateway's /__ursula/metrics document.
func gatewayMetrics(tb testing.TB, srv *Server) map[string]float64 {
	tb.Helper()
	resp, err := http.Get(srv.URL() + "/__ursula/metrics")
	if err != nil {
		tb.Fatalf("gateway metrics: %v", err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		tb.Fatalf("gateway metrics: %v", err)
	}
	out := map[string]float64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

// liveHeap runs a garbage collection in the all-in-one process (through
// the admin plane's heap profile, ?gc=1) and returns its live heap from
// the gateway's metrics, with those metrics.
func liveHeap(tb testing.TB, srv *Server) (uint64, map[string]float64) {
	tb.Helper()
	resp, err := http.Get("http://" + srv.Addrs["server.admin_listen"] + "/debug/pprof/heap?gc=1")
	if err != nil {
		tb.Fatalf("collect: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	m := gatewayMetrics(tb, srv)
	return uint64(m["heap_live_bytes"]), m
}

// dialNoRead connects to addr with a 4 KiB receive buffer, so that a
// response the test does not read fills the socket buffers quickly and
// the server's writes block.
func dialNoRead(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reads c until the server closes it (EOF or a reset) and
// returns what came. The read deadline bounds a broken server; the server
// closes the connection well within it.
func closedByServer(tb testing.TB, c net.Conn) string {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	var b strings.Builder
	_, err := io.Copy(&b, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tb.Fatalf("the server kept the connection open: %v (read %d bytes)", err, b.Len())
	}
	return b.String()
}

// hostAddr is the host:port of a server's listener URL.
func hostAddr(url string) string { return strings.TrimPrefix(url, "http://") }

// TestHTTPTimeouts (the issue: a body that never finishes held its
// connection forever; node HTTP servers had no timeouts): against
// bin/ursula with one-second timeouts, a request body that stops arriving
// is answered 408 and its connection closed, and on the gateway, the
// node's client plane and the admin plane a connection that stops in the
// middle of its headers, or stays idle after a request, is closed.
func TestHTTPTimeouts(t *testing.T) {
	srv := StartServer(t, Options{Args: []string{
		"-gateway.http.body_read_timeout=1s", "-gateway.http.read_header_timeout=1s", "-gateway.http.idle_timeout=1s",
		"-server.http.read_header_timeout=1s", "-server.http.idle_timeout=1s",
	}})
	gw, client, admin := hostAddr(srv.URL()), srv.Addrs["server.listen"], srv.Addrs["server.admin_listen"]

	t.Run("stalled body", func(t *testing.T) {
		c := dialNoRead(t, gw)
		fmt.Fprintf(c, "POST /v1/stream/stalled HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n0123456789")
		got := closedByServer(t, c)
		if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "REQUEST_TIMEOUT") {
			t.Fatalf("answer %q", got)
		}
		m := gatewayMetrics(t, srv)
		if m["inflight_body_bytes"] != 0 {
			t.Fatalf("body budget still in use: %v", m["inflight_body_bytes"])
		}
	})
	for _, tc := range []struct{ name, addr string }{{"gateway", gw}, {"client plane", client}, {"admin plane", admin}} {
		t.Run(tc.name+" partial headers", func(t *testing.T) {
			c := dialNoRead(t, tc.addr)
			fmt.Fprintf(c, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n")
			closedByServer(t, c)
		})
		t.Run(tc.name+" idle", func(t *testing.T) {
			c := dialNoRead(t, tc.addr)
			fmt.Fprintf(c, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				t.Fatal("the server closed the connection at once; it should keep it alive until idle")
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
			if _, err := br.ReadByte(); err == nil || isTimeout(err) {
				t.Fatalf("idle connection: %v, want it closed by the server", err)
			}
		})
	}
}

// TestSlowReadersMemoryBounded (the issue: 60 clients that never read a
// 4 MB JSON stream held 240 MB of the gateway until they left): 60
// connections that read nothing of a 4 MiB JSON read add a small part of
// 60 x 4 MiB to the process's live heap while their writes are blocked,
// and the write timeout then frees every one of them.
func TestSlowReadersMemoryBounded(t *testing.T) {
	const (
		readers = 60
		size    = 4 << 20
	)
	srv := StartServer(t, Options{Args: []string{
		"-gateway.http.write_timeout=15s", "-gateway.read_chunk_bytes=8388608",
		// The stream stays one hot chunk: no external payload, no flush.
		"-runtime.external_payload_min_size=0", "-storage.cold.flush_bytes=1073741824", "-storage.cold.group_flush_bytes=1073741824",
		"-storage.cold.hot_cap_bytes=1073741824", "-storage.cold.flush_age=1h",
	}})
	ctx := t.Context()
	c := NewClient(srv.URL())
	msg := make([]byte, 0, size)
	msg = append(msg, '"')
	for len(msg) < size-1 {
		msg = append(msg, "abcdefghijklmnopqrstuvwxyz0123456789"...)
	}
	msg = append(msg[:size-1], '"')
	if resp, err := c.Create(ctx, "slow-readers", "application/json", nil); err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("create: %v %v", resp, err)
	}
	if resp, err := c.Append(ctx, "slow-readers", "application/json", msg, nil); err != nil || resp.Status/100 != 2 {
		t.Fatalf("append: %v %v", resp, err)
	}
	base, _ := liveHeap(t, srv)

	conns := make([]net.Conn, readers)
	for i := range conns {
		conns[i] = dialNoRead(t, hostAddr(srv.URL()))
		fmt.Fprintf(conns[i], "GET /v1/stream/slow-readers?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	// Every read is served and blocked writing (plus the metrics request).
	await.True(t, "every read to be in flight", func() bool { return gatewayMetrics(t, srv)["requests_in_flight"] >= readers+1 })
	held, m := liveHeap(t, srv)
	if m["requests_in_flight"] < readers+1 {
		t.Fatalf("the reads ended (write timeout) before the heap was measured: %v in flight", m["requests_in_flight"])
	}
	growth := int64(held) - int64(base)
	t.Logf("live heap %d MiB before, %d MiB with %d blocked readers of %d MiB each (growth %d KiB)",
		base>>20, held>>20, readers, size>>20, growth>>10)
	if growth > 48<<20 {
		t.Fatalf("live heap grew by %d MiB for %d readers that read nothing (60 x 4 MiB rendered copies would be 240 MiB)", growth>>20, readers)
	}

	// The write timeout frees every connection.
	await.True(t, "the blocked reads to end", func() bool { return gatewayMetrics(t, srv)["requests_in_flight"] <= 1 })
	got := closedByServer(t, conns[0])
	if !strings.HasPrefix(got, "HTTP/1.1 200") || len(got) >= size {
		t.Fatalf("a reader that did not read got %d bytes (%.40q…), want part of the answer, then the close", len(got), got)
	}
}

// TestHeadersOnlyBodiesBounded (the issue: 20 connections that sent only
// headers announcing 32 MiB bodies raised the heap from 16 MB to 686 MB):
// such requests hold one first piece of the body budget each, the heap
// hardly moves, and once the body read timeout cuts them everything is
// given back.
func TestHeadersOnlyBodiesBounded(t *testing.T) {
	const conns = 20
	srv := StartServer(t, Options{Args: []string{"-gateway.http.body_read_timeout=10s"}})
	c := NewClient(srv.URL())
	if resp, err := c.Create(t.Context(), "announced", "application/octet-stream", nil); err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("create: %v %v", resp, err)
	}
	base, _ := liveHeap(t, srv)
	cs := make([]net.Conn, conns)
	for i := range cs {
		cs[i] = dialNoRead(t, hostAddr(srv.URL()))
		fmt.Fprintf(cs[i], "POST /v1/stream/announced HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 33554432\r\n\r\n")
	}
	await.True(t, "every body to be waited for", func() bool {
		m := gatewayMetrics(t, srv)
		return m["requests_in_flight"] >= conns+1 && m["inflight_body_bytes"] > 0
	})
	held, m := liveHeap(t, srv)
	if m["requests_in_flight"] < conns+1 {
		t.Fatalf("the requests ended before the heap was measured: %v in flight", m["requests_in_flight"])
	}
	growth := int64(held) - int64(base)
	t.Logf("live heap %d MiB before, %d MiB with %d bodies of 32 MiB announced (growth %d KiB); body budget in use %v",
		base>>20, held>>20, conns, growth>>10, m["inflight_body_bytes"])
	if m["inflight_body_bytes"] > conns*64<<10 {
		t.Fatalf("%v bytes of the body budget taken for %d bodies of which nothing arrived", m["inflight_body_bytes"], conns)
	}
	if growth > 32<<20 {
		t.Fatalf("live heap grew by %d MiB for %d announced bodies (20 x 32 MiB would be 640 MiB)", growth>>20, conns)
	}
	for _, c := range cs {
		if got := closedByServer(t, c); !strings.HasPrefix(got, "HTTP/1.1 408") {
			t.Fatalf("answer %q", got)
		}
	}
	await.True(t, "the budget to be given back", func() bool { return gatewayMetrics(t, srv)["inflight_body_bytes"] == 0 })
}

// TestBodyBudgetRefuses: with the smallest budget a node accepts (64
// MiB), two bodies of 32 MiB under way take all of it; another request
// with a body answers 503 OVERLOADED with Retry-After (counted), a request
// without one is still served, and once the two are gone the refused one
// goes through.
func TestBodyBudgetRefuses(t *testing.T) {
	srv := StartServer(t, Options{Args: []string{"-server.http_inflight_body_size=67108864", "-gateway.http.body_read_timeout=1m"}})
	c := NewClient(srv.URL())
	ctx := t.Context()
	if resp, err := c.Create(ctx, "budget", "application/octet-stream", nil); err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("create: %v %v", resp, err)
	}
	chunk := make([]byte, 1<<20)
	var big []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", hostAddr(srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/stream/budget HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 33554432\r\n\r\n")
		for range 31 { // 31 of 32 MiB: the buffer has grown to the whole body
			if _, err := conn.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		big = append(big, conn)
	}
	await.True(t, "the two bodies to take the budget", func() bool { return gatewayMetrics(t, srv)["inflight_body_bytes"] == 64<<20 })

	resp, err := c.Append(ctx, "budget", "application/octet-stream", []byte("small"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(resp.Body), "OVERLOADED") {
		t.Fatalf("append over the budget: %v", resp)
	}
	if m := gatewayMetrics(t, srv); m["inflight_body_refusals"] < 1 {
		t.Fatalf("refusals %v", m["inflight_body_refusals"])
	}
	if resp, err := c.Read(ctx, "budget", "-1"); err != nil || resp.Status != http.StatusOK {
		t.Fatalf("a read while the budget is taken: %v %v", resp, err)
	}
	for _, conn := range big {
		conn.Close()
	}
	await.True(t, "the budget to be given back", func() bool { return gatewayMetrics(t, srv)["inflight_body_bytes"] == 0 })
	if resp, err := c.Append(ctx, "budget", "application/octet-stream", []byte("small"), nil); err != nil || resp.Status != http.StatusNoContent {
		t.Fatalf("append after: %v %v", resp, err)
	}
}

// TestBodyLimitsRefuseStart (seed, "Upgrading to 0.8"): a node whose
// in-flight body budget is below 64 MiB refuses to start with
// InflightBodyBudgetTooSmall, and so does a gateway whose budget cannot
// hold its largest body; a gateway whose request body limit is above
// 33554432 refuses to start.
func TestBodyLimitsRefuseStart(t *testing.T) {
	tests := []struct {
		bin  string
		args []string
		want string
	}{
		{"ursula", []string{"-server.http_inflight_body_size=67108863"}, "InflightBodyBudgetTooSmall"},
		{"ursula-node", []string{"-server.http_inflight_body_size=33554432"}, "InflightBodyBudgetTooSmall"},
		{"ursula-gateway", []string{"-upstream.nodes=127.0.0.1:1", "-server.http_inflight_body_size=16777216"}, "InflightBodyBudgetTooSmall"},
		{"ursula-gateway", []string{"-upstream.nodes=127.0.0.1:1", "-gateway.max_body_bytes=33554433"}, "33554432"},
	}
	for _, tc := range tests {
		t.Run(tc.bin+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			bin, err := Binary(tc.bin)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Dir = t.TempDir()
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("%s %v: %v, want a refusal naming %q:\n%s", tc.bin, tc.args, err, tc.want, out)
			}
		})
	}
}
