package compose_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/compose-spec/compose-go/v2/types"
)

// loopbackHosts are the last bytes of the loopback addresses that stand
// for the compose services' hosts in TestClusterOnLoopback: every service
// keeps its ports, on an address of its own in a 127.x.y.0/24 picked at
// random, so that two runs on one machine do not collide.
var loopbackHosts = map[string]int{"node1": 1, "node2": 2, "node3": 3, "s3": 10, "gateway": 20, "coldgc": 21, "backup": 22}

// loopback maps the services to their addresses in this run.
var loopback = func() map[string]string {
	x, y := 1+rand.IntN(254), 1+rand.IntN(254)
	m := map[string]string{}
	for name, h := range loopbackHosts {
		m[name] = fmt.Sprintf("127.%d.%d.%d", x, y, h)
	}
	return m
}()

// TestClusterOnLoopback runs the compose cluster without containers: each
// service's binary on its mounted configuration and with its environment
// from compose.yaml, the service names and container paths mapped to
// loopback addresses and temporary directories, versitygw as the s3
// service. The gateway must become ready and serve a stream, the backup
// service must reach every node, and every process must stop cleanly on
// SIGTERM. It checks that the files agree with each other (certificates,
// peers, buckets, credentials), not Docker itself.
func TestClusterOnLoopback(t *testing.T) {
	binDir := os.Getenv("URSULA_IMAGE_BIN_DIR")
	versitygw := os.Getenv("VERSITYGW")
	if binDir == "" || versitygw == "" {
		t.Fatal("URSULA_IMAGE_BIN_DIR or VERSITYGW is not set: run these tests with make test-deploy")
	}
	p := load(t)
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// pki: what the pki service runs.
	pkiDir := filepath.Join(root, "pki")
	pki := p.Services["pki"]
	args := append([]string{}, pki.Command...)
	args[len(args)-3] = pkiDir // --dir /data
	if out, err := exec.CommandContext(ctx, filepath.Join(binDir, pki.Entrypoint[0]), args...).CombinedOutput(); err != nil {
		t.Fatalf("pki: %v\n%s", err, out)
	}

	// s3: versitygw with the buckets the configurations name, and the
	// service's credentials.
	s3Dir := filepath.Join(root, "s3")
	for _, bucket := range []string{"ursula-cold", "ursula-backups"} {
		if err := os.MkdirAll(filepath.Join(s3Dir, bucket), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	procs := &processes{t: t}
	defer procs.killAll()
	procs.start("s3", root, versitygw, []string{"--port", loopback["s3"] + ":7070", "--health", "/health", "--quiet", "posix", s3Dir}, p.Services["s3"].Environment)
	procs.waitOK(ctx, http.DefaultClient, "http://"+loopback["s3"]+":7070/health")

	for _, name := range []string{"node1", "node2", "node3", "gateway", "coldgc", "backup"} {
		s := p.Services[name]
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_, cfg := serviceConfig(t, p, s)
		cfg = onLoopback(cfg, loopback[name], dir, pkiDir).(map[string]any)
		file := filepath.Join(dir, "ursula.toml")
		writeTOML(t, file, cfg)
		bin := filepath.Join(binDir, s.Entrypoint[0])
		env := types.MappingWithEquals{}
		for k, v := range s.Environment {
			vv := *v
			if strings.Contains(vv, "://s3:7070") {
				vv = strings.ReplaceAll(vv, "://s3:7070", "://"+loopback["s3"]+":7070")
			}
			env[k] = &vv
		}
		procs.start(name, dir, bin, []string{"-config", file}, env)
		if name == "node3" {
			// As compose starts the others: once the nodes are healthy
			// (their healthcheck, over TLS with the pki's CA; the dev
			// certificates name localhost).
			client := tlsClient(t, filepath.Join(pkiDir, "ca.crt"), "localhost")
			for _, n := range nodes {
				procs.waitOK(ctx, client, "https://"+loopback[n]+":4437/__ursula/ready")
			}
		}
	}

	gw := "http://" + loopback["gateway"] + ":4437"
	procs.waitOK(ctx, http.DefaultClient, gw+"/__ursula/ready")
	procs.waitOK(ctx, http.DefaultClient, "http://"+loopback["backup"]+":4436/__ursula/ready")
	procs.waitOK(ctx, http.DefaultClient, "http://"+loopback["coldgc"]+":4440/__ursula/ready")
	stream := gw + "/v1/stream/compose-check"
	for _, step := range []struct {
		method string
		body   string
		want   int
	}{{http.MethodPut, "", http.StatusCreated}, {http.MethodPost, "hello from compose", http.StatusNoContent}} {
		// A ready gateway may still answer 503 while it learns where
		// the leaders are: a client retries that.
		resp, b := retry503(ctx, t, func() (*http.Request, error) {
			req, err := http.NewRequestWithContext(ctx, step.method, stream, strings.NewReader(step.body))
			if err == nil {
				req.Header.Set("Content-Type", "text/plain")
			}
			return req, err
		})
		if resp.StatusCode != step.want {
			t.Fatalf("%s %s: %s %s, want %d", step.method, stream, resp.Status, b, step.want)
		}
	}
	if body := get200(ctx, t, stream+"?offset=-1"); body != "hello from compose" {
		t.Fatalf("read back %q", body)
	}
	// A Prometheus on the compose network scrapes each node's read-only
	// metrics port (server.metrics_listen).
	for _, n := range nodes {
		if body := get200(ctx, t, "http://"+loopback[n]+":4440/__ursula/prometheus"); !strings.Contains(body, "ursula_build_info{") {
			t.Errorf("%s's metrics port serves no ursula_build_info:\n%.500s", n, body)
		}
	}
	if body := get200(ctx, t, "http://"+loopback["coldgc"]+":4440/__ursula/prometheus"); !strings.Contains(body, "ursula_coldgc_passes_total ") {
		t.Errorf("the cold-GC worker's metrics port serves no ursula_coldgc_passes_total:\n%.500s", body)
	}
	// Stopped in the reverse order of depends_on, as compose stops them.
	for _, name := range []string{"backup", "coldgc", "gateway", "node3", "node2", "node1", "s3"} {
		procs.terminate(name)
	}
}

// onLoopback rewrites a configuration for TestClusterOnLoopback: service
// host names become their loopback addresses, listeners bind the
// service's own address, container paths become directories under dir.
func onLoopback(v any, addr, dir, pkiDir string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = onLoopback(x, addr, dir, pkiDir)
		}
		return v
	case []map[string]any:
		for i := range v {
			v[i] = onLoopback(v[i], addr, dir, pkiDir).(map[string]any)
		}
		return v
	case []any:
		for i := range v {
			v[i] = onLoopback(v[i], addr, dir, pkiDir)
		}
		return v
	case string:
		switch {
		case strings.HasPrefix(v, ":"):
			return addr + v
		case strings.HasPrefix(v, "127.0.0.1:"):
			return addr + strings.TrimPrefix(v, "127.0.0.1")
		case strings.HasPrefix(v, "/etc/ursula/pki/"):
			return filepath.Join(pkiDir, strings.TrimPrefix(v, "/etc/ursula/pki/"))
		case strings.HasPrefix(v, "/data/"):
			return filepath.Join(dir, strings.TrimPrefix(v, "/data/"))
		}
		for host, a := range loopback {
			v = strings.ReplaceAll(v, "://"+host+":", "://"+a+":")
			if rest, ok := strings.CutPrefix(v, host+":"); ok && rest != "" && rest[0] >= '0' && rest[0] <= '9' {
				v = a + ":" + rest
			}
		}
		return v
	}
	return v
}

func writeTOML(t *testing.T, path string, v any) {
	t.Helper()
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(v); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// processes are the services started by a test, by name.
type processes struct {
	t     *testing.T
	names []string
	cmds  map[string]*exec.Cmd
	logs  map[string]*logBuffer
	done  map[string]chan error
}

func (ps *processes) start(name, dir, bin string, args []string, env types.MappingWithEquals) {
	ps.t.Helper()
	if ps.cmds == nil {
		ps.cmds, ps.logs, ps.done = map[string]*exec.Cmd{}, map[string]*logBuffer{}, map[string]chan error{}
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	for k, v := range env {
		if v != nil {
			cmd.Env = append(cmd.Env, k+"="+*v)
		}
	}
	log := &logBuffer{}
	// One writer for both: exec copies them from one pipe.
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		ps.t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ps.names = append(ps.names, name)
	ps.cmds[name], ps.logs[name], ps.done[name] = cmd, log, done
}

// terminate sends SIGTERM and wants a clean exit within the compose
// stop_grace_period.
func (ps *processes) terminate(name string) {
	ps.t.Helper()
	cmd := ps.cmds[name]
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-ps.done[name]:
		ps.done[name] <- err
		if err != nil && name != "s3" {
			ps.t.Errorf("%s exited with %v after SIGTERM; log:\n%s", name, err, tail(ps.logs[name]))
		}
	case <-time.After(30 * time.Second):
		ps.t.Errorf("%s still runs 30 s after SIGTERM", name)
	}
}

// killAll kills what still runs, and prints the logs of a failed test.
func (ps *processes) killAll() {
	for _, name := range ps.names {
		select {
		case err := <-ps.done[name]:
			ps.done[name] <- err
		default:
			_ = ps.cmds[name].Process.Kill()
			<-ps.done[name]
		}
		if ps.t.Failed() {
			ps.t.Logf("%s log:\n%s", name, tail(ps.logs[name]))
		}
	}
}

// exited names a process that has exited, if any.
func (ps *processes) exited() (string, error) {
	for _, name := range ps.names {
		select {
		case err := <-ps.done[name]:
			ps.done[name] <- err
			return name, err
		default:
		}
	}
	return "", nil
}

// logBuffer holds a process's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// tail is the end of the output.
func tail(l *logBuffer) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// waitOK polls url until it answers 200, failing when ctx ends or a
// process exits first: readiness is a condition only the service can
// report.
func (ps *processes) waitOK(ctx context.Context, client *http.Client, url string) {
	t := ps.t
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s %s", resp.Status, b)
		} else {
			last = err.Error()
		}
		if name, err := ps.exited(); name != "" {
			t.Fatalf("%s exited (%v) while waiting for %s", name, err, url)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready: %s", url, last)
		case <-tick.C:
		}
	}
}

// retry503 sends the request again while it is answered 503, until ctx
// ends; it returns the last answer and its body.
func retry503(ctx context.Context, t *testing.T, newReq func() (*http.Request, error)) (*http.Response, []byte) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := newReq()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			return resp, b
		}
		select {
		case <-ctx.Done():
			return resp, b
		case <-tick.C:
		}
	}
}

// tlsClient trusts the CA of caFile and checks the server's name.
func tlsClient(t *testing.T, caFile, serverName string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}
}

func get200(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	return string(b)
}
