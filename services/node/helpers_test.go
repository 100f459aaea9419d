package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/storage/engine"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testClusterID = "test-cluster"

func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	level := slog.LevelError
	if os.Getenv("NODE_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// startEngine runs a ready single-node engine on a fresh directory until the
// test ends.
func startEngine(tb testing.TB) *engine.Node {
	tb.Helper()
	eng, err := engine.Open(engine.Config{
		DataDir:             tb.TempDir(),
		NodeID:              1,
		ClusterID:           testClusterID,
		GroupCount:          8,
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
	runEngine(tb, eng)
	return eng
}

// runEngine runs eng until the test ends and waits until it is ready.
func runEngine(tb testing.TB, eng *engine.Node) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("engine Run: %v", err)
		}
	})
	rctx, rcancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer rcancel()
	if err := eng.WaitReady(rctx); err != nil {
		tb.Fatalf("engine WaitReady: %v", err)
	}
}

func testConfig(listen, admin string) Config {
	return Config{Listen: listen, AdminListen: admin, ClusterID: testClusterID, MaxMessageBytes: 4 << 20}
}

// newServer builds a node server on a running engine (listening on
// nothing).
func newServer(tb testing.TB, eng *engine.Node) *Server {
	tb.Helper()
	s, err := New(testConfig("127.0.0.1:0", "127.0.0.1:0"), eng, Deps{}, testLogger(tb))
	if err != nil {
		tb.Fatalf("node.New: %v", err)
	}
	return s
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

// do sends one request and decodes its JSON answer.
func do(tb testing.TB, client *http.Client, method, url string, header http.Header) (int, map[string]any) {
	tb.Helper()
	code, body, err := tryDo(tb.Context(), client, method, url, header)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return code, body
}

// tryDo is do for requests that may fail.
func tryDo(ctx context.Context, client *http.Client, method, url string, header http.Header) (int, map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	var body map[string]any
	if len(strings.TrimSpace(string(raw))) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("%d answer is not a JSON object: %q", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, body, nil
}

// authed is an admin mutation's headers: the node's admin token and the
// process incarnation v (none when empty).
func authed(s *Server, v string) http.Header {
	tok, err := pki.ReadTokenFile(s.adminTokenFile)
	if err != nil {
		panic(err)
	}
	h := incarnation(v)
	if h == nil {
		h = http.Header{}
	}
	h.Set("Authorization", "Bearer "+string(tok))
	return h
}

func incarnation(v string) http.Header {
	if v == "" {
		return nil
	}
	return http.Header{IncarnationHeader: []string{v}}
}
