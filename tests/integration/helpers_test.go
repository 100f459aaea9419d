package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/gateway/upstream"
	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/internal/pki"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/node"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/tests/await"
)

const testClusterID = "integration"

func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	level := slog.LevelError
	if os.Getenv("URSULA_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// testNode is a single-node storage node: a running engine and its server.
type testNode struct {
	eng *engine.Node
	srv *node.Server
	// clientAddr and adminAddr are set once Serve ran.
	clientAddr, adminAddr string
}

// startNode runs a ready single-node engine on a fresh directory and builds
// its server (listening on nothing until serve) until the test ends.
func startNode(tb testing.TB) *testNode {
	tb.Helper()
	return startNodeWith(tb, node.Deps{})
}

// gatewayToken is the token the test's gateways prove their role with to
// the node (which takes it as the gateway's, like the all-in-one binary's
// loopback token).
const gatewayToken = "integration-gateway-token-0123456789abcdef"

// startNodeWith is startNode with the node server's deps.
func startNodeWith(tb testing.TB, deps node.Deps) *testNode {
	tb.Helper()
	deps.GatewayToken = gatewayToken
	eng, err := engine.Open(engine.Config{
		DataDir:             tb.TempDir(),
		NodeID:              1,
		GroupCount:          4,
		ShardCount:          2,
		Fsync:               "never",
		ReadChunkBytes:      1 << 20,
		SnapshotEntries:     64,
		SnapshotBytes:       64 << 10,
		TickInterval:        100 * time.Millisecond,
		ExpirySweepInterval: 100 * time.Millisecond,
	}, engine.Deps{Logger: testLogger(tb)})
	if err != nil {
		tb.Fatalf("engine.Open: %v", err)
	}
	runUntilCleanup(tb, "engine", eng.Run)
	ctx, cancel := context.WithTimeout(tb.Context(), await.DefaultTimeout)
	defer cancel()
	if err := eng.WaitReady(ctx); err != nil {
		tb.Fatalf("engine WaitReady: %v", err)
	}
	n := &testNode{eng: eng, clientAddr: freeAddr(tb), adminAddr: freeAddr(tb)}
	n.srv, err = node.New(node.Config{Listen: n.clientAddr, AdminListen: n.adminAddr, ClusterID: testClusterID, MaxMessageBytes: 4 << 20}, eng, deps, testLogger(tb))
	if err != nil {
		tb.Fatalf("node.New: %v", err)
	}
	return n
}

// serve runs the node's listeners until the test ends and waits until the
// admin plane answers ready.
func (n *testNode) serve(tb testing.TB) {
	tb.Helper()
	runUntilCleanup(tb, "node", n.srv.Run)
	hc := httpClient(tb)
	var last error
	ready := await.Until(await.DefaultTimeout, func() bool {
		resp, err := hc.Get("http://" + n.adminAddr + "/__ursula/ready")
		if err != nil {
			last = err
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		last = fmt.Errorf("status %d", resp.StatusCode)
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		tb.Fatalf("node not ready: %v", last)
	}
}

// startRouter runs an upstream router towards addr until the test ends.
func startRouter(tb testing.TB, addr string) *upstream.Router {
	tb.Helper()
	r, err := upstream.New(upstream.Config{Nodes: []string{addr}, ClientPlane: pki.ClientPlane{Token: gatewayToken}}, testLogger(tb))
	if err != nil {
		tb.Fatalf("upstream.New: %v", err)
	}
	runUntilCleanup(tb, "router", r.Run)
	tb.Cleanup(r.Close)
	return r
}

// startGateway serves a gateway over client on a loopback port until the
// test ends and returns its base URL.
func startGateway(tb testing.TB, client streamv1.StreamServiceClient, mutate func(*gateway.Config)) (*gateway.Gateway, string) {
	tb.Helper()
	var cfg gateway.Config
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := gateway.New(cfg, client, testLogger(tb))
	if err != nil {
		tb.Fatalf("gateway.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	runUntilCleanup(tb, "gateway", func(ctx context.Context) error { return g.Serve(ctx, ln) })
	tb.Cleanup(g.Close)
	return g, "http://" + ln.Addr().String()
}

// runUntilCleanup runs f in a goroutine until the test ends, then cancels
// its context and waits for it; an error other than a cancellation fails
// the test.
func runUntilCleanup(tb testing.TB, what string, f func(context.Context) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				tb.Errorf("%s: %v", what, err)
			}
		case <-time.After(await.DefaultTimeout):
			tb.Errorf("%s did not stop", what)
		}
	})
}

// httpClient returns a client whose idle connections close when the test
// ends.
func httpClient(tb testing.TB) *http.Client {
	tb.Helper()
	tr := &http.Transport{}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// request sends one request and returns its status and body.
func request(tb testing.TB, hc *http.Client, method, url, body string, header map[string]string) (int, string) {
	tb.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(tb.Context(), method, url, rd)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, string(raw)
}

// freeAddr returns a loopback address that was free a moment ago
// (internal/freeport says why below the ephemeral range).
func freeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}
