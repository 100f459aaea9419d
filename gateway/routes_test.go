package gateway

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ursula/ursula/gateway/subscription"
	"github.com/ursula/ursula/services/platform/statuspage"
	"github.com/ursula/ursula/tests/apicheck"
)

// routeSources are the directories whose code dispatches the gateway's
// requests: its own routing, the subscription APIs and the status page.
var routeSources = []string{".", "subscription", "../services/platform/statuspage"}

// routeMethods are the methods probed on every path.
var routeMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost,
	http.MethodDelete, http.MethodPatch, http.MethodOptions,
}

// TestRoutesDocumented holds the gateway's dispatch to openapi.yaml. It
// sends every method to every path shape the dispatch can tell apart,
// with every path segment the dispatch code could compare against (each
// word of each string literal in routeSources), through a gateway whose
// optional routes are all on (subscriptions, Prometheus, the status page).
// An answer other than 404, 405 or a 400 refusing a malformed path
// parameter is a route: its method and path must be an operation of the
// document (in Ursula's family, with one trailing slash ignored, as the
// document says). OPTIONS is the CORS preflight of any path (so the
// document says); it must answer as one. Every operation of the document
// must be answered by some probe, so the document holds nothing the
// gateway does not serve.
//
// Blind spots: a literal segment that is no string literal of
// routeSources (built at run time, or from another package), a route
// chosen by a query parameter other than record, and a route two unknown
// segments deep.
func TestRoutesDocumented(t *testing.T) {
	raw, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := apicheck.Load(t, raw)
	logger := slog.New(slog.DiscardHandler)
	subs, err := subscription.New(subscription.DefaultConfig(), failingClient{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(subs.Close)
	ui, err := statuspage.New(statuspage.Config{}, statuspage.Fixed(), logger)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{
		Subscriptions: subs,
		Prometheus:    http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
		StatusPage:    StatusPageOn,
		StatusUI:      ui,
	}, failingClient{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	h := g.Handler()
	// A live answer (the status page's events) ends at once.
	done, cancel := context.WithCancel(t.Context())
	cancel()
	// Refusals of a malformed path parameter (bucket, stream id, offset,
	// part number), which come before the method is looked at.
	badPath := []string{ErrBadBucket.Error(), ErrReservedBucket.Error(), ErrBadStreamID.Error(), ErrBadOffset.Error(), ErrBadPartNumber.Error()}

	reached := map[string]bool{}
	for _, target := range probePaths(routeWords(t)) {
		path, _, _ := strings.Cut(target, "?")
		for _, m := range routeMethods {
			ctx := t.Context()
			if isStatusPage(path) {
				ctx = done
			}
			req := httptest.NewRequestWithContext(ctx, m, target, nil)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			code := rec.Code
			if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
				continue
			}
			var refusal struct{ Message string }
			if code == http.StatusBadRequest && json.Unmarshal(rec.Body.Bytes(), &refusal) == nil && slices.Contains(badPath, refusal.Message) {
				continue
			}
			tmpl, ok := doc.Operation(m, path)
			if !ok && strings.HasSuffix(path, "/") && !strings.HasPrefix(path, DefaultStreamRoot) && !strings.HasPrefix(path, ownPrefix) {
				// One trailing slash is ignored in Ursula's family (so
				// says the document's description).
				tmpl, ok = doc.Operation(m, path[:len(path)-1])
			}
			if m == http.MethodOptions && !ok {
				if code != http.StatusNoContent || rec.Header().Get("Access-Control-Allow-Methods") == "" {
					t.Errorf("OPTIONS %s answered %d, not the CORS preflight", target, code)
				}
				continue
			}
			if !ok {
				t.Errorf("%s %s answered %d, but openapi.yaml has no such operation: %.200s", m, target, code, rec.Body.String())
				continue
			}
			reached[m+" "+tmpl] = true
		}
	}
	for _, op := range doc.Templates() {
		if !reached[op[0]+" "+op[1]] {
			t.Errorf("openapi.yaml has %s %s, which no probe reached (404 or 405 to each)", op[0], op[1])
		}
	}
}

// segmentWord is a string that may be a path segment of a route.
var segmentWord = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)

// routeWords returns every word of every string literal of routeSources'
// code (not tests): a route's literal segments are among them.
func routeWords(tb testing.TB) []string {
	tb.Helper()
	set := map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range routeSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			tb.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				tb.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for _, w := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune("/?&=, ;:\"'", r) }) {
					if segmentWord.MatchString(w) {
						set[w] = true
					}
				}
				return true
			})
		}
	}
	words := make([]string, 0, len(set))
	for w := range set {
		words = append(words, w)
	}
	slices.Sort(words)
	return words
}

// probePaths returns the paths to probe: every shape the dispatch tells
// apart, with each word in each literal position, and valid values (a
// bucket, a stream, an offset, a part number, a subscription) in the
// others.
func probePaths(words []string) []string {
	const (
		bucket = "/bk"
		stream = "/bk/st"
		offset = "1_2"
		subs   = DefaultStreamRoot + reservedSegment + "/subscriptions/sub"
	)
	var out []string
	add := func(paths ...string) {
		for _, p := range paths {
			out = append(out, p, p+"/", p+"?record=1")
		}
	}
	out = append(out, "/")
	add(DefaultStreamRoot[:len(DefaultStreamRoot)-1], DefaultStreamRoot, ownPrefix[:len(ownPrefix)-1])
	for _, w := range words {
		add(ownPrefix+w, statusPagePrefix+"/"+w,
			DefaultStreamRoot+w, DefaultStreamRoot+"a/"+w,
			DefaultStreamRoot+reservedSegment+"/"+w, DefaultStreamRoot+reservedSegment+"/subscriptions/"+w, subs+"/"+w, subs+"/"+w+"/a/b",
			stream+"/"+w, stream+"/"+w+"/"+offset, stream+"/"+w+"/1",
			stream+"/snapshot/"+offset+"/"+w, stream+"/snapshot/"+offset+"/"+w+"/1")
		if ValidateBucket(w) == nil {
			add("/" + w)
		}
		add(bucket + "/" + w)
	}
	return out
}
