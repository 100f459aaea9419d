package layering

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/ursula/ursula/"

// rule forbids packages matching from (a path prefix relative to the
// module; "" matches every package) to import packages matching any of
// forbidden, unless the import matches one of allowed.
type rule struct {
	from      string
	forbidden []string
	allowed   []string
	why       string
	// tests extends the rule to the package's test files.
	tests bool
}

// rules is docs/architecture.md's dependency direction.
var rules = []rule{
	{from: "proto/gen/", forbidden: []string{""}, allowed: []string{"proto/gen/"}, tests: true,
		why: "the generated contracts import nothing of ours"},
	{from: "services/platform/", forbidden: []string{""}, allowed: []string{"proto/gen/", "services/platform/"},
		why: "the platform packages are shared by every service and import only the contracts"},
	{from: "storage/", forbidden: []string{"services/", "gateway/", "ops/"}, tests: true,
		why: "storage is a library below the services and the gateway"},
	{from: "storage/coldfmt", forbidden: []string{""}, allowed: []string{"proto/gen/"}, tests: true,
		why: "the cold object format is a leaf every reader of the cold store shares"},
	{from: "storage/backupfmt", forbidden: []string{""}, allowed: []string{"proto/gen/", "storage/coldfmt"}, tests: true,
		why: "the backup format is a leaf the node and the backup service share"},
	{from: "internal/pki", forbidden: []string{""}, tests: true,
		why: "process identities and TLS material are a leaf every plane shares"},
	{from: "internal/freeport", forbidden: []string{""}, tests: true,
		why: "the tests' port picker is a leaf that test servers anywhere share"},
	{from: "storage/fault", forbidden: []string{""}, tests: true,
		why: "the storage error vocabulary is a leaf"},
	{from: "storage/stream", forbidden: []string{"storage/engine", "storage/cluster", "storage/cold", "storage/multiraft", "storage/transport"},
		why: "the replicated state machine knows nothing of the Raft groups or the engine around it"},
	{from: "storage/multiraft", forbidden: []string{"storage/stream", "storage/engine", "storage/cluster", "storage/cold"},
		why: "the Raft host runs any state machine"},
	{from: "storage/cluster", forbidden: []string{"storage/engine", "storage/cold"},
		why: "the cluster side sits below the request engine and the cold tier"},
	{from: "storage/cold", forbidden: []string{"storage/engine", "storage/cluster", "storage/transport"},
		why: "the cold tier reaches the groups through its own narrow interface"},
	{from: "gateway/", forbidden: []string{"storage/"}, tests: true,
		why: "the gateway is stateless: it reaches nodes only through gRPC"},
	{from: "services/coldgc", forbidden: []string{"storage/", "services/node"}, allowed: []string{"storage/objstore", "storage/coldfmt"}, tests: true,
		why: "the cold-GC worker uses the object store and the object format, never the engine, the state machine or Raft"},
	{from: "services/backup", forbidden: []string{"storage/", "services/node"}, allowed: []string{"storage/objstore", "storage/coldfmt", "storage/backupfmt"}, tests: true,
		why: "the backup service uses the object store and the object format, never the engine, the state machine or Raft"},
	{from: "ops/", forbidden: []string{"storage/"}, tests: true,
		why: "operator tools speak to nodes over their planes"},
	{from: "", forbidden: []string{"tests/"}, allowed: []string{"tests/"},
		why: "production code never imports test code"},
}

// testHelpers are the only packages under tests/ that test files of other
// trees may import.
var testHelpers = []string{"tests/await", "tests/apicheck", "tests/otelcheck"}

type pkg struct {
	ImportPath   string
	Name         string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func ours(path string) (string, bool) {
	return strings.CutPrefix(path, module)
}

// matches reports whether path is one of the packages prefixes name: ""
// is every package, "a/" every package below a, and "a/b" the package a/b
// and those below it (not a/bc).
func matches(path string, prefixes []string) bool {
	for _, p := range prefixes {
		switch {
		case p == "":
			return true
		case strings.HasSuffix(p, "/"):
			if strings.HasPrefix(path, p) {
				return true
			}
		case path == p || strings.HasPrefix(path, p+"/"):
			return true
		}
	}
	return false
}

// violations lists the imports of p (relative paths) that break r.
func (r rule) violations(from string, imports []string) []string {
	var out []string
	for _, imp := range imports {
		to, ok := ours(imp)
		if !ok || to == from {
			continue
		}
		if matches(to, r.forbidden) && !matches(to, r.allowed) {
			out = append(out, to)
		}
	}
	return out
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	for _, p := range pkgs {
		from, ok := ours(p.ImportPath)
		if !ok {
			continue
		}
		for _, r := range rules {
			if !matches(from, []string{r.from}) {
				continue
			}
			if r.from == "" && strings.HasPrefix(from, "tests/") {
				continue // test tiers may import anything
			}
			imports := p.Imports
			if r.tests {
				imports = append(append(append([]string(nil), imports...), p.TestImports...), p.XTestImports...)
			}
			for _, bad := range r.violations(from, imports) {
				t.Errorf("%s imports %s: %s", from, bad, r.why)
			}
		}
		if strings.HasPrefix(from, "tests/") {
			continue
		}
		for _, imp := range append(append([]string(nil), p.TestImports...), p.XTestImports...) {
			if to, ok := ours(imp); ok && strings.HasPrefix(to, "tests/") && !matches(to, testHelpers) {
				t.Errorf("tests of %s import %s: outside tests/, test files may import only %v", from, to, testHelpers)
			}
		}
	}
}

// TestRulesCatchABreak: the check finds a forbidden import (so a rule
// that matches nothing cannot pass silently).
func TestRulesCatchABreak(t *testing.T) {
	for _, tc := range []struct {
		from, imp string
	}{
		{"storage/engine", module + "services/platform/errcode"},
		{"gateway/upstream", module + "storage/stream"},
		{"services/coldgc", module + "storage/stream"},
		{"ops/ursulactl", module + "storage/wal"},
		{"storage/coldfmt", module + "storage/objstore"},
		{"storage/cold", module + "storage/engine"},
		{"services/backup", module + "storage/stream"},
		{"storage/backupfmt", module + "storage/objstore"},
	} {
		broken := false
		for _, r := range rules {
			if matches(tc.from, []string{r.from}) && len(r.violations(tc.from, []string{tc.imp})) > 0 {
				broken = true
			}
		}
		if !broken {
			t.Errorf("%s importing %s passes the rules", tc.from, tc.imp)
		}
	}
	for _, tc := range []struct{ from, imp string }{
		{"services/coldgc", module + "storage/coldfmt"},
		{"storage/engine", module + "proto/gen/go/ursula/storage/v1"},
		{"services/node", module + "storage/engine"},
		{"storage/stream", module + "storage/coldfmt"},
		{"services/backup", module + "storage/backupfmt"},
		{"storage/engine", module + "storage/backupfmt"},
	} {
		for _, r := range rules {
			if matches(tc.from, []string{r.from}) && len(r.violations(tc.from, []string{tc.imp})) > 0 {
				t.Errorf("%s importing %s is refused by the rule %q", tc.from, tc.imp, r.why)
			}
		}
	}
}
