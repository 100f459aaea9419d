package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStatusPageAccess checks who gateway.status_page lets open the page,
// and that its answers never carry the stream API's CORS headers.
func TestStatusPageAccess(t *testing.T) {
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("status page " + r.URL.Path))
	})
	tests := []struct {
		name    string
		setting string
		ui      http.Handler
		remote  string
		host    string
		header  map[string]string
		want    int
	}{
		{"loopback by default", "", ui, "127.0.0.1:5000", "127.0.0.1:4437", nil, 200},
		{"loopback: localhost", StatusPageLoopback, ui, "127.0.0.1:5000", "localhost:4437", nil, 200},
		{"loopback: ipv6", StatusPageLoopback, ui, "[::1]:5000", "[::1]:4437", nil, 200},
		{"loopback: another host", StatusPageLoopback, ui, "192.0.2.1:5000", "127.0.0.1:4437", nil, 403},
		{"loopback: a rebound name", StatusPageLoopback, ui, "127.0.0.1:5000", "attacker.example:4437", nil, 403},
		{"loopback: through a proxy", StatusPageLoopback, ui, "127.0.0.1:5000", "127.0.0.1:4437", map[string]string{"X-Forwarded-For": "192.0.2.1"}, 403},
		{"loopback: Forwarded", StatusPageLoopback, ui, "127.0.0.1:5000", "127.0.0.1:4437", map[string]string{"Forwarded": "for=192.0.2.1"}, 403},
		{"on: anyone", StatusPageOn, ui, "192.0.2.1:5000", "gw.example", nil, 200},
		{"off", StatusPageOff, ui, "127.0.0.1:5000", "127.0.0.1:4437", nil, 404},
		{"no page", StatusPageOn, nil, "127.0.0.1:5000", "127.0.0.1:4437", nil, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.StatusPage, c.StatusUI = tt.setting, tt.ui })
			for _, path := range []string{"/__ursula/ui", "/__ursula/ui/", "/__ursula/ui/app.js"} {
				req := httptest.NewRequest("GET", path, nil)
				req.RemoteAddr, req.Host = tt.remote, tt.host
				for k, v := range tt.header {
					req.Header.Set(k, v)
				}
				rec := httptest.NewRecorder()
				g.Handler().ServeHTTP(rec, req)
				if rec.Code != tt.want {
					t.Fatalf("GET %s: %d, want %d: %s", path, rec.Code, tt.want, rec.Body.String())
				}
				if rec.Code == 200 && rec.Body.String() != "status page "+path {
					t.Fatalf("GET %s: %q", path, rec.Body.String())
				}
				if v := rec.Header().Get("Access-Control-Allow-Origin"); v != "" {
					t.Fatalf("GET %s: Access-Control-Allow-Origin %q", path, v)
				}
			}
		})
	}
	// Paths that only start like the page's are not the page.
	g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.StatusPage, c.StatusUI = StatusPageOn, ui })
	if rec := do(t, g, "GET", "/__ursula/uix", "", nil); rec.Code != http.StatusNotFound || strings.Contains(rec.Body.String(), "status page") {
		t.Fatalf("GET /__ursula/uix: %d %q", rec.Code, rec.Body.String())
	}
}

func TestStatusPageConfig(t *testing.T) {
	for _, v := range []string{"", "off", "loopback", "on"} {
		if err := (&Config{StatusPage: v}).Validate(); err != nil {
			t.Errorf("status_page %q: %v", v, err)
		}
	}
	err := (&Config{StatusPage: "public"}).Validate()
	if err == nil || !strings.Contains(err.Error(), "status_page") {
		t.Fatalf("status_page \"public\": %v", err)
	}
	c := Config{}
	c.applyDefaults()
	if c.StatusPage != StatusPageLoopback {
		t.Fatalf("default status_page %q, want loopback", c.StatusPage)
	}
}

// TestStatusPageEndsAtClose checks that a live connection to the page
// ends when the gateway closes, so that its graceful stop does not wait.
func TestStatusPageEndsAtClose(t *testing.T) {
	ended := make(chan struct{})
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(ended)
	})
	g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.StatusPage, c.StatusUI = StatusPageOn, ui })
	req := httptest.NewRequest("GET", "/__ursula/ui/events", nil).WithContext(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}()
	g.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the live connection did not end at Close")
	}
	<-done
}
