package e2e

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenAPIServed: the all-in-one binary serves the data plane's OpenAPI
// document on the gateway and the admin plane's on the admin listener,
// each exactly the committed file (what tests/integration and
// services/node check against real answers).
func TestOpenAPIServed(t *testing.T) {
	srv := StartServer(t, Options{})
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url, file string
	}{
		{"gateway", srv.URL() + "/__ursula/openapi.json", "gateway/openapi.json"},
		{"admin plane", "http://" + srv.Addrs["server.admin_listen"] + "/__ursula/openapi.json", "services/node/openapi/admin.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(root, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET %s: %d %s", tc.url, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if !bytes.Equal(got, want) {
				t.Errorf("GET %s answers %d bytes that are not %s (%d bytes)", tc.url, len(got), tc.file, len(want))
			}
		})
	}
}
