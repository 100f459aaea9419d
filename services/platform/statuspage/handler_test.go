package statuspage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeNode is a node whose answers a test sets.
type fakeNode struct {
	mu      sync.Mutex
	metrics string // "" answers 500
	ready   string
}

func (f *fakeNode) set(metrics, ready string) {
	f.mu.Lock()
	f.metrics, f.ready = metrics, ready
	f.mu.Unlock()
}

func (f *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/__ursula/metrics":
		if f.metrics == "" {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, f.metrics)
	case "/__ursula/ready":
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, f.ready)
	default:
		http.NotFound(w, r)
	}
}

// newTestPage is a page over one fake node behind an httptest server and
// one that is never reachable.
func newTestPage(t *testing.T, cfg Config) (*Page, *fakeNode) {
	t.Helper()
	fn := &fakeNode{}
	fn.set(`{"node_id": 7, "cluster_id": "c1", "leadership_shed_state": "normal", "append_requests": 0,
		"raft_groups": [{"raft_group_id": 0, "leader_id": 7, "term": 2, "voters": [7], "learners": []}]}`, `{"ready": false, "reason": "starting"}`)
	srv := httptest.NewServer(fn)
	t.Cleanup(srv.Close)
	down := FuncTarget(func(context.Context) Observation {
		return Observation{Address: "10.9.9.9:4437", Err: errors.New("connection refused")}
	})
	p, err := New(cfg, Fixed(HTTPTarget{Address: "n7", BaseURL: srv.URL, Client: srv.Client()}, down), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, fn
}

func TestHandlerAssets(t *testing.T) {
	p, _ := newTestPage(t, Config{})
	srv := httptest.NewServer(p)
	defer srv.Close()
	tests := []struct {
		method, path string
		status       int
		contentType  string
		contains     string
	}{
		{"GET", "/__ursula/ui/", 200, "text/html; charset=utf-8", `<script type="module" src="app.js">`},
		{"GET", "/__ursula/ui/app.js", 200, "text/javascript; charset=utf-8", "new EventSource(\"events\")"},
		{"GET", "/__ursula/ui/style.css", 200, "text/css; charset=utf-8", ":root"},
		{"HEAD", "/__ursula/ui/app.js", 200, "text/javascript; charset=utf-8", ""},
		{"GET", "/__ursula/ui/missing.js", 404, "", ""},
		{"GET", "/__ursula/ui/assets/app.js", 404, "", ""},
		{"GET", "/__ursula/ui/../ui/app.js", 404, "", ""}, // no path below the page
		{"GET", "/__ursula/ui/doc.go", 404, "", ""},
		{"GET", "/__ursula/other", 404, "", ""},
		{"POST", "/__ursula/ui/", 405, "", ""},
		{"GET", "/__ursula/ui/snapshot", 200, "application/json", `"source"`},
	}
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if tt.contentType != "" && resp.Header.Get("Content-Type") != tt.contentType {
				t.Errorf("Content-Type %q, want %q", resp.Header.Get("Content-Type"), tt.contentType)
			}
			if !strings.Contains(string(body), tt.contains) {
				t.Errorf("body does not contain %q:\n%.300s", tt.contains, body)
			}
			for h, want := range map[string]string{"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Access-Control-Allow-Origin": ""} {
				if got := resp.Header.Get(h); got != want {
					t.Errorf("%s: %q, want %q", h, got, want)
				}
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
		})
	}
	t.Run("redirect", func(t *testing.T) {
		resp, err := client.Get(srv.URL + "/__ursula/ui")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/__ursula/ui/" {
			t.Fatalf("GET /__ursula/ui: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
}

// sseReader reads the events of one live connection.
type sseReader struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func openEvents(t *testing.T, ctx context.Context, url string) *sseReader {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/__ursula/ui/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("events: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	return &sseReader{resp: resp, sc: sc}
}

// next returns the next snapshot event.
func (r *sseReader) next(t *testing.T) Snapshot {
	t.Helper()
	event := ""
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			if event != "snapshot" {
				t.Fatalf("data of event %q", event)
			}
			var s Snapshot
			if err := json.Unmarshal([]byte(line[len("data: "):]), &s); err != nil {
				t.Fatalf("decode %s: %v", line, err)
			}
			return s
		}
	}
	t.Fatalf("the stream ended: %v", r.sc.Err())
	return Snapshot{}
}

func TestEvents(t *testing.T) {
	p, fn := newTestPage(t, Config{MaxViewers: 2, Source: "test"})
	now := time.UnixMilli(0)
	p.now = func() time.Time { now = now.Add(time.Second); return now }
	srv := httptest.NewServer(p)
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	p.Refresh(ctx)
	ev := openEvents(t, ctx, srv.URL)
	defer ev.resp.Body.Close()
	first := ev.next(t)
	if first.Source != "test" || len(first.Nodes) != 2 || first.History == nil && first.Sample != nil {
		t.Fatalf("first event %+v", first)
	}
	byAddr := map[string]NodeView{}
	for _, n := range first.Nodes {
		byAddr[n.Address] = n
	}
	if n := byAddr["n7"]; !n.Reachable || n.ID != 7 || n.Ready || n.Reason != "starting" || n.Leads != 1 {
		t.Errorf("node n7: %+v", n)
	}
	if n := byAddr["10.9.9.9:4437"]; n.Reachable || n.Reason != "unreachable" || n.Error != "connection refused" {
		t.Errorf("the unreachable node: %+v", n)
	}
	if len(first.Groups) != 1 || first.Groups[0].Leader != 7 {
		t.Errorf("groups %+v", first.Groups)
	}

	// A second read makes a rate: the next event carries the sample (and
	// not the whole history).
	fn.set(`{"node_id": 7, "cluster_id": "c1", "leadership_shed_state": "maintenance-drain", "append_requests": 5, "append_ns": 5000000,
		"raft_groups": [{"raft_group_id": 0, "leader_id": 7, "term": 2, "voters": [7], "learners": []}]}`, `{"ready": true}`)
	p.Refresh(ctx)
	second := ev.next(t)
	if second.History != nil || second.Sample == nil || second.Sample.AppendsPerSec != 5 || second.Sample.AppendMs != 1 {
		t.Fatalf("second event: history %v sample %+v", second.History, second.Sample)
	}
	for _, n := range second.Nodes {
		if n.ID == 7 && (n.ShedState != "maintenance-drain" || !n.Ready) {
			t.Errorf("node 7 after the drain: %+v", n)
		}
	}

	// A viewer that connects later gets the history.
	late := openEvents(t, ctx, srv.URL)
	defer late.resp.Body.Close()
	if h := late.next(t).History; len(h) != 1 || h[0].AppendsPerSec != 5 {
		t.Fatalf("history of a later viewer: %+v", h)
	}

	// A third viewer is refused: at most MaxViewers.
	resp, err := http.Get(srv.URL + "/__ursula/ui/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a viewer beyond MaxViewers: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	// The node goes down: the next event shows it unreachable, under the
	// id it had.
	fn.set("", "")
	p.Refresh(ctx)
	for _, n := range ev.next(t).Nodes {
		if n.Address == "n7" && (n.Reachable || n.ID != 7 || n.LastSeen == 0) {
			t.Errorf("node 7 down: %+v", n)
		}
	}
}

// TestEventsEndWithStop checks that WithStop ends live connections, so
// that a server's graceful stop does not wait for them, and that the
// viewer's slot is given back.
func TestEventsEndWithStop(t *testing.T) {
	p, _ := newTestPage(t, Config{MaxViewers: 1})
	stop, stopNow := context.WithCancel(t.Context())
	srv := httptest.NewServer(WithStop(p, stop))
	defer srv.Close()
	p.Refresh(t.Context())
	ev := openEvents(t, t.Context(), srv.URL)
	defer ev.resp.Body.Close()
	ev.next(t)
	stopNow()
	for ev.sc.Scan() {
	}
	resp, err := http.Get(srv.URL + "/__ursula/ui/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a viewer after the stop: %d (its slot was not given back?)", resp.StatusCode)
	}
}

// TestRunPollsFastWhileWatched checks the two polling rates: Run reads
// the nodes once at start, then again at once when a viewer arrives.
func TestRunPollsFastWhileWatched(t *testing.T) {
	p, _ := newTestPage(t, Config{Interval: time.Millisecond, IdleInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	srv := httptest.NewServer(p)
	defer srv.Close()
	ev := openEvents(t, ctx, srv.URL)
	// With an hour of idle interval, versions beyond the first come only
	// from the fast polling a viewer turns on.
	for {
		if _, v, _ := p.current(false); v >= 3 {
			break
		}
		ev.next(t)
	}
	ev.resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
