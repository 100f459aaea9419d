package apicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

func init() {
	// Bodies the documents declare as bytes: decoded as strings, which
	// their schemas (type string, format binary) accept.
	for _, ct := range []string{"application/octet-stream", "multipart/mixed", "text/event-stream", "application/vnd.durable-stream-records+ndjson", "text/html"} {
		if openapi3filter.RegisteredBodyDecoder(ct) == nil {
			openapi3filter.RegisterBodyDecoder(ct, openapi3filter.FileBodyDecoder)
		}
	}
	if openapi3filter.RegisteredBodyDecoder("application/jwk-set+json") == nil {
		openapi3filter.RegisterBodyDecoder("application/jwk-set+json", openapi3filter.JSONBodyDecoder)
	}
}

// Document is a loaded OpenAPI 3 document with its operations.
type Document struct {
	Doc    *openapi3.T
	ops    map[string]*route
	routes []*route
}

type route struct {
	method, path string
	re           *regexp.Regexp
	params       []string
	patterns     []*regexp.Regexp // each parameter's schema pattern, or nil
	literal      int
	item         *openapi3.PathItem
	op           *openapi3.Operation
}

// Load parses and validates raw (JSON or YAML) and indexes its operations;
// it fails the test on an invalid document or a missing or repeated
// operationId.
func Load(tb testing.TB, raw []byte) *Document {
	tb.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		tb.Fatalf("load the OpenAPI document: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		tb.Fatalf("the OpenAPI document is invalid: %v", err)
	}
	d := &Document{Doc: doc, ops: map[string]*route{}}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			r := &route{method: method, path: path, item: item, op: op}
			var expr strings.Builder
			expr.WriteString("^")
			rest := path
			for {
				i := strings.IndexByte(rest, '{')
				if i < 0 {
					expr.WriteString(regexp.QuoteMeta(rest))
					r.literal += len(rest)
					break
				}
				j := strings.IndexByte(rest, '}')
				expr.WriteString(regexp.QuoteMeta(rest[:i]))
				r.literal += i
				name := rest[i+1 : j]
				r.params = append(r.params, name)
				var pattern string
				if p := pathParam(item, op, name); p != nil && p.Schema != nil && p.Schema.Value != nil {
					pattern = p.Schema.Value.Pattern
				}
				if pattern == ".+" {
					expr.WriteString("(.+)")
				} else {
					expr.WriteString("([^/]+)")
				}
				var re *regexp.Regexp
				if pattern != "" {
					if re, err = regexp.Compile(pattern); err != nil {
						tb.Fatalf("%s %s: parameter %s: %v", method, path, name, err)
					}
				}
				r.patterns = append(r.patterns, re)
				rest = rest[j+1:]
			}
			expr.WriteString("$")
			r.re = regexp.MustCompile(expr.String())
			if _, dup := d.ops[op.OperationID]; dup || op.OperationID == "" {
				tb.Fatalf("operationId %q of %s %s is empty or repeated", op.OperationID, method, path)
			}
			d.ops[op.OperationID] = r
			d.routes = append(d.routes, r)
		}
	}
	return d
}

// Templates returns every documented "METHOD path".
func (d *Document) Templates() [][2]string {
	var out [][2]string
	for _, r := range d.routes {
		out = append(out, [2]string{r.method, r.path})
	}
	return out
}

// Operation returns the path template of the operation that serves method
// on path (no query): the most specific one whose path parameters match
// their schema patterns.
func (d *Document) Operation(method, path string) (string, bool) {
	var found []*route
	for _, r := range d.routes {
		if r.method != method {
			continue
		}
		m := r.re.FindStringSubmatch(path)
		if m == nil {
			continue
		}
		ok := true
		for i, re := range r.patterns {
			if re != nil && !re.MatchString(m[i+1]) {
				ok = false
			}
		}
		if ok {
			found = append(found, r)
		}
	}
	if len(found) == 0 {
		return "", false
	}
	slices.SortFunc(found, moreSpecific)
	return found[0].path, true
}

func pathParam(item *openapi3.PathItem, op *openapi3.Operation, name string) *openapi3.Parameter {
	if p := op.Parameters.GetByInAndName("path", name); p != nil {
		return p
	}
	return item.Parameters.GetByInAndName("path", name)
}

// match finds the operation of method and path.
func (d *Document) match(method, path string) (*route, map[string]string, bool) {
	var found []*route
	for _, r := range d.routes {
		if r.method == method && r.re.MatchString(path) {
			found = append(found, r)
		}
	}
	if len(found) == 0 {
		return nil, nil, false
	}
	slices.SortFunc(found, moreSpecific)
	r := found[0]
	vals := map[string]string{}
	for i, v := range r.re.FindStringSubmatch(path)[1:] {
		vals[r.params[i]] = v
	}
	return r, vals, true
}

// moreSpecific orders the routes that match one path: the most literal
// characters first, then the fewest parameters.
func moreSpecific(x, y *route) int {
	if n := y.literal - x.literal; n != 0 {
		return n
	}
	return len(x.params) - len(y.params)
}

// Client sends requests to a server and checks them and their answers
// against a Document.
type Client struct {
	Doc     *Document
	BaseURL string
	HTTP    *http.Client
	reached map[string]bool
}

// NewClient returns a Client of doc towards baseURL.
func NewClient(doc *Document, baseURL string, hc *http.Client) *Client {
	return &Client{Doc: doc, BaseURL: baseURL, HTTP: hc, reached: map[string]bool{}}
}

var options = &openapi3filter.Options{
	AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	IncludeResponseStatus: true,
	MultiError:            true,
}

// Answer is a server's answer.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Call validates the request, sends it, wants status and validates the
// answer.
func (c *Client) Call(tb testing.TB, method, target string, header http.Header, body []byte, status int) Answer {
	tb.Helper()
	return c.exchange(tb, method, target, header, body, status, true)
}

// Refused is Call for a request that breaks the document on purpose: only
// the answer is validated.
func (c *Client) Refused(tb testing.TB, method, target string, header http.Header, body []byte, status int) Answer {
	tb.Helper()
	return c.exchange(tb, method, target, header, body, status, false)
}

func (c *Client) exchange(tb testing.TB, method, target string, header http.Header, body []byte, status int, checkRequest bool) Answer {
	tb.Helper()
	ctx := tb.Context()
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+target, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	r, params, ok := c.Doc.match(method, req.URL.Path)
	if !ok {
		tb.Errorf("%s %s: the document has no such operation", method, target)
		return Answer{}
	}
	c.reached[r.op.OperationID] = true
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      &routers.Route{Spec: c.Doc.Doc, Path: r.path, PathItem: r.item, Method: method, Operation: r.op},
		Options:    options,
	}
	if checkRequest {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			tb.Errorf("%s %s: the request does not match the document: %v", method, target, err)
		}
		// Validation read the body.
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read the answer: %v", method, target, err)
	}
	if resp.StatusCode != status {
		tb.Errorf("%s %s: status %d, want %d: %s", method, target, resp.StatusCode, status, truncate(raw))
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(raw)),
		Options:                options,
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		tb.Errorf("%s %s: the %d answer does not match the document: %v\n%s", method, target, resp.StatusCode, err, truncate(raw))
	}
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

// Unreached returns the operationIds no request reached, sorted.
func (c *Client) Unreached() []string {
	var out []string
	for id := range c.Doc.ops {
		if !c.reached[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func truncate(b []byte) string {
	if len(b) > 512 {
		return string(b[:512]) + "..."
	}
	return string(b)
}

// Headers merges header sets; later ones win.
func Headers(hs ...http.Header) http.Header {
	out := http.Header{}
	for _, h := range hs {
		for k, vs := range h {
			out[http.CanonicalHeaderKey(k)] = vs
		}
	}
	return out
}

// probeMethods are the methods Undocumented tries; OPTIONS is every path's
// CORS preflight on the data plane, and not a route of its own.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodPatch}

// Undocumented sends target every method the document does not list for
// its path and fails unless each is refused: a 4xx whose body (but on
// HEAD) is the JSON error the path's operations document as their
// default answer (else components/schemas/Error). A server that
// answers a method the document lacks fails it.
func (c *Client) Undocumented(tb testing.TB, target string, header http.Header) {
	tb.Helper()
	ctx := tb.Context()
	path, _, _ := strings.Cut(target, "?")
	var best *route
	for _, m := range probeMethods {
		if r, _, ok := c.Doc.match(m, path); ok && (best == nil || moreSpecific(r, best) < 0) {
			best = r
		}
	}
	if best == nil {
		tb.Errorf("%s: the document has no such path", target)
		return
	}
	errSchema := refusalSchema(c.Doc.Doc, best.item)
	for _, m := range probeMethods {
		if best.item.GetOperation(m) != nil {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, m, c.BaseURL+target, nil)
		if err != nil {
			tb.Fatal(err)
		}
		for k, vs := range header {
			req.Header[http.CanonicalHeaderKey(k)] = vs
		}
		resp, err := c.HTTP.Do(req)
		if err != nil {
			tb.Fatalf("%s %s: %v", m, target, err)
		}
		raw, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			tb.Fatalf("%s %s: read the answer: %v", m, target, err)
		}
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			tb.Errorf("%s %s: answered %d, but the document has no %s on %s: %s", m, target, resp.StatusCode, m, best.path, truncate(raw))
			continue
		}
		if m == http.MethodHead || errSchema == nil {
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			tb.Errorf("%s %s: the %d refusal is not JSON: %s", m, target, resp.StatusCode, truncate(raw))
			continue
		}
		if err := errSchema.Value.VisitJSON(v); err != nil {
			tb.Errorf("%s %s: the %d refusal is not the path's documented error: %v", m, target, resp.StatusCode, err)
		}
	}
}

// refusalSchema is the schema of the JSON error an operation of item
// answers by default, or the document's Error.
func refusalSchema(doc *openapi3.T, item *openapi3.PathItem) *openapi3.SchemaRef {
	for _, op := range item.Operations() {
		if d := op.Responses.Default(); d != nil && d.Value != nil {
			if mt := d.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
				return mt.Schema
			}
		}
	}
	return doc.Components.Schemas["Error"]
}
