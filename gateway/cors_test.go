package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// corsNotAllowed are request headers the handlers read that a page does
// not send: a reverse proxy sets them, and the preflight machinery reads
// its own.
var corsNotAllowed = []string{"X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-For", "Forwarded", "Access-Control-Request-Headers"}

// corsAllowedUnread are allowed request headers no handler reads by name:
// the server span continues the W3C trace context through the propagator.
var corsAllowedUnread = []string{"traceparent", "tracestate"}

// corsNotExposed are response headers a handler sets that a page need not
// be granted: CORS-safelisted ones, CORS's own, and those addressed to the
// browser or a proxy.
var corsNotExposed = []string{
	"Cache-Control", "Content-Language", "Expires", "Last-Modified", "Pragma",
	"Access-Control-Allow-Origin", "Access-Control-Expose-Headers", "Access-Control-Allow-Methods",
	"Access-Control-Allow-Headers", "Access-Control-Max-Age",
	"X-Content-Type-Options", "Cross-Origin-Resource-Policy", "X-Accel-Buffering",
}

// TestCORSHeadersComplete reads the gateway's sources (and those of the
// subscription APIs it mounts) for the request headers the handlers read
// and the response headers they set, and fails when a read header is not
// in Access-Control-Allow-Headers or a set one not in
// Access-Control-Expose-Headers, and when a listed header is read or set
// nowhere.
func TestCORSHeadersComplete(t *testing.T) {
	var reads, writes []string
	for _, dir := range []string{".", "subscription"} {
		r, w := scanHeaders(t, dir)
		reads, writes = append(reads, r...), append(writes, w...)
	}
	// The scan must find what we know is there, or it proves nothing.
	for _, want := range []string{"Stream-Incarnation", "Stream-Record-Match", "Stream-Snapshot-Match", "Prefer", "Producer-Id"} {
		if !containsHeader(reads, want) {
			t.Fatalf("the source scan found no read of %s; reads: %v", want, reads)
		}
	}
	for _, want := range []string{"Stream-Next-Offset", "Stream-Record-First", "Retry-After"} {
		if !containsHeader(writes, want) {
			t.Fatalf("the source scan found no write of %s; writes: %v", want, writes)
		}
	}

	allow := splitList(allowHeaders)
	expose := splitList(exposeHeaders)
	for _, name := range reads {
		if !containsHeader(allow, name) && !containsHeader(corsNotAllowed, name) {
			t.Errorf("the gateway reads request header %s, which Access-Control-Allow-Headers lacks", name)
		}
	}
	for _, name := range allow {
		if !containsHeader(reads, name) && !containsHeader(corsAllowedUnread, name) {
			t.Errorf("Access-Control-Allow-Headers lists %s, which no handler reads", name)
		}
	}
	for _, name := range writes {
		if !containsHeader(expose, name) && !containsHeader(corsNotExposed, name) {
			t.Errorf("the gateway sets response header %s, which Access-Control-Expose-Headers lacks", name)
		}
	}
	for _, name := range expose {
		if !containsHeader(writes, name) {
			t.Errorf("Access-Control-Expose-Headers lists %s, which no handler sets", name)
		}
	}
}

// TestPreflightAllowsOwnHeaders checks the preflight answer itself.
func TestPreflightAllowsOwnHeaders(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, nil)
	rec := do(t, g, http.MethodOptions, "/v1/stream/s", "", map[string]string{
		"Origin":                         "https://app.example",
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "stream-incarnation, x-custom",
	})
	if rec.Code != http.StatusNoContent {
		t.Fatalf("preflight status %d", rec.Code)
	}
	allow := splitList(rec.Header().Get("Access-Control-Allow-Headers"))
	for _, want := range []string{"Stream-Incarnation", "Stream-Record-Match", "Stream-Snapshot-Match", "Prefer", "X-Custom"} {
		if !containsHeader(allow, want) {
			t.Errorf("Access-Control-Allow-Headers %v lacks %s", allow, want)
		}
	}
	if n := strings.Count(strings.ToLower(rec.Header().Get("Access-Control-Allow-Headers")), "stream-incarnation"); n != 1 {
		t.Errorf("Stream-Incarnation listed %d times", n)
	}
	// The next preflight without extras answers the shared list untouched.
	rec = do(t, g, http.MethodOptions, "/v1/stream/s", "", nil)
	if got := rec.Header().Get("Access-Control-Allow-Headers"); got != allowHeaders {
		t.Errorf("Access-Control-Allow-Headers %q, want %q", got, allowHeaders)
	}
}

// headerName matches a canonical or lower-case HTTP header name as the
// handlers spell them.
var headerName = regexp.MustCompile(`^([A-Z][A-Za-z0-9]*)(-[A-Za-z0-9]+)*$`)

// scanHeaders parses the non-test Go files of dir and returns the header
// names read (headerValue(h, K), X.Get(K) and X.Values(K) on a header)
// and set (X[K] = v, X.Set(K, v), X.Add(K, v)), constants resolved.
func scanHeaders(t *testing.T, dir string) (reads, writes []string) {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	consts := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
	}
	value := func(e ast.Expr) (string, bool) {
		var s string
		switch x := e.(type) {
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return "", false
			}
			s, _ = strconv.Unquote(x.Value)
		case *ast.Ident:
			v, ok := consts[x.Name]
			if !ok {
				return "", false
			}
			s = v
		default:
			return "", false
		}
		return s, headerName.MatchString(s) || s == "traceparent"
	}
	// isHeader reports an expression that is the header of the request
	// served or of its answer, by the handlers' naming: r.Header,
	// w.Header(), h, hdr, out (not that of a request the server sends).
	isHeader := func(e ast.Expr) bool {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			id, ok := x.X.(*ast.Ident)
			return ok && id.Name == "r" && x.Sel.Name == "Header"
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			return ok && sel.Sel.Name == "Header"
		case *ast.Ident:
			return x.Name == "h" || x.Name == "hdr" || x.Name == "out" || x.Name == "header"
		}
		return false
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok && id.Name == "headerValue" && len(x.Args) == 2 {
					if v, ok := value(x.Args[1]); ok {
						reads = append(reads, v)
					}
				}
				sel, ok := x.Fun.(*ast.SelectorExpr)
				if !ok || len(x.Args) == 0 || !isHeader(sel.X) {
					return true
				}
				v, ok := value(x.Args[0])
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "Get", "Values":
					reads = append(reads, v)
				case "Set", "Add":
					writes = append(writes, v)
				}
			case *ast.AssignStmt:
				for _, lhs := range x.Lhs {
					if ix, ok := lhs.(*ast.IndexExpr); ok && isHeader(ix.X) {
						if v, ok := value(ix.Index); ok {
							writes = append(writes, v)
						}
					}
				}
			}
			return true
		})
	}
	return reads, writes
}

func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func containsHeader(list []string, name string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.EqualFold(s, name) })
}
