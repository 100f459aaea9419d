package proto_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const goPackagePrefix = "github.com/ursula/ursula/proto/gen/go/"

var (
	packageLine   = regexp.MustCompile(`(?m)^package ([a-z0-9_.]+);`)
	goPackageLine = regexp.MustCompile(`(?m)^option go_package = "([^";]+);([a-z0-9_]+)";`)
	goFilePackage = regexp.MustCompile(`(?m)^package ([a-z0-9_]+)$`)
)

// TestEveryFileSetsGoPackage: every .proto sets go_package to the import
// path and package name of its generated code in proto/gen/go (what buf's
// managed mode would give it), so that protoc -I proto works without
// buf's managed mode.
func TestEveryFileSetsGoPackage(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("ursula", "*", "*", "*.proto"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .proto files: %v", err)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			pkg := packageLine.FindSubmatch(raw)
			gp := goPackageLine.FindSubmatch(raw)
			if pkg == nil || gp == nil {
				t.Fatalf("want a package and an option go_package = \"<path>;<name>\" line")
			}
			dir := filepath.ToSlash(filepath.Dir(f))
			if want := strings.ReplaceAll(string(pkg[1]), ".", "/"); dir != want {
				t.Errorf("package %s is not in directory %s", pkg[1], want)
			}
			if want := goPackagePrefix + dir; string(gp[1]) != want {
				t.Errorf("go_package path %s, want %s", gp[1], want)
			}
			gen := filepath.Join("gen", "go", dir, strings.TrimSuffix(filepath.Base(f), ".proto")+".pb.go")
			code, err := os.ReadFile(gen)
			if err != nil {
				t.Fatalf("generated code: %v", err)
			}
			if m := goFilePackage.FindSubmatch(code); m == nil || string(m[1]) != string(gp[2]) {
				t.Errorf("go_package name %s, but %s is package %s", gp[2], gen, m)
			}
		})
	}
}

// TestBufModuleIsNamed: buf.yaml names its module, so that other modules
// can depend on it by name.
func TestBufModuleIsNamed(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "buf.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s+name: buf\.build/[a-z0-9-]+/[a-z0-9-]+$`).Match(raw) {
		t.Errorf("buf.yaml names no module (name: buf.build/<owner>/<module>):\n%s", raw)
	}
}
