package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExampleConfig keeps deploy/ursula.example.toml true: every server
// binary accepts it with -verify-config (unknown keys are errors).
func TestExampleConfig(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	example := filepath.Join(root, "deploy", "ursula.example.toml")
	for _, name := range []string{"ursula", "ursula-node", "ursula-gateway"} {
		t.Run(name, func(t *testing.T) {
			bin, err := Binary(name)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "-config", example, "-verify-config")
			cmd.Dir = t.TempDir()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s -config %s -verify-config: %v\n%s", name, example, err, out)
			}
		})
	}
}

// TestLocalClusterConfig keeps the files of `make run-cluster`
// (deploy/local-cluster) true: each node file passes ursula-node
// -verify-config and names the same cluster and peers, and gateway.toml
// passes ursula-gateway -verify-config.
func TestLocalClusterConfig(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "deploy", "local-cluster")
	files := []struct{ bin, file string }{
		{"ursula-node", "node1.toml"},
		{"ursula-node", "node2.toml"},
		{"ursula-node", "node3.toml"},
		{"ursula-gateway", "gateway.toml"},
		{"ursula-coldgc", "coldgc.toml"},
		{"ursula-backup", "backup.toml"},
	}
	for _, f := range files {
		t.Run(f.file, func(t *testing.T) {
			bin, err := Binary(f.bin)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, f.file)
			cmd := exec.Command(bin, "-config", path, "-verify-config")
			cmd.Dir = t.TempDir()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s -config %s -verify-config: %v\n%s", f.bin, path, err, out)
			}
		})
	}
	var peers string
	for i := 1; i <= 3; i++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("node%d.toml", i)))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if !strings.Contains(s, fmt.Sprintf("node_id = %d\n", i)) || !strings.Contains(s, fmt.Sprintf(`data_dir = "./data/node%d"`, i)) {
			t.Errorf("node%d.toml: want node_id = %d and data_dir ./data/node%d", i, i, i)
		}
		at := strings.Index(s, "[[raft.peers]]")
		if at < 0 {
			t.Errorf("node%d.toml has no [[raft.peers]]", i)
			continue
		}
		p := s[at:]
		if peers == "" {
			peers = p
		} else if p != peers {
			t.Errorf("node%d.toml lists other peers than node1.toml", i)
		}
	}
}
