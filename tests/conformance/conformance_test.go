package conformance

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/objstore/objstoretest"
	"github.com/ursula/ursula/tests/e2e"
)

// wantTests is the size of suite 0.3.6 with the subscription tests enabled.
const wantTests = 338

// allowLoopbackWebhooks lets the suite's webhook receivers, which listen on
// this machine, be subscribed to: the default refuses webhooks to loopback
// addresses.
var allowLoopbackWebhooks = []string{"-subscriptions.allow_webhook_hosts=127.0.0.0/8,::1,localhost"}

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

// TestConformance runs the suite against bin/ursula (all roles in one
// process), started as `make run` starts it.
func TestConformance(t *testing.T) {
	dir := suiteDir(t)

	// As `make run` starts it: embedded defaults, ./data in the working
	// directory. Only the listen addresses move to free loopback ports, and
	// loopback webhooks are allowed.
	srv := e2e.StartServer(t, e2e.Options{Args: allowLoopbackWebhooks})
	t.Logf("ursula (pid %d) ready at %s, started as: %s %s", srv.PID(), srv.URL(), srv.Bin, strings.Join(srv.Args(), " "))
	runSuite(t, dir, srv.URL(), []*e2e.Server{srv})
}

// TestConformanceColdS3 runs the suite against bin/ursula whose cold tier
// is a real S3-compatible server (versitygw) and which flushes every
// stream within milliseconds into chunks of a few KiB: reads constantly
// cross from cold objects into the hot window.
func TestConformanceColdS3(t *testing.T) {
	dir := suiteDir(t)
	s3 := objstoretest.NewS3Server(t)
	args, env := e2e.ColdS3Args(t, s3, "conformance", "cold-"+time.Now().UTC().Format("20060102T150405Z"))
	args = append(append(args, e2e.TinyFlushArgs...), allowLoopbackWebhooks...)
	srv := e2e.StartServer(t, e2e.Options{Args: args, Env: env})
	runSuite(t, dir, srv.URL(), []*e2e.Server{srv})
	m := srv.NodeMetrics(t)
	for _, k := range []string{"cold_flushes", "cold_cache_misses"} {
		if v, _ := m[k].(float64); v == 0 {
			t.Errorf("metric %s = %v after the suite: the cold tier was not exercised", k, m[k])
		}
	}
	t.Logf("cold tier during the suite: flushes %v, uploads %v, cache misses %v, cache hits %v, external payloads %v",
		m["cold_flushes"], m["cold_uploads"], m["cold_cache_misses"], m["cold_cache_hits"], m["cold_external_payloads"])
}

// TestConformanceCluster runs the suite against ursula-gateway in front of
// a 3-node cluster of ursula-node processes: every request is routed to
// the leader of its stream's group, and every write is replicated.
func TestConformanceCluster(t *testing.T) {
	dir := suiteDir(t)
	// The nodes flush within milliseconds into their shared cold store, so
	// history reads on followers cross cold objects too.
	c := e2e.StartCluster(t, e2e.ClusterOptions{Nodes: 3, Gateway: true, GatewayArgs: allowLoopbackWebhooks, ColdTuning: e2e.TinyFlushTOML, RuntimeTuning: e2e.TinyFlushRuntimeTOML})
	procs := []*e2e.Server{c.Gateway}
	for _, n := range c.Nodes {
		procs = append(procs, n.Server)
	}
	runSuite(t, dir, c.GatewayURL(), procs)
}

// suiteDir checks for Node and installs the suite; it returns this
// package's directory, where vitest runs.
func suiteDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	requireNode(t)
	installSuite(t, dir)
	return dir
}

// runSuite runs the suite against url and requires every one of its tests
// to run and pass, and every process in procs to survive it.
func runSuite(t testing.TB, dir, url string, procs []*e2e.Server) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "results.json")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npx", "--no-install", "vitest", "run",
		"--reporter=default", "--reporter=json", "--outputFile.json="+out)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"CONFORMANCE_TEST_URL="+url,
		"CONFORMANCE_SUBSCRIPTIONS=1",
		"NO_COLOR=1", "FORCE_COLOR=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("vitest finished in %v (%v)", time.Since(start).Round(time.Millisecond), runErr)

	for _, p := range procs {
		if !p.Running() {
			t.Errorf("%s exited during the suite: %v", filepath.Base(p.Bin), p.ExitErr())
		}
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("vitest wrote no JSON report (%v); vitest: %v", err, runErr)
	}
	var rep report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("parse %s: %v", out, err)
	}

	for _, f := range rep.TestResults {
		if f.Message != "" {
			t.Errorf("%s: %s", f.Name, f.Message)
		}
		for _, a := range f.AssertionResults {
			if a.Status == "passed" {
				continue
			}
			msg := strings.Join(a.FailureMessages, "\n")
			if strings.HasPrefix(msg, "Error: STACK_TRACE_ERROR") {
				// Vitest's JSON report loses the message of some errors,
				// test timeouts among them; the text report above has it.
				msg = "(no message in vitest's JSON report: see the text report above; timeouts look like this)\n" + msg
			}
			if len(msg) > 3000 {
				msg = msg[:3000] + "\n… (cut)"
			}
			name := strings.Join(append(a.AncestorTitles, a.Title), " > ")
			t.Errorf("%s after %.0f ms: %s\n%s", a.Status, a.Duration, name, indent(msg))
		}
	}
	t.Logf("conformance suite: %d of %d tests passed, %d failed, %d skipped or todo (want %d of %d)",
		rep.NumPassedTests, rep.NumTotalTests, rep.NumFailedTests, rep.NumPendingTests+rep.NumTodoTests, wantTests, wantTests)
	if rep.NumPassedTests != wantTests || rep.NumTotalTests != wantTests {
		t.Fatalf("conformance: %d of %d tests passed; every one of the %d must run and pass",
			rep.NumPassedTests, rep.NumTotalTests, wantTests)
	}
}

// report is the part of vitest's JSON reporter output the test reads.
type report struct {
	NumTotalTests   int  `json:"numTotalTests"`
	NumPassedTests  int  `json:"numPassedTests"`
	NumFailedTests  int  `json:"numFailedTests"`
	NumPendingTests int  `json:"numPendingTests"`
	NumTodoTests    int  `json:"numTodoTests"`
	Success         bool `json:"success"`
	TestResults     []struct {
		Name             string `json:"name"`
		Status           string `json:"status"`
		Message          string `json:"message"`
		AssertionResults []struct {
			AncestorTitles  []string `json:"ancestorTitles"`
			Title           string   `json:"title"`
			Status          string   `json:"status"`
			Duration        float64  `json:"duration"`
			FailureMessages []string `json:"failureMessages"`
		} `json:"assertionResults"`
	} `json:"testResults"`
}

// requireNode fails the test unless node (20 or newer) and npm are on PATH.
func requireNode(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"node", "npm", "npx"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the conformance suite needs Node 20+ and npm on PATH: %v", err)
		}
	}
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	m := regexp.MustCompile(`^v(\d+)\.`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("node --version: unexpected %q", out)
	}
	if major, _ := strconv.Atoi(string(m[1])); major < 20 {
		t.Fatalf("the conformance suite needs Node 20 or newer, found %s", strings.TrimSpace(string(out)))
	}
}

// installSuite runs `npm ci` unless node_modules is at least as new as
// package-lock.json (npm ci writes node_modules/.package-lock.json).
func installSuite(t testing.TB, dir string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if inst, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !inst.ModTime().Before(lock.ModTime()) {
		return
	}
	t.Logf("installing the suite: npm ci in %s", dir)
	cmd := exec.CommandContext(t.Context(), "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
