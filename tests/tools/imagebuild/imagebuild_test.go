package imagebuild

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestTag(t *testing.T) {
	tests := []struct{ version, want string }{
		{"v1.2.0", "v1.2.0"},
		{"v1.2.0-3-gabcdef0-dirty", "v1.2.0-3-gabcdef0-dirty"},
		{"v1.2.0+build.7", "v1.2.0-build.7"},
		{".hidden", "_hidden"},
		{"", "latest"},
		{strings.Repeat("a", 200), strings.Repeat("a", 128)},
	}
	for _, tc := range tests {
		t.Run(tc.version, func(t *testing.T) {
			if got := Tag(tc.version); got != tc.want {
				t.Fatalf("Tag(%q) = %q, want %q", tc.version, got, tc.want)
			}
		})
	}
}

func TestBuildRefuses(t *testing.T) {
	created := time.Unix(1700000000, 0)
	notELF := t.TempDir()
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(notELF, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no version", Config{BinDir: notELF, Arch: "amd64", Created: created}, "version is required"},
		{"no time", Config{BinDir: notELF, Arch: "amd64", Version: "v1"}, "SOURCE_DATE_EPOCH"},
		{"unknown arch", Config{BinDir: notELF, Arch: "mips", Version: "v1", Created: created}, "arch"},
		{"missing binaries", Config{BinDir: t.TempDir(), Arch: "amd64", Version: "v1", Created: created}, "no such file"},
		{"not executables", Config{BinDir: notELF, Arch: "amd64", Version: "v1", Created: created}, "binary "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			_, err := Build(tc.cfg, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want an error about %q", err, tc.want)
			}
			if out.Len() != 0 {
				t.Fatalf("Build wrote %d bytes before it failed", out.Len())
			}
		})
	}
}

// A dynamically linked binary (one that needs a libc the image lacks)
// is refused.
func TestCheckStaticRefusesDynamic(t *testing.T) {
	if _, ok := elfMachines[runtime.GOARCH]; !ok {
		t.Skipf("no image for %s", runtime.GOARCH)
	}
	for _, path := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if err := checkStatic(path, runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Fatalf("checkStatic(%s) = %v, want a refusal", path, err)
		}
		return
	}
	t.Skip("no dynamically linked system binary to try")
}

func TestCABundle(t *testing.T) {
	a, err := CABundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := CABundlePEM()
	if string(a) != string(b) || strings.Count(string(a), "BEGIN CERTIFICATE") < 100 {
		t.Fatalf("CA bundle: %d certificates, stable %v", strings.Count(string(a), "BEGIN CERTIFICATE"), string(a) == string(b))
	}
}

func TestFullName(t *testing.T) {
	for ref, want := range map[string]string{
		"ursula:v1":                "docker.io/library/ursula:v1",
		"acme/ursula:v1":           "docker.io/acme/ursula:v1",
		"ghcr.io/acme/ursula:v1":   "ghcr.io/acme/ursula:v1",
		"localhost:5000/ursula:v1": "localhost:5000/ursula:v1",
		"localhost/ursula:v1":      "localhost/ursula:v1",
	} {
		if got := fullName(ref); got != want {
			t.Errorf("fullName(%q) = %q, want %q", ref, got, want)
		}
	}
}
