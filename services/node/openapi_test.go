package node

import (
	"bytes"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/tests/apicheck"
)

// TestAdminOpenAPI sends a request to every operation of the admin
// plane's OpenAPI document, answers and errors alike, validates each
// request and answer against the document, and fails on an operation it
// did not reach. TestAdminOpenAPIRoutes checks the converse: every route
// the node registers is in the document.
func TestAdminOpenAPI(t *testing.T) {
	n := startBackupNode(t, objstore.NewMemory())
	fill(t, n.eng, "demo", "hello", 3)
	c := apicheck.NewClient(apicheck.Load(t, adminOpenAPI), n.ts.URL, n.ts.Client())
	inc := authed(n.s, n.s.Incarnation())
	token := authed(n.s, "")
	jsonBody := http.Header{"Content-Type": []string{"application/json"}}

	served := c.Call(t, "GET", "/__ursula/openapi.json", nil, nil, 200)
	if !bytes.Equal(served.Body, adminOpenAPI) {
		t.Error("GET /__ursula/openapi.json does not answer the embedded document")
	}
	c.Call(t, "GET", "/__ursula/metrics", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/ready", nil, nil, 503) // Run has not started
	c.Call(t, "GET", "/__ursula/usage", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/prometheus", nil, nil, 404) // no exporter in this test
	c.Call(t, "GET", "/__ursula/leadership-shed", nil, nil, 200)
	c.Call(t, "POST", "/__ursula/leadership-shed/maintenance", inc, nil, 200)
	c.Call(t, "DELETE", "/__ursula/leadership-shed/maintenance", inc, nil, 200)
	c.Call(t, "GET", "/__ursula/feature-level", nil, nil, 200)
	c.Call(t, "POST", "/__ursula/feature-level", apicheck.Headers(inc, jsonBody), []byte(`{"level": 2}`), 200)
	c.Call(t, "POST", "/__ursula/feature-level", apicheck.Headers(inc, jsonBody), []byte(`{"level": 4000000000}`), 409)
	c.Call(t, "POST", "/__ursula/raft/0/leader/transfer/5", inc, nil, 400)
	c.Call(t, "POST", "/__ursula/raft/3/learners/2?blocking=true", inc, nil, 200)
	c.Call(t, "POST", "/__ursula/raft/0/membership?voters=1", inc, nil, 200)
	c.Call(t, "POST", "/__ursula/raft/0/snapshot", inc, nil, 200)
	c.Call(t, "POST", "/__ursula/raft/0/purge?upto=1", inc, nil, 200)
	c.Call(t, "POST", "/__ursula/flush-cold/demo/hello", inc, nil, 200)
	c.Call(t, "POST", "/__ursula/flush-cold/demo/missing/with/slashes", inc, nil, 404)
	c.Call(t, "POST", "/__ursula/raft/0/recovery/accept-unsynced-loss", apicheck.Headers(inc, jsonBody), []byte(`{"leader": 1, "point": 1, "step": {"lead": {"highest_term": 1}}, "expected": {"current_term": 1}}`), 409)
	c.Call(t, "GET", "/__ursula/backup/info", nil, nil, 200)
	c.Call(t, "POST", "/__ursula/backup/group/0/hold?holder=openapi&ttl_ms=0", inc, nil, 200)
	object := c.Call(t, "GET", "/__ursula/backup/group/0/export?min_applied_index=1", nil, nil, 200).Body
	octet := http.Header{"Content-Type": []string{"application/octet-stream"}}
	c.Call(t, "POST", "/__ursula/backup/group/0/cold-check", apicheck.Headers(inc, octet), object, 200)
	c.Call(t, "POST", "/__ursula/backup/group/0/import", apicheck.Headers(inc, octet, http.Header{BackupBlake3Header: []string{strings.Repeat("0", 64)}}), object, 400)
	c.Call(t, "DELETE", "/__ursula/purge/demo", inc, nil, 200)
	c.Call(t, "GET", "/__ursula/audit?limit=50", token, nil, 200)
	c.Call(t, "GET", "/__ursula/ui/", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/ui/snapshot", nil, nil, 200)

	// Refusals are answered in the documented error shape too; these
	// requests break the document on purpose, so only the answer is
	// checked.
	c.Refused(t, "POST", "/__ursula/raft/0/snapshot", authed(n.s, ""), nil, 428)
	c.Refused(t, "POST", "/__ursula/raft/0/snapshot", authed(n.s, "another"), nil, 412)
	c.Refused(t, "POST", "/__ursula/raft/0/snapshot", incarnation(n.s.Incarnation()), nil, 401)
	c.Refused(t, "GET", "/__ursula/audit?limit=0", nil, nil, 400)
	c.Refused(t, "POST", "/__ursula/raft/x/snapshot", inc, nil, 400)
	c.Refused(t, "POST", "/__ursula/raft/99/recovery/accept-unsynced-loss", apicheck.Headers(inc, jsonBody), []byte(`{}`), 404)
	c.Refused(t, "POST", "/__ursula/raft/0/recovery/accept-unsynced-loss", apicheck.Headers(inc, jsonBody), []byte(`{}`), 422)
	c.Refused(t, "POST", "/__ursula/feature-level", apicheck.Headers(inc, jsonBody), []byte(`{"level": "x"}`), 400)

	// The hand-written GET routes answer HEAD too.
	for _, h := range []struct {
		target string
		status int
	}{
		{"/__ursula/openapi.json", 200}, {"/__ursula/ready", 503}, {"/__ursula/usage", 200},
		{"/__ursula/prometheus", 404}, {"/__ursula/audit", 200}, {"/__ursula/feature-level", 200},
		{"/__ursula/backup/info", 200}, {"/__ursula/backup/group/0/export", 200},
		{"/__ursula/ui/", 200}, {"/__ursula/ui/snapshot", 200},
	} {
		c.Call(t, "HEAD", h.target, nil, nil, h.status)
	}

	// Every other method of each documented path is refused.
	for _, target := range []string{
		"/__ursula/openapi.json", "/__ursula/metrics", "/__ursula/ready", "/__ursula/usage", "/__ursula/prometheus",
		"/__ursula/audit", "/__ursula/leadership-shed", "/__ursula/leadership-shed/maintenance",
		"/__ursula/raft/0/leader/transfer/1", "/__ursula/raft/0/learners/2", "/__ursula/raft/0/membership",
		"/__ursula/raft/0/snapshot", "/__ursula/raft/0/purge", "/__ursula/flush-cold/demo/a/b",
		"/__ursula/purge/demo", "/__ursula/raft/0/recovery/accept-unsynced-loss", "/__ursula/feature-level",
		"/__ursula/backup/info", "/__ursula/backup/group/0/hold", "/__ursula/backup/group/0/export",
		"/__ursula/backup/group/0/cold-check", "/__ursula/backup/group/0/import",
	} {
		c.Undocumented(t, target, inc)
	}

	if missed := c.Unreached(); len(missed) > 0 {
		t.Errorf("operations of the document this test did not reach: %v", missed)
	}
}

// adminRoutePattern finds a route registration of the admin, client or
// cluster plane's mux ("GET /__ursula/ready") in the node's sources.
var adminRoutePattern = regexp.MustCompile(`\.Handle(?:Func)?\("([A-Z]+) (/[^"]*)"`)

// httpRulePattern finds a REST mapping of AdminService in admin_http.yaml.
var httpRulePattern = regexp.MustCompile(`(?m)^\s+(get|post|put|delete|patch): (/\S+)`)

// TestAdminOpenAPIRoutes fails on a route the node registers (by hand or
// through admin_http.yaml) that the admin document lacks, but the test
// build's /__ursula/featuretest/ routes.
func TestAdminOpenAPIRoutes(t *testing.T) {
	doc := apicheck.Load(t, adminOpenAPI)
	var routes [][2]string
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		src, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range adminRoutePattern.FindAllStringSubmatch(string(src), -1) {
			routes = append(routes, [2]string{m[1], m[2]})
		}
	}
	rules, err := os.ReadFile("../../proto/ursula/admin/v1/admin_http.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range httpRulePattern.FindAllStringSubmatch(string(rules), -1) {
		routes = append(routes, [2]string{strings.ToUpper(m[1]), m[2]})
	}
	if len(routes) < 20 {
		t.Fatalf("found only %d routes in the sources: the scan is broken", len(routes))
	}
	documented := map[[2]string]bool{}
	for _, mp := range doc.Templates() {
		documented[[2]string{mp[0], normalizeTemplate(mp[1])}] = true
	}
	for _, r := range routes {
		if strings.HasPrefix(r[1], "/__ursula/featuretest/") {
			continue
		}
		if !documented[[2]string{r[0], normalizeTemplate(r[1])}] {
			t.Errorf("the node serves %s %s, which the admin OpenAPI document lacks", r[0], r[1])
		}
	}
}

// normalizeTemplate names every path parameter {}: {group}, {group_id}
// and {stream=**} are one shape.
func normalizeTemplate(p string) string {
	return regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(p, "{}")
}
