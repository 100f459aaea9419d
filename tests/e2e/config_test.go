package e2e

import (
	"os/exec"
	"path/filepath"
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
