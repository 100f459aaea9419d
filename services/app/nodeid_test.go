package app

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula/ursula/storage/engine"
)

func TestNodeIDFromHostname(t *testing.T) {
	tests := []struct {
		host    string
		want    uint64
		wantErr bool
	}{
		{"ursula-node-0", 1, false},
		{"ursula-node-4", 5, false},
		{"prod-ursula-node-12.prod-ursula-node-headless.ns.svc.cluster.local", 13, false},
		{"a-9", 10, false},
		{"ursula-node", 0, true},
		{"ursula-node-", 0, true},
		{"-3", 0, true},
		{"3", 0, true},
		{"node-x1", 0, true},
		{"node-01", 0, true},
		{"node-+1", 0, true},
		{"node-18446744073709551615", 0, true},
		{"node-99999999999999999999", 0, true},
		{"", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			got, err := nodeIDFromHostname(tc.host)
			if tc.wantErr {
				if !errors.Is(err, errNoOrdinal) {
					t.Fatalf("nodeIDFromHostname(%q) = %d, %v; want errNoOrdinal", tc.host, got, err)
				}
				if !strings.Contains(err.Error(), "raft.node_id_from_hostname") {
					t.Errorf("error %q does not name the setting", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("nodeIDFromHostname(%q) = %d, %v; want %d", tc.host, got, err, tc.want)
			}
		})
	}
}

func TestResolveNodeID(t *testing.T) {
	host := func(name string, err error) func() (string, error) {
		return func() (string, error) { return name, err }
	}
	t.Run("off keeps node_id", func(t *testing.T) {
		cfg := engine.Config{NodeID: 7}
		if err := resolveNodeID(&cfg, host("", errors.New("must not be called"))); err != nil || cfg.NodeID != 7 {
			t.Fatalf("NodeID %d, err %v; want 7, nil", cfg.NodeID, err)
		}
	})
	t.Run("on overrides node_id", func(t *testing.T) {
		cfg := engine.Config{NodeID: 7, NodeIDFromHostname: true}
		if err := resolveNodeID(&cfg, host("ursula-node-2", nil)); err != nil || cfg.NodeID != 3 {
			t.Fatalf("NodeID %d, err %v; want 3, nil", cfg.NodeID, err)
		}
	})
	t.Run("no ordinal changes nothing", func(t *testing.T) {
		cfg := engine.Config{NodeID: 7, NodeIDFromHostname: true}
		if err := resolveNodeID(&cfg, host("laptop", nil)); !errors.Is(err, errNoOrdinal) || cfg.NodeID != 7 {
			t.Fatalf("NodeID %d, err %v; want 7, errNoOrdinal", cfg.NodeID, err)
		}
	})
	t.Run("hostname error", func(t *testing.T) {
		cfg := engine.Config{NodeID: 7, NodeIDFromHostname: true}
		boom := errors.New("boom")
		if err := resolveNodeID(&cfg, host("", boom)); !errors.Is(err, boom) || cfg.NodeID != 7 {
			t.Fatalf("NodeID %d, err %v; want 7, boom", cfg.NodeID, err)
		}
	})
}

// TestLoadNodeIDFromHostname checks the hook in Load: the setting is read
// from the file and applied with this machine's host name.
func TestLoadNodeIDFromHostname(t *testing.T) {
	hostname, err := os.Hostname()
	if err != nil {
		t.Skipf("no host name: %v", err)
	}
	file := filepath.Join(t.TempDir(), "ursula.toml")
	if err := os.WriteFile(file, []byte("[raft]\nnode_id = 9\nnode_id_from_hostname = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want, wantErr := nodeIDFromHostname(hostname)
	cfg, _, err := Load([]string{"-config", file}, TargetNode)
	if wantErr != nil {
		if !errors.Is(err, errNoOrdinal) {
			t.Fatalf("Load on host %q = %v, want errNoOrdinal", hostname, err)
		}
		return
	}
	if err != nil || cfg.Engine.NodeID != want {
		t.Fatalf("Load on host %q: node id %v, err %v; want %d", hostname, cfg.Engine.NodeID, err, want)
	}
}
