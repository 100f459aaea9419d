package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLogAndTelemetryConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ursula.toml")
	if err := os.WriteFile(file, []byte(`
[log]
level = "info"
levels = { "storage/engine" = "debug", gateway = "warn" }

[telemetry]
prometheus = false
service_name = "ursula-test"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantLevels map[string]string
		wantProm   bool
		wantErr    string
	}{
		{"defaults", nil, nil, true, ""},
		{"flag", []string{"-log.levels", "engine=debug, node=error"}, map[string]string{"engine": "debug", "node": "error"}, true, ""},
		{"file", []string{"-config", file}, map[string]string{"storage/engine": "debug", "gateway": "warn"}, false, ""},
		{"flag over file", []string{"-config", file, "-log.levels", "coldgc=debug", "-telemetry.prometheus"}, map[string]string{"coldgc": "debug"}, true, ""},
		{"bad level", []string{"-log.levels", "engine=loud"}, nil, true, `log.levels "engine"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := Load(tc.args, TargetAll)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			err = cfg.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate = %v, want an error mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if len(cfg.Log.Levels) != len(tc.wantLevels) {
				t.Fatalf("levels %v, want %v", cfg.Log.Levels, tc.wantLevels)
			}
			for k, v := range tc.wantLevels {
				if cfg.Log.Levels[k] != v {
					t.Fatalf("levels %v, want %v", cfg.Log.Levels, tc.wantLevels)
				}
			}
			if cfg.Telemetry.Prometheus != tc.wantProm {
				t.Errorf("telemetry.prometheus = %v, want %v", cfg.Telemetry.Prometheus, tc.wantProm)
			}
		})
	}
}

func TestNewLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	logger := newLogger(LogConfig{Level: "info", Format: "json", Levels: map[string]string{"storage/engine": "debug", "gateway": "warn"}}, &buf)
	logger.With("component", "engine").Debug("engine detail")
	logger.With("component", "gateway").Info("gateway chatter")
	logger.With("component", "node").Debug("node detail")
	logger.Info("process event")
	out := buf.String()
	for _, want := range []string{"engine detail", "process event"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %s", want, out)
		}
	}
	for _, unwanted := range []string{"gateway chatter", "node detail"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("%q logged: %s", unwanted, out)
		}
	}
}

// TestHTTPLimitsConfig: the request-body budget, the gateway's body limit,
// the HTTP timeouts and the webhook allowance, from flags and from the
// file, and the starts they refuse.
func TestHTTPLimitsConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ursula.toml")
	if err := os.WriteFile(file, []byte(`
[server]
http_inflight_body_size = 100000000
[server.http]
body_read_timeout = "5s"
[gateway.http]
write_timeout = "7s"
idle_timeout = "1m"
[subscriptions]
allow_webhook_hosts = ["127.0.0.0/8", "localhost"]
max_subscriptions_per_stream = 3
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		target  string
		args    []string
		wantErr string
		check   func(*testing.T, *Config)
	}{
		{"defaults", TargetAll, nil, "", func(t *testing.T, c *Config) {
			if c.Node.InflightBodySize() != 128<<20 || c.Gateway.MaxBodyBytes != 32<<20 || c.Gateway.HTTP.WriteTimeout != 30*time.Second ||
				c.Node.HTTP.BodyReadTimeout != 30*time.Second || len(c.Subscriptions.AllowWebhookHosts) != 0 || c.Subscriptions.MaxSubscriptions != 10000 {
				t.Fatalf("defaults: budget %d, max body %d, gateway %+v, node %+v, subscriptions %+v",
					c.Node.InflightBodySize(), c.Gateway.MaxBodyBytes, c.Gateway.HTTP, c.Node.HTTP, c.Subscriptions)
			}
		}},
		{"file", TargetAll, []string{"-config", file}, "", func(t *testing.T, c *Config) {
			if c.Node.HTTPInflightBodySize != 100000000 || c.Node.HTTP.BodyReadTimeout != 5*time.Second ||
				c.Gateway.HTTP.WriteTimeout != 7*time.Second || c.Gateway.HTTP.IdleTimeout != time.Minute ||
				strings.Join(c.Subscriptions.AllowWebhookHosts, ",") != "127.0.0.0/8,localhost" || c.Subscriptions.MaxSubscriptionsPerStream != 3 {
				t.Fatalf("from the file: %+v %+v %+v %+v", c.Node.HTTPInflightBodySize, c.Node.HTTP, c.Gateway.HTTP, c.Subscriptions)
			}
		}},
		{"flags", TargetAll, []string{"-gateway.http.body_read_timeout=3s", "-subscriptions.allow_webhook_hosts=127.0.0.0/8, ::1,localhost"}, "", func(t *testing.T, c *Config) {
			if c.Gateway.HTTP.BodyReadTimeout != 3*time.Second || strings.Join(c.Subscriptions.AllowWebhookHosts, ",") != "127.0.0.0/8,::1,localhost" {
				t.Fatalf("from flags: %+v %v", c.Gateway.HTTP, c.Subscriptions.AllowWebhookHosts)
			}
		}},
		{"node budget too small", TargetNode, []string{"-server.http_inflight_body_size=33554432"}, "InflightBodyBudgetTooSmall", nil},
		{"all budget too small", TargetAll, []string{"-server.http_inflight_body_size=67108863"}, "InflightBodyBudgetTooSmall", nil},
		{"gateway budget below its body limit", TargetGateway, []string{"-upstream.nodes=127.0.0.1:1", "-server.http_inflight_body_size=16777216"}, "InflightBodyBudgetTooSmall", nil},
		{"gateway budget at its body limit", TargetGateway, []string{"-upstream.nodes=127.0.0.1:1", "-server.http_inflight_body_size=16777216", "-gateway.max_body_bytes=16777216"}, "", nil},
		{"gateway body limit above 32 MiB", TargetGateway, []string{"-upstream.nodes=127.0.0.1:1", "-gateway.max_body_bytes=33554433"}, "above 33554432", nil},
		{"negative timeout", TargetAll, []string{"-server.http.write_timeout=-1s"}, "server.http.write_timeout", nil},
		{"bad allowance", TargetGateway, []string{"-upstream.nodes=127.0.0.1:1", "-subscriptions.allow_webhook_hosts=10.0.0.0/33"}, "allow_webhook_hosts", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := Load(tc.args, tc.target)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			checkValidate(t, cfg, tc.wantErr, tc.check)
		})
	}
}

// TestBackupConfig: the backup target's section from the file and from
// flags, what it requires, and that the all-in-one target validates it
// only when a location is set.
func TestBackupConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "backup.toml")
	if err := os.WriteFile(file, []byte(`
[upstream]
nodes = ["127.0.0.1:4441", "127.0.0.1:4442"]
[backup]
location = "s3://backups/ursula"
cron = "0 2 * * *"
keep_last = 7
keep_within = "168h"
hold_ttl = "15m"
concurrency = 8
listen = "127.0.0.1:0"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		target  string
		args    []string
		wantErr string
		check   func(*testing.T, *Config)
	}{
		{"file", TargetBackup, []string{"-config", file}, "", func(t *testing.T, c *Config) {
			b := c.Backup
			if b.Location != "s3://backups/ursula" || b.Cron != "0 2 * * *" || b.KeepLast != 7 || b.KeepWithin != 168*time.Hour ||
				b.HoldTTL != 15*time.Minute || b.Concurrency != 8 || b.Listen != "127.0.0.1:0" || len(c.Upstream.Nodes) != 2 {
				t.Fatalf("from the file: %+v, nodes %v", b, c.Upstream.Nodes)
			}
		}},
		{"flags over file", TargetBackup, []string{"-config", file, "-backup.location=/var/backups/ursula", "-backup.keep_last=3"}, "", func(t *testing.T, c *Config) {
			if c.Backup.Location != "/var/backups/ursula" || c.Backup.KeepLast != 3 || c.Backup.Cron != "0 2 * * *" {
				t.Fatalf("flags over the file: %+v", c.Backup)
			}
		}},
		{"defaults", TargetBackup, []string{"-backup.location=/b", "-upstream.nodes=127.0.0.1:1"}, "", func(t *testing.T, c *Config) {
			if c.Backup.Interval != 24*time.Hour || c.Backup.HoldTTL != 10*time.Minute || c.Backup.Concurrency != 4 || c.Backup.Listen != "127.0.0.1:4436" {
				t.Fatalf("defaults: %+v", c.Backup)
			}
		}},
		{"no location", TargetBackup, []string{"-upstream.nodes=127.0.0.1:1"}, "backup.location is required", nil},
		{"no nodes", TargetBackup, []string{"-backup.location=/b"}, "upstream.nodes", nil},
		{"bad cron", TargetBackup, []string{"-config", file, "-backup.cron=every night"}, "cron", nil},
		{"public listener", TargetBackup, []string{"-config", file, "-backup.listen=0.0.0.0:4436"}, "not a loopback address", nil},
		{"all without a location ignores the section", TargetAll, []string{"-backup.cron=every night"}, "", nil},
		{"all with a location validates it", TargetAll, []string{"-backup.location=/b", "-backup.cron=every night"}, "cron", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := Load(tc.args, tc.target)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			checkValidate(t, cfg, tc.wantErr, tc.check)
		})
	}
}

// checkValidate validates cfg: it must fail mentioning wantErr when that
// is set, and otherwise pass and then satisfy check (when set).
func checkValidate(t *testing.T, cfg *Config, wantErr string, check func(*testing.T, *Config)) {
	t.Helper()
	err := cfg.Validate()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Validate = %v, want an error mentioning %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if check != nil {
		check(t, cfg)
	}
}

// TestColdGCConfig: the coldgc target's only listener,
// server.metrics_listen, must be host:port when set.
func TestColdGCConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no listener", nil, ""},
		{"port only", []string{"-server.metrics_listen=:4440"}, ""},
		{"host and port", []string{"-server.metrics_listen=127.0.0.1:0"}, ""},
		{"no port", []string{"-server.metrics_listen=localhost"}, "server.metrics_listen"},
		{"url", []string{"-server.metrics_listen=http://0.0.0.0:4440/"}, "server.metrics_listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-upstream.nodes=127.0.0.1:4441"}, tc.args...)
			cfg, _, err := Load(args, TargetColdGC)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			checkValidate(t, cfg, tc.wantErr, nil)
		})
	}
}
