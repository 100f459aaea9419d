package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ursula/ursula/tests/e2e"
)

// nodePeerFiles is the Node reference server's pinned install (package.json
// and package-lock.json) and the script that starts it.
//
//go:embed node-peer/package.json node-peer/package-lock.json node-peer/serve.mjs
var nodePeerFiles embed.FS

// errNoNPM says the Node peer cannot be installed on this machine.
var errNoNPM = errors.New("bench: node and npm are not on PATH")

// installNodePeer writes the pinned package files into dir and runs npm ci
// there unless node_modules already holds exactly that lock. It returns the
// path of serve.mjs.
func installNodePeer(ctx context.Context, dir string, logf func(string, ...any)) (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", errNoNPM
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", errNoNPM
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create the node peer directory: %w", err)
	}
	lock, err := nodePeerFiles.ReadFile("node-peer/package-lock.json")
	if err != nil {
		return "", err
	}
	installed, _ := os.ReadFile(filepath.Join(dir, "node_modules", ".installed-lock.json"))
	for _, name := range []string{"package.json", "package-lock.json", "serve.mjs"} {
		b, err := nodePeerFiles.ReadFile("node-peer/" + name)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			return "", fmt.Errorf("write %s: %w", name, err)
		}
	}
	if !bytes.Equal(installed, lock) {
		logf("node peer: npm ci in %s", dir)
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, "node_modules", ".installed-lock.json"), lock, 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "serve.mjs"), nil
}

// nodeVersion is `node --version`, or "" without node.
func nodeVersion() string {
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// nodePeerOptions are the two ways the bench starts the Node peer: in
// memory, and on files (its FileBackedStreamStore) in a fresh directory.
func nodePeerOptions(script string) []struct {
	name string
	opts e2e.Options
} {
	return []struct {
		name string
		opts e2e.Options
	}{
		{"node memory", e2e.Options{Binary: script, ListenFlags: []string{"listen"}, ReadyFlag: "listen"}},
		{"node files", e2e.Options{Binary: script, ListenFlags: []string{"listen"}, ReadyFlag: "listen", Args: []string{"-data-dir=streams"}}},
	}
}

// nodeFiles404 explains the 404s the Node peer's file store answers under
// load (read in the pinned version's dist/index.js and reproduced with 500
// streams appended to at once): a bench finding about the peer, not a
// fault of the bench.
const nodeFiles404 = "node files: its 404s are the peer's own: the file store of @durable-streams/server 0.3.7 keeps at most 100 file handles " +
	"(DurableStreamTestServer does not pass maxFileHandles on), and an append whose handle was evicted before its fsync fails with " +
	"\"handle not found\", which its HTTP layer maps to 404 Stream not found"

// noteNode404 adds nodeFiles404 when the file-store run met a 404.
func noteNode404(rep *Report, sr *ServerRun) {
	if sr == nil || sr.Name != "node files" {
		return
	}
	for _, r := range sr.Workloads {
		for _, p := range append([]*Result{r}, partsOf(r)...) {
			if p.Errors["status_404"] > 0 {
				rep.addNote("node_files_404", nodeFiles404)
				return
			}
		}
	}
	for _, e := range sr.Errors {
		if strings.Contains(e, "404") {
			rep.addNote("node_files_404", nodeFiles404)
			return
		}
	}
}

func partsOf(r *Result) []*Result {
	var out []*Result
	for _, p := range r.Parts {
		out = append(out, p)
	}
	return out
}

// waitAnswer waits until the server answers HTTP at all: the Node peer has
// no readiness route.
func waitAnswer(ctx context.Context, srv *e2e.Server) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL()+"/", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if !srv.Running() {
			return fmt.Errorf("exited before answering: %v; log tail:\n%s", srv.ExitErr(), srv.LogTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer at %s: %w", srv.URL(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
