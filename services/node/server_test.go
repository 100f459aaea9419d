package node

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"no admin plane", func(c *Config) { c.AdminListen = "" }, ""},
		{"localhost admin", func(c *Config) { c.AdminListen = "localhost:4438" }, ""},
		{"ipv6 loopback admin", func(c *Config) { c.AdminListen = "[::1]:4438" }, ""},
		{"bad listen", func(c *Config) { c.Listen = "nope" }, "server.listen"},
		{"non-loopback admin", func(c *Config) { c.AdminListen = "0.0.0.0:4438" }, "not a loopback"},
		{"non-loopback admin without TLS", func(c *Config) { c.AdminListen = "0.0.0.0:4438"; c.AllowNonLoopbackAdmin = true }, "admin_tls is required"},
		{"empty cluster id", func(c *Config) { c.ClusterID = "" }, "cluster_id"},
		{"tiny messages", func(c *Config) { c.MaxMessageBytes = 1000 }, "max_message_bytes"},
		{"default body budget", func(c *Config) { c.HTTPInflightBodySize = 0 }, ""},
		{"smallest body budget", func(c *Config) { c.HTTPInflightBodySize = 64 << 20 }, ""},
		{"body budget too small", func(c *Config) { c.HTTPInflightBodySize = 64<<20 - 1 }, "InflightBodyBudgetTooSmall"},
		{"default connection cap", func(c *Config) { c.MaxConnections = 0 }, ""},
		{"negative connection cap", func(c *Config) { c.MaxConnections = -1 }, "server.max_connections"},
		{"negative http timeout", func(c *Config) { c.HTTP.IdleTimeout = -1 }, "server.http.idle_timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("127.0.0.1:4437", "127.0.0.1:4438")
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error mentioning %q", err, tc.wantErr)
			}
		})
	}
}

// TestServerRun serves a real engine on loopback ports: readiness and
// metrics on both planes, and the gRPC StreamService on the client plane.
func TestServerRun(t *testing.T) {
	eng := startEngine(t)
	clientAddr, adminAddr := freeAddr(t), freeAddr(t)
	s, err := New(testConfig(clientAddr, adminAddr), eng, Deps{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}
	t.Cleanup(stop)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)

	for _, plane := range []struct{ name, addr string }{{"admin", adminAddr}, {"client", clientAddr}} {
		t.Run("ready on the "+plane.name+" plane", func(t *testing.T) {
			var code int
			var body map[string]any
			await.True(t, "readiness", func() bool {
				var err error
				code, body, err = tryDo(t.Context(), hc, http.MethodGet, "http://"+plane.addr+"/__ursula/ready", nil)
				return err == nil && code == http.StatusOK
			})
			if body["ready"] != true || body["cluster_id"] != testClusterID || body["process_incarnation"] != s.Incarnation() {
				t.Fatalf("ready answer %v", body)
			}
		})
	}

	conn, err := grpc.NewClient(clientAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := streamv1.NewStreamServiceClient(conn)
	t.Run("grpc on the client plane", func(t *testing.T) {
		testStreamClient(t, client)
	})

	for _, plane := range []struct{ name, addr string }{{"admin", adminAddr}, {"client", clientAddr}} {
		t.Run("metrics on the "+plane.name+" plane", func(t *testing.T) {
			code, m := do(t, hc, http.MethodGet, "http://"+plane.addr+"/__ursula/metrics", nil)
			if code != http.StatusOK {
				t.Fatalf("metrics answer %d", code)
			}
			if m["cluster_id"] != testClusterID || m["process_incarnation"] != s.Incarnation() || m["node_id"] != float64(1) {
				t.Fatalf("metrics identity: cluster_id %v process_incarnation %v node_id %v", m["cluster_id"], m["process_incarnation"], m["node_id"])
			}
			if m["raft_group_count"] != float64(8) || m["raft_groups_led"] != float64(8) || m["leadership_shed_state"] != "normal" {
				t.Fatalf("metrics groups: count %v led %v shed %v", m["raft_group_count"], m["raft_groups_led"], m["leadership_shed_state"])
			}
			if m["append_requests"].(float64) < 2 || m["streams"].(float64) < 1 {
				t.Errorf("counters did not move: append_requests %v streams %v", m["append_requests"], m["streams"])
			}
			groups, _ := m["raft_groups"].([]any)
			if len(groups) != 8 {
				t.Fatalf("raft_groups has %d entries", len(groups))
			}
			for i, raw := range groups {
				g := raw.(map[string]any)
				voters, _ := g["voters"].([]any)
				if g["raft_group_id"] != float64(i) || g["leader_id"] != float64(1) || g["term"].(float64) < 1 || len(voters) != 1 || voters[0] != float64(1) {
					t.Errorf("raft_groups[%d] = %v", i, g)
				}
			}
		})
	}

	t.Run("grpc cluster info", func(t *testing.T) {
		ci, err := client.GetClusterInfo(t.Context(), &streamv1.GetClusterInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if ci.GetClusterId() != testClusterID || ci.GetNodeId() != 1 || ci.GetGroupCount() != 8 || len(ci.GetGroupLeaders()) != 8 {
			t.Fatalf("cluster info %v", ci)
		}
		if len(ci.GetNodes()) != 1 || ci.GetNodes()[0].GetClientAddr() != clientAddr {
			t.Fatalf("nodes %v, want this node at %s", ci.GetNodes(), clientAddr)
		}
	})

	t.Run("shutdown closes the planes", func(t *testing.T) {
		stop()
		hc.CloseIdleConnections()
		for _, addr := range []string{clientAddr, adminAddr} {
			if code, _, err := tryDo(t.Context(), hc, http.MethodGet, "http://"+addr+"/__ursula/ready", nil); err == nil {
				t.Errorf("%s still answers (%d) after Run returned", addr, code)
			}
		}
		_, err := client.Head(t.Context(), &streamv1.HeadRequest{Ref: &streamv1.StreamRef{Bucket: "b", Stream: "s"}})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("gRPC after shutdown = %v, want Unavailable", err)
		}
	})
}

// TestPlaneConnectionCap: each plane holds at most server.max_connections;
// one beyond it is closed before it sends a byte, the other planes keep
// serving meanwhile, and the plane serves again once its connections go.
func TestPlaneConnectionCap(t *testing.T) {
	s := runNode(t, testConfig("", ""), func(c *Config) { c.MaxConnections = 2 })
	clientAddr, adminAddr := s.cfg.Listen, s.cfg.AdminListen
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ready := func(addr string) bool {
		code, _, err := tryDo(t.Context(), hc, http.MethodGet, "http://"+addr+"/__ursula/ready", nil)
		return err == nil && code == http.StatusOK
	}
	await.True(t, "the admin plane to serve", func() bool { return ready(adminAddr) })

	// Two silent connections fill the admin plane (each held until the
	// plane's first-byte deadline); the third is closed at once.
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", adminAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	await.True(t, "two admin connections held", func() bool { return s.metricsSnapshot()["admin_connections"] == float64(2) })
	extra, err := net.Dial("tcp", adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a missing cap
	if n, err := extra.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("connection beyond the admin plane's cap read %d bytes, %v; want it closed", n, err)
	}
	m := s.metricsSnapshot()
	if m["admin_connections_refused"] != float64(1) || m["max_connections_per_plane"] != float64(2) {
		t.Fatalf("admin_connections_refused %v, max_connections_per_plane %v; want 1 and 2", m["admin_connections_refused"], m["max_connections_per_plane"])
	}
	if !ready(clientAddr) {
		t.Fatal("the client plane stopped serving while the admin plane was full")
	}
	for _, c := range held {
		_ = c.Close()
	}
	await.True(t, "the admin plane to serve again", func() bool { return ready(adminAddr) })
}
