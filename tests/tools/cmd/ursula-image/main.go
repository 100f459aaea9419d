// Command ursula-image writes Ursula's container image archive (package
// tests/tools/imagebuild) from statically linked binaries: `make image`
// runs it. It needs no container engine and no network.
//
//	ursula-image -bin-dir bin/image/linux-amd64 -arch amd64 -version v1.2.0 \
//	  -revision <commit> -source <url> -out bin/ursula-image.tar
//
// -created defaults to $SOURCE_DATE_EPOCH. It prints the archive, the
// image's references and its manifest digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ursula/ursula/tests/tools/imagebuild"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ursula-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ursula-image", flag.ContinueOnError)
	var (
		cfg     imagebuild.Config
		out     string
		created string
	)
	fs.StringVar(&cfg.BinDir, "bin-dir", "", "directory of the statically linked binaries")
	fs.StringVar(&cfg.Arch, "arch", "amd64", "GOARCH of the binaries: amd64 or arm64")
	fs.StringVar(&cfg.Version, "version", "", "release version (label and tag)")
	fs.StringVar(&cfg.Revision, "revision", "", "VCS commit (label)")
	fs.StringVar(&cfg.Source, "source", "", "source repository URL (label)")
	fs.StringVar(&cfg.Repository, "repository", "ursula", "image name docker load tags")
	fs.StringVar(&created, "created", os.Getenv("SOURCE_DATE_EPOCH"), "image and file time, Unix seconds (default $SOURCE_DATE_EPOCH)")
	fs.StringVar(&out, "out", "", "archive to write (OCI layout and docker load format in one tar)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	secs, err := strconv.ParseInt(created, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-created %q: want Unix seconds (set SOURCE_DATE_EPOCH)", created)
	}
	cfg.Created = time.Unix(secs, 0)
	if err := cfg.Validate(); err != nil {
		return err
	}
	// Written beside the target and renamed: a failed build leaves no
	// half archive behind.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".ursula-image-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	res, err := imagebuild.Build(cfg, tmp)
	if err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, strings.Join(res.References, " "), res.Manifest.Digest)
	return nil
}
