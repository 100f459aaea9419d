package imagebuild

import (
	"debug/elf"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Binaries are the programs the image holds as files, in /usr/local/bin:
// the only ones make image builds.
var Binaries = []string{"ursula", "ursulactl"}

// RoleLinks are the per-role binaries' names, each a symbolic link in
// /usr/local/bin to LinkTarget: ursula takes its default target from the
// name it runs as (services/app.TargetForName), so a link is the per-role
// binary at no cost in size.
var RoleLinks = []string{"ursula-backup", "ursula-coldgc", "ursula-gateway", "ursula-node"}

// LinkTarget is what every RoleLinks link points to, relative to
// /usr/local/bin.
const LinkTarget = "ursula"

// Commands are all the names in /usr/local/bin: Binaries and RoleLinks,
// sorted.
func Commands() []string {
	return slices.Sorted(slices.Values(append(slices.Clone(Binaries), RoleLinks...)))
}

// Ports are the ports the image exposes: backup 4436, client (gateway,
// or a node's client plane) 4437, cluster 4439 and metrics 4440. The
// admin plane (4438) listens on loopback only, inside the container.
var Ports = []int{4436, 4437, 4439, 4440}

// The user the image runs as.
const (
	UID      = 65532
	GID      = 65532
	UserName = "ursula"
)

// Paths in the image.
const (
	Entrypoint = "/usr/local/bin/ursula"
	CABundle   = "/etc/ssl/certs/ca-certificates.crt"
	DataDir    = "/data"
)

// Config says what to build the image from.
type Config struct {
	// BinDir holds the Binaries, statically linked for linux/Arch (the
	// RoleLinks are not read from it).
	BinDir string
	// Arch is the binaries' GOARCH: amd64 or arm64.
	Arch string
	// Version is the release version (org.opencontainers.image.version,
	// and the tag).
	Version string
	// Revision is the VCS commit (org.opencontainers.image.revision).
	Revision string
	// Source is the repository URL (org.opencontainers.image.source).
	Source string
	// Created is the image's time and every file's (SOURCE_DATE_EPOCH).
	Created time.Time
	// Repository is the image name `docker load` tags; default "ursula".
	Repository string
}

// elfMachines maps the supported GOARCH values to ELF machines.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// Validate checks the configuration, not the binaries.
func (c Config) Validate() error {
	var errs []error
	if c.BinDir == "" {
		errs = append(errs, errors.New("bin dir is required"))
	}
	if _, ok := elfMachines[c.Arch]; !ok {
		errs = append(errs, fmt.Errorf("arch %q: want amd64 or arm64", c.Arch))
	}
	if c.Version == "" {
		errs = append(errs, errors.New("version is required"))
	}
	if c.Created.IsZero() {
		errs = append(errs, errors.New("created time is required (SOURCE_DATE_EPOCH)"))
	}
	return errors.Join(errs...)
}

// Result names what Build wrote.
type Result struct {
	// Manifest is the image manifest's descriptor: its digest is the
	// image's.
	Manifest Descriptor
	// Config is the image configuration's; its digest is the image ID
	// Docker shows.
	Config Descriptor
	// References are the names `docker load` tags the image with:
	// <repository>:<version> and <repository>:latest.
	References []string
}

// Build writes the image archive (see the package documentation) to w.
func Build(cfg Config, w io.Writer) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, fmt.Errorf("image config: %w", err)
	}
	if cfg.Repository == "" {
		cfg.Repository = "ursula"
	}
	created := cfg.Created.UTC()
	base, err := baseLayer()
	if err != nil {
		return Result{}, err
	}
	bins := layer{comment: "the Ursula binaries and their per-role links"}
	for _, b := range Binaries {
		path := filepath.Join(cfg.BinDir, b)
		if err := checkStatic(path, cfg.Arch); err != nil {
			return Result{}, err
		}
		bins.entries = append(bins.entries, entry{name: "usr/local/bin/" + b, mode: 0o755, path: path})
	}
	for _, l := range RoleLinks {
		bins.entries = append(bins.entries, entry{name: "usr/local/bin/" + l, mode: 0o777, link: LinkTarget})
	}
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		bins.entries = append(bins.entries, entry{name: dir, mode: 0o755})
	}
	a := &archive{created: created, layers: []layer{base, bins}, docs: map[string][]byte{}}
	var diffIDs []string
	var history []map[string]any
	for _, l := range a.layers {
		d, err := l.describe(created)
		if err != nil {
			return Result{}, err
		}
		a.descs = append(a.descs, d)
		diffIDs = append(diffIDs, d.Digest)
		history = append(history, map[string]any{"created": created.Format(time.RFC3339), "created_by": "ursula-image: " + l.comment})
	}

	tag := Tag(cfg.Version)
	labels := map[string]string{
		"org.opencontainers.image.title":       "ursula",
		"org.opencontainers.image.description": "Ursula: durable append-only event streams (all binaries; entrypoint ursula)",
		"org.opencontainers.image.version":     cfg.Version,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	if cfg.Revision != "" {
		labels["org.opencontainers.image.revision"] = cfg.Revision
	}
	if cfg.Source != "" {
		labels["org.opencontainers.image.source"] = cfg.Source
	}
	exposed := map[string]struct{}{}
	for _, p := range Ports {
		exposed[strconv.Itoa(p)+"/tcp"] = struct{}{}
	}
	configJSON, configDesc, err := blob(MediaTypeConfig, map[string]any{
		"created":      created.Format(time.RFC3339),
		"architecture": cfg.Arch,
		"os":           "linux",
		"config": map[string]any{
			"User":         fmt.Sprintf("%d:%d", UID, GID),
			"Entrypoint":   []string{Entrypoint},
			"Env":          []string{"PATH=/usr/local/bin"},
			"WorkingDir":   DataDir,
			"ExposedPorts": exposed,
			"Labels":       labels,
			"StopSignal":   "SIGTERM",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": diffIDs},
		"history": history,
	})
	if err != nil {
		return Result{}, err
	}
	manifestJSON, manifestDesc, err := blob(MediaTypeManifest, map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaTypeManifest,
		"config":        configDesc,
		"layers":        a.descs,
		"annotations":   labels,
	})
	if err != nil {
		return Result{}, err
	}
	// Tagged with the version, and as latest (what deploy/compose runs).
	var refs []string
	var manifests []Descriptor
	for _, t := range []string{tag, "latest"} {
		ref := cfg.Repository + ":" + t
		if slices.Contains(refs, ref) {
			continue
		}
		refs = append(refs, ref)
		d := manifestDesc
		d.Annotations = map[string]string{
			"io.containerd.image.name":          fullName(ref),
			"org.opencontainers.image.ref.name": t,
		}
		manifests = append(manifests, d)
	}
	index, _, err := blob(MediaTypeIndex, map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaTypeIndex,
		"manifests":     manifests,
	})
	if err != nil {
		return Result{}, err
	}
	layerPaths := make([]string, len(a.descs))
	for i, d := range a.descs {
		layerPaths[i] = blobPath(d)
	}
	dockerManifest, _, err := blob("", []map[string]any{{
		"Config":   blobPath(configDesc),
		"RepoTags": refs,
		"Layers":   layerPaths,
	}})
	if err != nil {
		return Result{}, err
	}
	a.docs[blobPath(configDesc)] = configJSON
	a.docs[blobPath(manifestDesc)] = manifestJSON
	a.docs["index.json"] = index
	a.docs["manifest.json"] = dockerManifest
	a.docs["oci-layout"] = []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if err := a.writeTo(w); err != nil {
		return Result{}, fmt.Errorf("write image: %w", err)
	}
	return Result{Manifest: manifestDesc, Config: configDesc, References: refs}, nil
}

// fullName is a reference as containerd spells it: a short Docker Hub
// name gets its registry (and library/ for an official one).
func fullName(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	switch {
	case !found:
		return "docker.io/library/" + ref
	case strings.ContainsAny(first, ".:") || first == "localhost":
		return ref
	default:
		return "docker.io/" + ref
	}
}

// tagInvalid matches what a Docker tag may not hold.
var tagInvalid = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// Tag turns a version into a valid image tag: characters a tag may not
// hold become '-', a leading '.' or '-' becomes '_', and it is cut to
// 128 characters.
func Tag(version string) string {
	t := tagInvalid.ReplaceAllString(version, "-")
	if t == "" {
		return "latest"
	}
	if t[0] == '.' || t[0] == '-' {
		t = "_" + t[1:]
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// baseLayer is everything but the binaries.
func baseLayer() (layer, error) {
	certs, err := CABundlePEM()
	if err != nil {
		return layer{}, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", UserName, UID, GID, UserName, DataDir)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", UserName, GID)
	return layer{comment: "users, CA bundle, /data and /tmp", entries: []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		// Go's resolver reads it: files first, then DNS.
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, data: certs},
		{name: "data/", mode: 0o750, uid: UID, gid: GID},
		{name: "tmp/", mode: 0o1777},
	}}, nil
}

// CABundlePEM is the image's CA bundle: the unconstrained roots of
// golang.org/x/crypto/x509roots/fallback/bundle, PEM-encoded in its order.
func CABundlePEM() ([]byte, error) {
	var b strings.Builder
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			// A distrust-after date: a PEM file would trust the root
			// without it.
			continue
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	if b.Len() == 0 {
		return nil, errors.New("CA bundle: no roots in golang.org/x/crypto/x509roots/fallback/bundle")
	}
	return []byte(b.String()), nil
}

// checkStatic refuses a binary that is not a statically linked ELF
// executable for arch: on an image with no libc it would not start.
func checkStatic(path, arch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("binary %s: %w (build it with make image)", path, err)
	}
	defer f.Close()
	if want := elfMachines[arch]; f.Machine != want {
		return fmt.Errorf("binary %s is for %v, want %v (%s)", path, f.Machine, want, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked (build with CGO_ENABLED=0)", path)
		}
	}
	return nil
}
