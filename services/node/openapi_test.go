package node

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/ursula/ursula/storage/objstore"
)

// TestAdminOpenAPI sends a request to every operation of the admin
// plane's OpenAPI document, answers and errors alike, validates each
// request and answer against the document, and fails on an operation it
// did not reach. TestAdminOpenAPIRoutes checks the converse: every route
// the node registers is in the document.
func TestAdminOpenAPI(t *testing.T) {
	n := startBackupNode(t, objstore.NewMemory())
	fill(t, n.eng, "demo", "hello", 3)
	api := loadAPI(t, adminOpenAPI)
	c := &apiClient{api: api, ts: n.ts}
	inc := authed(n.s, n.s.Incarnation())
	token := authed(n.s, "")
	json := http.Header{"Content-Type": []string{"application/json"}}

	served := c.call(t, "GET", "/__ursula/openapi.json", nil, nil, 200)
	if !bytes.Equal(served, adminOpenAPI) {
		t.Error("GET /__ursula/openapi.json does not answer the embedded document")
	}
	c.call(t, "GET", "/__ursula/metrics", nil, nil, 200)
	c.call(t, "GET", "/__ursula/ready", nil, nil, 503) // Run has not started
	c.call(t, "GET", "/__ursula/usage", nil, nil, 200)
	c.call(t, "GET", "/__ursula/prometheus", nil, nil, 404) // no exporter in this test
	c.call(t, "GET", "/__ursula/leadership-shed", nil, nil, 200)
	c.call(t, "POST", "/__ursula/leadership-shed/maintenance", inc, nil, 200)
	c.call(t, "DELETE", "/__ursula/leadership-shed/maintenance", inc, nil, 200)
	c.call(t, "GET", "/__ursula/feature-level", nil, nil, 200)
	c.call(t, "POST", "/__ursula/feature-level", with(inc, json), []byte(`{"level": 2}`), 200)
	c.call(t, "POST", "/__ursula/feature-level", with(inc, json), []byte(`{"level": 4000000000}`), 409)
	c.call(t, "POST", "/__ursula/raft/0/leader/transfer/5", inc, nil, 400)
	c.call(t, "POST", "/__ursula/raft/3/learners/2?blocking=true", inc, nil, 200)
	c.call(t, "POST", "/__ursula/raft/0/membership?voters=1", inc, nil, 200)
	c.call(t, "POST", "/__ursula/raft/0/snapshot", inc, nil, 200)
	c.call(t, "POST", "/__ursula/raft/0/purge?upto=1", inc, nil, 200)
	c.call(t, "POST", "/__ursula/flush-cold/demo/hello", inc, nil, 200)
	c.call(t, "POST", "/__ursula/flush-cold/demo/missing/with/slashes", inc, nil, 404)
	c.call(t, "POST", "/__ursula/raft/0/recovery/accept-unsynced-loss", with(inc, json), []byte(`{"leader": 1, "point": 1, "step": {"lead": {"highest_term": 1}}, "expected": {"current_term": 1}}`), 409)
	c.call(t, "GET", "/__ursula/backup/info", nil, nil, 200)
	c.call(t, "POST", "/__ursula/backup/group/0/hold?holder=openapi&ttl_ms=0", inc, nil, 200)
	object := c.call(t, "GET", "/__ursula/backup/group/0/export?min_applied_index=1", nil, nil, 200)
	octet := http.Header{"Content-Type": []string{"application/octet-stream"}}
	c.call(t, "POST", "/__ursula/backup/group/0/cold-check", with(inc, octet), object, 200)
	c.call(t, "POST", "/__ursula/backup/group/0/import", with(inc, octet, http.Header{BackupBlake3Header: []string{strings.Repeat("0", 64)}}), object, 400)
	c.call(t, "DELETE", "/__ursula/purge/demo", inc, nil, 200)
	c.call(t, "GET", "/__ursula/audit?limit=50", token, nil, 200)

	// Refusals are answered in the documented error shape too; these
	// requests break the document on purpose, so only the answer is
	// checked.
	c.refused(t, "POST", "/__ursula/raft/0/snapshot", authed(n.s, ""), nil, 428)
	c.refused(t, "POST", "/__ursula/raft/0/snapshot", authed(n.s, "another"), nil, 412)
	c.refused(t, "POST", "/__ursula/raft/0/snapshot", incarnation(n.s.Incarnation()), nil, 401)
	c.refused(t, "GET", "/__ursula/audit?limit=0", nil, nil, 400)
	c.refused(t, "POST", "/__ursula/raft/x/snapshot", inc, nil, 400)
	c.refused(t, "POST", "/__ursula/raft/99/recovery/accept-unsynced-loss", with(inc, json), []byte(`{}`), 404)
	c.refused(t, "POST", "/__ursula/raft/0/recovery/accept-unsynced-loss", with(inc, json), []byte(`{}`), 422)
	c.refused(t, "POST", "/__ursula/feature-level", with(inc, json), []byte(`{"level": "x"}`), 400)

	var missed []string
	for id := range api.ops {
		if !c.reached[id] {
			missed = append(missed, id)
		}
	}
	sort.Strings(missed)
	if len(missed) > 0 {
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
	api := loadAPI(t, adminOpenAPI)
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
	for path, item := range api.doc.Paths.Map() {
		for method := range item.Operations() {
			documented[[2]string{method, normalizeTemplate(path)}] = true
		}
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

// api is an OpenAPI document with its operations matched by path.
type api struct {
	doc    *openapi3.T
	ops    map[string]*apiRoute
	routes []*apiRoute
}

type apiRoute struct {
	method, path string
	re           *regexp.Regexp
	params       []string
	item         *openapi3.PathItem
	op           *openapi3.Operation
}

func loadAPI(tb testing.TB, raw []byte) *api {
	tb.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		tb.Fatalf("load the OpenAPI document: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		tb.Fatalf("the OpenAPI document is invalid: %v", err)
	}
	a := &api{doc: doc, ops: map[string]*apiRoute{}}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			r := &apiRoute{method: method, path: path, item: item, op: op}
			var expr strings.Builder
			expr.WriteString("^")
			rest := path
			for {
				i := strings.IndexByte(rest, '{')
				if i < 0 {
					expr.WriteString(regexp.QuoteMeta(rest))
					break
				}
				j := strings.IndexByte(rest, '}')
				expr.WriteString(regexp.QuoteMeta(rest[:i]))
				name := rest[i+1 : j]
				r.params = append(r.params, name)
				if p := pathParam(item, op, name); p != nil && p.Schema != nil && p.Schema.Value.Pattern == ".+" {
					expr.WriteString("(.+)")
				} else {
					expr.WriteString("([^/]+)")
				}
				rest = rest[j+1:]
			}
			expr.WriteString("$")
			r.re = regexp.MustCompile(expr.String())
			if _, dup := a.ops[op.OperationID]; dup || op.OperationID == "" {
				tb.Fatalf("operationId %q of %s %s is empty or repeated", op.OperationID, method, path)
			}
			a.ops[op.OperationID] = r
			a.routes = append(a.routes, r)
		}
	}
	return a
}

func pathParam(item *openapi3.PathItem, op *openapi3.Operation, name string) *openapi3.Parameter {
	if p := op.Parameters.GetByInAndName("path", name); p != nil {
		return p
	}
	return item.Parameters.GetByInAndName("path", name)
}

// match finds the one operation of method and path; a path a literal
// route matches is not also a parameter's value.
func (a *api) match(method, path string) (*apiRoute, map[string]string, bool) {
	var found []*apiRoute
	for _, r := range a.routes {
		if r.method == method && r.re.MatchString(path) {
			found = append(found, r)
		}
	}
	if len(found) == 0 {
		return nil, nil, false
	}
	// The route with the fewest parameters is the most specific.
	slices.SortFunc(found, func(x, y *apiRoute) int { return len(x.params) - len(y.params) })
	r := found[0]
	vals := map[string]string{}
	for i, v := range r.re.FindStringSubmatch(path)[1:] {
		vals[r.params[i]] = v
	}
	return r, vals, true
}

// apiClient sends requests to a server and checks them and its answers
// against an OpenAPI document.
type apiClient struct {
	api     *api
	ts      *httptest.Server
	reached map[string]bool
}

var validateOptions = &openapi3filter.Options{
	AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	IncludeResponseStatus: true,
	MultiError:            true,
}

// call validates the request, sends it, wants status and validates the
// answer; it returns the answer's body.
func (c *apiClient) call(tb testing.TB, method, target string, header http.Header, body []byte, status int) []byte {
	tb.Helper()
	return c.exchange(tb, method, target, header, body, status, true)
}

// refused is call for a request that breaks the document on purpose: only
// the answer is validated.
func (c *apiClient) refused(tb testing.TB, method, target string, header http.Header, body []byte, status int) []byte {
	tb.Helper()
	return c.exchange(tb, method, target, header, body, status, false)
}

func (c *apiClient) exchange(tb testing.TB, method, target string, header http.Header, body []byte, status int, checkRequest bool) []byte {
	tb.Helper()
	ctx := tb.Context()
	req, err := http.NewRequestWithContext(ctx, method, c.ts.URL+target, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	r, params, ok := c.api.match(method, req.URL.Path)
	if !ok {
		tb.Errorf("%s %s: the document has no such operation", method, target)
		return nil
	}
	if c.reached == nil {
		c.reached = map[string]bool{}
	}
	c.reached[r.op.OperationID] = true
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      &routers.Route{Spec: c.api.doc, Path: r.path, PathItem: r.item, Method: method, Operation: r.op},
		Options:    validateOptions,
	}
	if checkRequest {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			tb.Errorf("%s %s: the request does not match the document: %v", method, target, err)
		}
		// Validation read the body.
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := c.ts.Client().Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read the answer: %v", method, target, err)
	}
	if resp.StatusCode != status {
		tb.Errorf("%s %s: status %d, want %d: %s", method, target, resp.StatusCode, status, raw)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(raw)),
		Options:                validateOptions,
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		tb.Errorf("%s %s: the %d answer does not match the document: %v\n%s", method, target, resp.StatusCode, err, truncate(raw))
	}
	return raw
}

func truncate(b []byte) string {
	if len(b) > 512 {
		return string(b[:512]) + "..."
	}
	return string(b)
}

// with merges headers.
func with(hs ...http.Header) http.Header {
	out := http.Header{}
	for _, h := range hs {
		for k, vs := range h {
			out[http.CanonicalHeaderKey(k)] = vs
		}
	}
	return out
}
