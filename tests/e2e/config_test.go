package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// serverBinaries are the binaries that run app.Main, one per target.
var serverBinaries = []string{"ursula", "ursula-node", "ursula-gateway", "ursula-coldgc", "ursula-backup"}

// TestExampleConfig keeps deploy/ursula.example.toml true: every server
// binary accepts it with -verify-config (unknown keys are errors), and it
// uses no deprecated name.
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
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s -config %s -verify-config: %v\n%s", name, example, err, out)
			}
			if bytes.Contains(out, []byte(DeprecatedWarning)) {
				t.Errorf("%s uses deprecated names:\n%s", example, out)
			}
		})
	}
}

// TestHelpVersionAndEnvironment: every server binary answers -h with every
// setting and its environment variable, and -version with its name,
// version, commit and Go version, both on stdout with exit status 0; an
// URSULA_* variable overrides the file and a flag overrides the variable;
// an unknown URSULA_* setting and a bad value are refused, naming the
// variable.
func TestHelpVersionAndEnvironment(t *testing.T) {
	for _, name := range serverBinaries {
		t.Run(name, func(t *testing.T) {
			bin, err := Binary(name)
			if err != nil {
				t.Fatal(err)
			}
			run := func(env []string, args ...string) (string, string, error) {
				t.Helper()
				cmd := exec.Command(bin, args...)
				cmd.Dir = t.TempDir()
				cmd.Env = append(os.Environ(), env...)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				return stdout.String(), stderr.String(), err
			}
			out, errOut, err := run(nil, "-version")
			if err != nil || !strings.HasPrefix(out, name+" ") || !strings.Contains(out, "(commit ") || !strings.Contains(out, "go1.") {
				t.Errorf("-version: %v, stdout %q, stderr %q", err, out, errOut)
			}
			for _, h := range []string{"-h", "-help"} {
				out, errOut, err = run(nil, h)
				if err != nil {
					t.Errorf("%s: %v\n%s", h, err, errOut)
				}
				for _, want := range []string{"-raft.wal.fsync string", "URSULA_RAFT_WAL_FSYNC", "-storage.cold.root", "-server.listen", "-gateway.http.read_header_timeout", "-upstream.nodes list", "-version"} {
					if !strings.Contains(out, want) {
						t.Errorf("%s does not list %s", h, want)
					}
				}
			}
			file := filepath.Join(t.TempDir(), "c.toml")
			if err := os.WriteFile(file, []byte("[server]\ncluster_id = \"file\"\nallow_anonymous_clients = true\n[upstream]\nnodes = [\"127.0.0.1:1\"]\n[backup]\nlocation = \"/b\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, errOut, err = run([]string{"URSULA_SERVER_CLUSTER_ID=env", "URSULA_RAFT_WAL_FSYNC=always"}, "-config", file, "-print-config", "-raft.wal.fsync=never")
			if err != nil || !strings.Contains(out, `cluster_id = "env"`) || !strings.Contains(out, `fsync = "never"`) {
				t.Errorf("environment over file, flag over environment: %v\n%s\n%s", err, out, errOut)
			}
			_, errOut, err = run([]string{"URSULA_RAFT_WAL_BACKEND=memory"}, "-config", file, "-verify-config")
			if err == nil || !strings.Contains(errOut, "URSULA_RAFT_WAL_BACKEND") {
				t.Errorf("unknown variable: %v\n%s", err, errOut)
			}
			_, errOut, err = run([]string{"URSULA_RAFT_NODE_ID=one"}, "-config", file, "-verify-config")
			if err == nil || !strings.Contains(errOut, "URSULA_RAFT_NODE_ID") {
				t.Errorf("bad value: %v\n%s", err, errOut)
			}
			_, errOut, err = run(nil, "-config", file, "-verify-config", "-data-dir=./d")
			if err != nil || !strings.Contains(errOut, DeprecatedWarning) || !strings.Contains(errOut, "-raft.wal.path") {
				t.Errorf("deprecated flag: %v\n%s", err, errOut)
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
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s -config %s -verify-config: %v\n%s", f.bin, path, err, out)
			}
			if bytes.Contains(out, []byte(DeprecatedWarning)) {
				t.Errorf("%s uses deprecated names:\n%s", path, out)
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
		if !strings.Contains(s, fmt.Sprintf("node_id = %d\n", i)) || !strings.Contains(s, fmt.Sprintf(`path = "./data/node%d"`, i)) {
			t.Errorf("node%d.toml: want node_id = %d and raft.wal.path ./data/node%d", i, i, i)
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
