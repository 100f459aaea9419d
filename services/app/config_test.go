package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
