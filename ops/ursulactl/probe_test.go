package ursulactl

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ready":
			_, _ = w.Write([]byte("{\"ready\":true}\n"))
		case "/unready":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("{\"ready\":false,\"reason\":\"raft_replica_unready\"}\n"))
		case "/moved":
			http.Redirect(w, r, "/ready", http.StatusFound)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err string
	}{
		{"ready", []string{srv.URL + "/ready"}, ExitOK, "200 OK: {\"ready\":true}", ""},
		{"unready", []string{srv.URL + "/unready"}, ExitError, "", "503 Service Unavailable: {\"ready\":false,\"reason\":\"raft_replica_unready\"}"},
		{"redirect", []string{srv.URL + "/moved"}, ExitError, "", "no redirect"},
		{"nobody listens", []string{closed.URL + "/ready"}, ExitError, "", "connection refused"},
		{"not a URL", []string{"127.0.0.1:4437"}, ExitError, "", "want http(s)://host:port/path"},
		{"missing CA file", []string{"--ca-file", "/nonexistent/ca.crt", srv.URL}, ExitError, "", "no such file"},
		{"no URL", nil, ExitError, "", "accepts 1 arg"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := Run(t.Context(), append([]string{"probe", "--timeout", "10s"}, tc.args...), Env{Stdout: &stdout, Stderr: &stderr})
			if code != tc.code || !strings.Contains(stdout.String(), tc.out) || !strings.Contains(stderr.String(), tc.err) {
				t.Fatalf("probe %q: exit %d, stdout %q, stderr %q; want exit %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.out, tc.err)
			}
		})
	}
}
