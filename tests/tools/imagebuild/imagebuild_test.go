package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// A layer with a role link holds a symbolic link entry with a relative
// target and no content, and writing it twice gives the same bytes.
func TestLayerSymlink(t *testing.T) {
	created := time.Unix(1700000000, 0)
	l := layer{comment: "test", entries: []entry{
		{name: "usr/local/bin/ursula-node", mode: 0o777, link: LinkTarget},
		{name: "usr/local/bin/ursula", mode: 0o755, data: []byte("binary")},
		{name: "usr/local/bin/", mode: 0o755},
	}}
	var a, b bytes.Buffer
	if err := l.write(&a, created); err != nil {
		t.Fatal(err)
	}
	if err := l.write(&b, created); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same layer written twice differs")
	}
	tr := tar.NewReader(&a)
	var got []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, hdr.Name)
		if !hdr.ModTime.Equal(created) {
			t.Errorf("%s: time %v, want %v", hdr.Name, hdr.ModTime, created)
		}
		if hdr.Name != "usr/local/bin/ursula-node" {
			continue
		}
		if hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != "ursula" || hdr.Size != 0 || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("role link: type %q, link %q, size %d, owner %d:%d; want a symbolic link to ursula, no content, owned by root",
				hdr.Typeflag, hdr.Linkname, hdr.Size, hdr.Uid, hdr.Gid)
		}
	}
	want := []string{"usr/local/bin/", "usr/local/bin/ursula", "usr/local/bin/ursula-node"}
	if !slices.Equal(got, want) {
		t.Errorf("entries %q, want %q in name order", got, want)
	}
}

func TestCommands(t *testing.T) {
	want := []string{"ursula", "ursula-backup", "ursula-coldgc", "ursula-gateway", "ursula-node", "ursulactl"}
	if got := Commands(); !slices.Equal(got, want) {
		t.Fatalf("Commands() = %q, want %q", got, want)
	}
}
