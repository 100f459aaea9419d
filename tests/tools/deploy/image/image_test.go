// Package image_test checks the container image archive of make image
// with an independent reader (go-containerregistry): its configuration,
// its files, that every command runs from the extracted filesystem and
// names itself (the per-role names through their symbolic links to
// ursula, each with its own default target; the entrypoint serves), that
// the CA bundle parses, and that building again gives the same bytes.
package image_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ursula/ursula/tests/tools/imagebuild"
)

// env returns a variable make test-deploy sets.
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run these tests with make test-deploy (it builds the image first)", name)
	}
	return v
}

// archive is the image archive of make image.
func archive(t *testing.T) string { return env(t, "URSULA_IMAGE") }

// extract unpacks a tar stream under dir, refusing paths that leave it,
// and returns the headers by cleaned name.
func extract(t *testing.T, r io.Reader, dir string) map[string]*tar.Header {
	t.Helper()
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			t.Fatalf("tar entry %q leaves the root", hdr.Name)
		}
		hdrs[name] = hdr
		p := filepath.Join(dir, name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode).Perm()|0o200)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			// Only links that stay inside the root, relative to their
			// directory, as the image's role links are.
			if target := filepath.Join(filepath.Dir(name), hdr.Linkname); filepath.IsAbs(hdr.Linkname) || !filepath.IsLocal(target) {
				t.Fatalf("tar entry %q links to %q, outside the root or absolute", hdr.Name, hdr.Linkname)
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("tar entry %q of unexpected type %q", hdr.Name, hdr.Typeflag)
		}
	}
}

// images reads the archive both ways a container engine does: as an OCI
// image layout (index.json) and as a docker load archive (manifest.json).
func images(t *testing.T) (oci, docker v1.Image) {
	t.Helper()
	f, err := os.Open(archive(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	extract(t, f, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read as an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	// One image under two names: its version and latest.
	var refs []string
	for _, m := range im.Manifests {
		if m.Digest != im.Manifests[0].Digest {
			t.Fatalf("index.json names two images: %s, %s", m.Digest, im.Manifests[0].Digest)
		}
		refs = append(refs, m.Annotations["io.containerd.image.name"])
	}
	if len(refs) != 2 || !strings.HasPrefix(refs[0], "docker.io/library/ursula:") || refs[1] != "docker.io/library/ursula:latest" {
		t.Errorf("index.json names the image %q, want docker.io/library/ursula:<version> and :latest", refs)
	}
	if oci, err = idx.Image(im.Manifests[0].Digest); err != nil {
		t.Fatal(err)
	}
	if docker, err = tarball.ImageFromPath(archive(t), nil); err != nil {
		t.Fatalf("read as a docker load archive: %v", err)
	}
	return oci, docker
}

func TestImageConfig(t *testing.T) {
	oci, docker := images(t)
	ociName, err := oci.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	dockerName, err := docker.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if ociName != dockerName {
		t.Fatalf("index.json and manifest.json name different configs: %s, %s", ociName, dockerName)
	}
	cf, err := oci.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if arch := env(t, "URSULA_IMAGE_ARCH"); cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want the non-root 65532:65532", cf.Config.User)
	}
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/usr/local/bin/ursula" {
		t.Errorf("entrypoint %q, want /usr/local/bin/ursula", got)
	}
	for _, p := range []string{"4436/tcp", "4437/tcp", "4439/tcp", "4440/tcp"} {
		if _, ok := cf.Config.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed (exposed: %v)", p, cf.Config.ExposedPorts)
		}
	}
	if _, ok := cf.Config.ExposedPorts["4438/tcp"]; ok {
		t.Error("the loopback-only admin port 4438 is exposed")
	}
	for _, l := range []string{"org.opencontainers.image.version", "org.opencontainers.image.revision", "org.opencontainers.image.source"} {
		if cf.Config.Labels[l] == "" {
			t.Errorf("label %s missing (labels: %v)", l, cf.Config.Labels)
		}
	}
	secs, err := strconv.ParseInt(env(t, "URSULA_IMAGE_CREATED"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if !cf.Created.Time.Equal(time.Unix(secs, 0)) {
		t.Errorf("created %v, want SOURCE_DATE_EPOCH %v", cf.Created.Time, time.Unix(secs, 0).UTC())
	}
	layers, err := oci.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff ids", len(layers), len(cf.RootFS.DiffIDs))
	}
	for i, l := range layers {
		// Reading a layer through go-containerregistry checks its digest.
		diffID, err := l.DiffID()
		if err != nil {
			t.Fatal(err)
		}
		if diffID != cf.RootFS.DiffIDs[i] {
			t.Errorf("layer %d has diff id %s, the config says %s", i, diffID, cf.RootFS.DiffIDs[i])
		}
	}
}

func TestFilesystemAndBinaries(t *testing.T) {
	oci, _ := images(t)
	cf, err := oci.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	flat := mutate.Extract(oci)
	defer flat.Close()
	hdrs := extract(t, flat, root)

	if h := hdrs["data"]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != 65532 || h.Gid != 65532 {
		t.Errorf("/data: %+v, want a directory owned by 65532:65532", h)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(passwd), "\nursula:x:65532:65532:") {
		t.Errorf("/etc/passwd has no ursula user 65532:\n%s", passwd)
	}
	group, err := os.ReadFile(filepath.Join(root, "etc/group"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(group), "\nursula:x:65532:") {
		t.Errorf("/etc/group has no ursula group 65532:\n%s", group)
	}

	t.Run("CA bundle", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		n := 0
		for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatalf("certificate %d: %v", n, err)
			}
			if !c.IsCA {
				t.Errorf("certificate %d (%s) is not a CA", n, c.Subject)
			}
			pool.AddCert(c)
			n++
		}
		// Mozilla's program has well over a hundred roots.
		if n < 100 {
			t.Fatalf("the CA bundle holds %d certificates, want Mozilla's roots", n)
		}
	})

	t.Run("serves", func(t *testing.T) {
		serves(t, filepath.Join(root, "usr/local/bin/ursula"), filepath.Join(root, "data"))
	})

	version := cf.Config.Labels["org.opencontainers.image.version"]
	for _, b := range imagebuild.Binaries {
		t.Run(b, func(t *testing.T) {
			h := hdrs["usr/local/bin/"+b]
			if h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || h.Uid != 0 {
				t.Fatalf("/usr/local/bin/%s: %+v, want an executable file owned by root", b, h)
			}
			runVersion(t, filepath.Join(root, "usr/local/bin", b), b, version)
		})
	}
	for _, b := range imagebuild.RoleLinks {
		t.Run(b, func(t *testing.T) {
			h := hdrs["usr/local/bin/"+b]
			if h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "ursula" || h.Uid != 0 {
				t.Fatalf("/usr/local/bin/%s: %+v, want a symbolic link to ursula owned by root", b, h)
			}
			path := filepath.Join(root, "usr/local/bin", b)
			if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("extracted /usr/local/bin/%s is not a symbolic link: %v, %v", b, fi, err)
			}
			runVersion(t, path, b, version)
			runHelp(t, path, b)
		})
	}
	t.Run("ursula target", func(t *testing.T) {
		runHelp(t, filepath.Join(root, "usr/local/bin/ursula"), "ursula")
	})
}

// runVersion runs a command of the extracted image with its version flag
// and checks that it names itself and the image's version:
// "<name> <version> (commit ...)".
func runVersion(t *testing.T, path, name, version string) {
	t.Helper()
	flag := "-version"
	if name == "ursulactl" {
		flag = "--version"
	}
	out := run(t, path, flag)
	if want := name + " " + version + " "; !strings.HasPrefix(out, want) {
		t.Fatalf("%s %s printed %q, want it to start with %q", name, flag, out, want)
	}
}

// targets are the default targets of the server's names.
var targets = map[string]string{
	"ursula":         "all",
	"ursula-node":    "node",
	"ursula-gateway": "gateway",
	"ursula-coldgc":  "coldgc",
	"ursula-backup":  "backup",
}

// runHelp runs a server command of the extracted image with -h and checks
// that it names itself and runs its own default target: the ursula binary
// run through a role link is that role's binary.
func runHelp(t *testing.T, path, name string) {
	t.Helper()
	out := run(t, path, "-h")
	for _, want := range []string{"Usage: " + name + " ", fmt.Sprintf("Runs the %q target", targets[name])} {
		if !strings.Contains(out, want) {
			t.Fatalf("%s -h does not say %q:\n%.400s", name, want, out)
		}
	}
}

// run runs a command of the extracted image as the image would (an
// environment of PATH only) and returns its output.
func run(t *testing.T, path string, args ...string) string {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=/nonexistent"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(path), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestReproducible(t *testing.T) {
	oci, _ := images(t)
	cf, err := oci.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels := cf.Config.Labels
	cfg := imagebuild.Config{
		BinDir:   env(t, "URSULA_IMAGE_BIN_DIR"),
		Arch:     cf.Architecture,
		Version:  labels["org.opencontainers.image.version"],
		Revision: labels["org.opencontainers.image.revision"],
		Source:   labels["org.opencontainers.image.source"],
		Created:  cf.Created.Time,
	}
	want := fileDigest(t, archive(t))
	// Built again from the same inputs, in this process: the same bytes
	// as make image wrote.
	h := sha256.New()
	res, err := imagebuild.Build(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		t.Fatalf("a second build of the same inputs differs from %s", archive(t))
	}
	digest, err := oci.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if digest.String() != res.Manifest.Digest {
		t.Fatalf("rebuilt manifest %s, archive's %s", res.Manifest.Digest, digest)
	}
	// And an input that changes changes the image.
	cfg.Created = cfg.Created.Add(time.Second)
	other, err := imagebuild.Build(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if other.Manifest.Digest == res.Manifest.Digest {
		t.Fatal("another creation time gave the same image digest")
	}
}

// The binaries directory of make image holds the image's role links too
// (the compose process test runs ursula-node from it): the Makefile's
// IMAGE_LINKS are imagebuild.RoleLinks.
func TestBinDirLinks(t *testing.T) {
	dir := env(t, "URSULA_IMAGE_BIN_DIR")
	for _, b := range imagebuild.RoleLinks {
		target, err := os.Readlink(filepath.Join(dir, b))
		if err != nil || target != imagebuild.LinkTarget {
			t.Errorf("%s/%s: link to %q (%v), want a symbolic link to %s", dir, b, target, err, imagebuild.LinkTarget)
		}
	}
}

func fileDigest(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}

// serves runs the image's entrypoint as `docker run` would with no
// arguments but a gateway address (the image's working directory, an
// environment of PATH only) and wants its readiness to answer 200, then a
// clean exit on SIGTERM.
func serves(t *testing.T, bin, workDir string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	var log bytes.Buffer
	cmd := exec.Command(bin, "-gateway.listen", addr, "-server.listen", "127.0.0.1:0", "-server.admin_listen", "")
	cmd.Dir = workDir
	cmd.Env = []string{"PATH=/usr/local/bin"}
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/__ursula/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("exited before it was ready: %v", err)
		case <-deadline:
			t.Fatalf("not ready within a minute (last: %v)", err)
		case <-tick.C:
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		done <- err
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	done <- nil
	if strings.Contains(log.String(), "deprecated setting name") {
		t.Errorf("the image's entrypoint warned of a deprecated setting name: the test should use the current ones")
	}
	if _, err := os.Stat(filepath.Join(workDir, "data")); err != nil {
		t.Errorf("no data directory under the working directory: %v", err)
	}
}
