package apicheck

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

const testDoc = `
openapi: 3.0.3
info: {title: test, version: v1}
paths:
  /items/{id}:
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    get:
      operationId: GetItem
      responses:
        '200':
          description: An item.
          content:
            application/json:
              schema:
                type: object
                required: [n]
                properties:
                  n: {type: integer}
        default:
          description: An error.
          content:
            application/json:
              schema: {$ref: '#/components/schemas/Error'}
  /items/special:
    get:
      operationId: GetSpecial
      responses:
        '200': {description: The special item.}
  /files/{path}:
    parameters:
      - {name: path, in: path, required: true, schema: {type: string, pattern: '.+'}}
    get:
      operationId: GetFile
      responses:
        '200': {description: A file.}
components:
  schemas:
    Error:
      type: object
      required: [code]
      additionalProperties: false
      properties:
        code: {type: string}
`

// recorder is a testing.TB that records errors instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// testServer answers GET /items/1 with n as a number, /items/2 with n as a
// string, PUT /items/1 with 200 (undocumented), DELETE /items/1 with a
// refusal of another shape, and every /files/... with 200.
func testServer(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/items/1":
			_, _ = w.Write([]byte(`{"n": 1}`))
		case r.Method == http.MethodGet && r.URL.Path == "/items/2":
			_, _ = w.Write([]byte(`{"n": "1"}`))
		case r.Method == http.MethodGet:
			_, _ = w.Write([]byte(`{}`))
		case r.Method == http.MethodPut:
			_, _ = w.Write([]byte(`{}`))
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(`{"error": {"code": "X"}}`))
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(`{"code": "METHOD_NOT_ALLOWED"}`))
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

func TestClient(t *testing.T) {
	ts := testServer(t)
	doc := Load(t, []byte(testDoc))
	tests := []struct {
		name    string
		run     func(tb testing.TB, c *Client)
		wantErr []string // substrings, one per error, in order
	}{
		{"a matching answer", func(tb testing.TB, c *Client) { c.Call(tb, "GET", "/items/1", nil, nil, 200) }, nil},
		{"an answer that breaks its schema", func(tb testing.TB, c *Client) { c.Call(tb, "GET", "/items/2", nil, nil, 200) },
			[]string{"does not match the document"}},
		{"another status", func(tb testing.TB, c *Client) { c.Call(tb, "GET", "/items/1", nil, nil, 404) },
			[]string{"status 200, want 404"}},
		{"an undocumented operation", func(tb testing.TB, c *Client) { c.Call(tb, "POST", "/items/1", nil, nil, 405) },
			[]string{"has no such operation"}},
		{"a literal route wins over a parameter", func(tb testing.TB, c *Client) {
			c.Call(tb, "GET", "/items/special", nil, nil, 200)
			if slices.Contains(c.Unreached(), "GetSpecial") {
				tb.Errorf("GetSpecial not reached")
			}
		}, nil},
		{"a .+ parameter takes slashes", func(tb testing.TB, c *Client) { c.Call(tb, "GET", "/files/a/b/c", nil, nil, 200) }, nil},
		{"undocumented methods: answered, and refused in another shape", func(tb testing.TB, c *Client) { c.Undocumented(tb, "/items/1", nil) },
			[]string{"PUT /items/1: answered 200", "DELETE /items/1: the 405 refusal is not"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			c := NewClient(doc, ts.URL, ts.Client())
			tc.run(rec, c)
			if len(rec.errs) != len(tc.wantErr) {
				t.Fatalf("errors %q, want %d matching %q", rec.errs, len(tc.wantErr), tc.wantErr)
			}
			for i, want := range tc.wantErr {
				if !strings.Contains(rec.errs[i], want) {
					t.Errorf("error %q does not contain %q", rec.errs[i], want)
				}
			}
		})
	}
}

func TestUnreached(t *testing.T) {
	ts := testServer(t)
	c := NewClient(Load(t, []byte(testDoc)), ts.URL, ts.Client())
	if got := c.Unreached(); !slices.Equal(got, []string{"GetFile", "GetItem", "GetSpecial"}) {
		t.Fatalf("Unreached before any call = %v", got)
	}
	c.Call(t, "GET", "/items/1", nil, nil, 200)
	if got := c.Unreached(); !slices.Equal(got, []string{"GetFile", "GetSpecial"}) {
		t.Fatalf("Unreached = %v", got)
	}
}
