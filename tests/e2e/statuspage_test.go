package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// EnvUIScreenshot names a file where TestStatusPage writes a PNG of the
// status page of a running cluster (docs/img/status-page.png is made so),
// and, next to it with "-degraded" added to the name, one with a node
// drained and another stopped.
const EnvUIScreenshot = "URSULA_UI_SCREENSHOT"

// chromiumPath is where Debian's chromium package installs the browser.
const chromiumPath = "/usr/bin/chromium"

// chromiumBinary returns the path of a Chromium, installing Debian's package when
// none is there and the test runs as root; it skips the test, saying why,
// only when installing is impossible.
func chromiumBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat(chromiumPath); err == nil {
		return chromiumPath
	}
	if os.Geteuid() != 0 {
		t.Skipf("no Chromium at %s and not root: install it (apt-get install -y chromium) to run the browser test", chromiumPath)
	}
	t.Logf("installing chromium (apt-get)")
	for _, args := range [][]string{
		{"apt-get", "install", "-y", "--no-install-recommends", "chromium"},
		// The package lists may be missing or stale.
		{"apt-get", "update"},
		{"apt-get", "install", "-y", "--no-install-recommends", "chromium"},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err == nil && args[1] == "install" {
			return chromiumPath
		}
		if err != nil {
			t.Logf("%s: %v\n%s", strings.Join(args, " "), err, lastLines(string(out), 20))
		}
	}
	t.Skipf("Chromium is not installed and apt-get could not install it (see the log above)")
	return ""
}

func lastLines(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// pageErrors collects what the page reports as errors: uncaught
// exceptions, console.error calls and the browser's own error log entries
// (a failed load, a refused script, a CSP violation).
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

// watch subscribes to the console of the context's tab; it must run before
// the page loads.
func (p *pageErrors) watch(ctx context.Context, wg *sync.WaitGroup) {
	msgs := chromedp.Console(ctx)
	wg.Go(func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				p.mu.Lock()
				p.errs = append(p.errs, m.String())
				p.mu.Unlock()
			}
		}
	})
}

func (p *pageErrors) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// TestStatusPage opens the gateway's status page of a 3-node cluster in a
// headless Chromium: the page loads without errors, shows every group's
// leader, then shows a drained node draining and a stopped node
// unreachable, each within seconds; a node's admin plane serves the same
// page.
func TestStatusPage(t *testing.T) {
	chrome := chromiumBinary(t)
	const groups = 8
	c := StartCluster(t, ClusterOptions{Gateway: true, GroupCount: groups})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// Some traffic, so that the charts have something to draw: writers,
	// and a reader following each stream.
	writeCtx, stopWriting := context.WithCancel(ctx)
	var writers sync.WaitGroup
	defer func() { stopWriting(); writers.Wait() }()
	cl := c.Client()
	for i := range 3 {
		writers.Go(func() {
			name := fmt.Sprintf("ui-%d", i)
			if _, err := cl.Create(writeCtx, name, "text/plain", nil); err != nil {
				return
			}
			// A reader follows the stream with catch-up reads, 50 a second
			// (the load's pace, not a wait for anything): the nodes time
			// those, not long-polls.
			writers.Go(func() {
				pace := time.NewTicker(20 * time.Millisecond)
				defer pace.Stop()
				off := "-1"
				for {
					select {
					case <-writeCtx.Done():
						return
					case <-pace.C:
					}
					r, err := cl.Do(writeCtx, http.MethodGet, name, url.Values{"offset": {off}}, nil, nil)
					if err == nil && r.NextOffset() != "" {
						off = r.NextOffset()
					}
				}
			})
			for n := 0; writeCtx.Err() == nil; n++ {
				_, _ = cl.Append(writeCtx, name, "text/plain", []byte(strings.Repeat("x", 200+n%800)), nil)
			}
		})
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:0:0],
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	// The first Run starts the browser; it must not have a deadline.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[string]("navigator.userAgent")); err != nil {
		t.Fatalf("start %s: %v", chrome, err)
	}
	var perrs pageErrors
	var watching sync.WaitGroup
	wctx, stopWatching := context.WithCancel(bctx)
	defer func() { stopWatching(); watching.Wait() }()
	perrs.watch(wctx, &watching)

	url := c.GatewayURL() + "/__ursula/ui/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	waitFor := func(what, sel string, within time.Duration) {
		t.Helper()
		wctx, cancel := context.WithTimeout(bctx, within)
		defer cancel()
		start := time.Now()
		if err := chromedp.Do(wctx, chromedp.WaitReady(chromedp.CSS(sel))); err != nil {
			html, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
			t.Fatalf("the page does not show %s (%s) within %v: %v\nerrors: %v\n%s", what, sel, within, err, perrs.list(), html)
		}
		t.Logf("the page shows %s after %v", what, time.Since(start).Round(time.Millisecond))
	}
	waitFor("a live connection", `body[data-live="true"]`, 30*time.Second)
	waitFor("three reachable nodes", `#nodes tbody tr[data-node="3"][data-state="ready"]`, 30*time.Second)

	// Every group's leader, as the nodes report it. A leadership may move
	// between the two reads: compare until they agree.
	leadersShown := func() (map[uint32]uint64, error) {
		rows, err := chromedp.Run(bctx, chromedp.Evaluate[[]map[string]string](`[...document.querySelectorAll("#groups tbody tr")].map(r => ({g: r.dataset.group, l: r.dataset.leader}))`))
		out := map[uint32]uint64{}
		for _, r := range rows {
			g, _ := strconv.ParseUint(r["g"], 10, 32)
			l, _ := strconv.ParseUint(r["l"], 10, 64)
			out[uint32(g)] = l
		}
		return out, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		want, _, err := c.GroupLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := leadersShown()
		if err != nil {
			t.Fatal(err)
		}
		ok := len(got) == groups
		for g, l := range want {
			if l == 0 || got[g] != l {
				ok = false
			}
		}
		if ok {
			t.Logf("the page shows the leaders of all %d groups: %v", groups, got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page shows leaders %v, the nodes report %v", got, want)
		}
		// Wait for the page's next update rather than polling blindly.
		v, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS("#updated"), "data-version"))
		t.Logf("shown %v, reported %v, version %v %v", got, want, v, err)
		n, _ := strconv.Atoi(v.Value)
		waitFor("its next update", fmt.Sprintf(`#updated:not([data-version="%d"])`, n), 10*time.Second)
	}

	if path := os.Getenv(EnvUIScreenshot); path != "" {
		// Enough samples for the charts to show a line.
		waitFor("a minute of history", `#updated[data-version="40"]`, 2*time.Minute)
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the screenshot to %s (%d bytes)", path, len(png))
	}

	// Drain node 3 through its admin plane, as ursulactl drain does.
	drained := c.Node(3)
	m, err := drained.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	r := mustDo(ctx, t, hc, http.MethodPost, "http://"+drained.Config.AdminListen+"/__ursula/leadership-shed/maintenance",
		http.Header{"X-Ursula-Process-Incarnation": {m.ProcessIncarnation}, "Authorization": {drained.AdminAuth(t)}}, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("drain node 3: %v", r)
	}
	waitFor("node 3 draining", `#nodes tbody tr[data-node="3"][data-state="draining"]`, 10*time.Second)

	// Stop node 2.
	if err := c.Node(2).Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor("node 2 unreachable", `#nodes tbody tr[data-node="2"][data-state="unreachable"]`, 10*time.Second)
	waitFor("the live connection still up", `body[data-live="true"]`, 10*time.Second)
	if path := os.Getenv(EnvUIScreenshot); path != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		degraded := strings.TrimSuffix(path, ".png") + "-degraded.png"
		if err := os.WriteFile(degraded, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the screenshot of the drained and stopped nodes to %s", degraded)
	}

	// Node 1's admin plane serves the same page, as node 1 sees the cluster.
	adminURL := "http://" + c.Node(1).Config.AdminListen + "/__ursula/ui/"
	if err := chromedp.Do(bctx, chromedp.Navigate(adminURL)); err != nil {
		t.Fatalf("open %s: %v", adminURL, err)
	}
	waitFor("node 1's page live", `body[data-live="true"]`, 30*time.Second)
	waitFor("node 2 unreachable on node 1's page", `#nodes tbody tr[data-node="2"][data-state="unreachable"]`, 10*time.Second)
	waitFor("node 3 draining on node 1's page", `#nodes tbody tr[data-node="3"][data-state="draining"]`, 10*time.Second)
	if src, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("source"))); err != nil || src != "node 1" {
		t.Fatalf("node 1's page says it is served by %q (%v)", src, err)
	}

	if errs := perrs.list(); len(errs) > 0 {
		t.Fatalf("the page reported %d errors:\n%s", len(errs), strings.Join(errs, "\n"))
	}
}
