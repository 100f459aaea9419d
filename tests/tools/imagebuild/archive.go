package imagebuild

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Media types of the OCI image specification.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// entry is one file, directory or symbolic link of a layer.
type entry struct {
	// name is the path without a leading slash; a directory's ends in
	// a slash.
	name     string
	mode     int64
	uid, gid int
	// data is a regular file's content; path, when set, names a file on
	// the build machine to copy instead.
	data []byte
	path string
	// link, when set, makes the entry a symbolic link to it (relative to
	// the link's directory).
	link string
}

// layer is a filesystem change set, written as a tar by write.
type layer struct {
	entries []entry
	// comment says what the layer holds (the image history).
	comment string
}

// write writes the layer's tar: entries in name order, each with the
// time created.
func (l layer) write(w io.Writer, created time.Time) error {
	entries := slices.Clone(l.entries)
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	tw := tar.NewWriter(w)
	for i, e := range entries {
		if i > 0 && entries[i-1].name == e.name {
			return fmt.Errorf("layer %q: %s twice", l.comment, e.name)
		}
		hdr := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if strings.HasSuffix(e.name, "/") {
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if e.link != "" {
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("layer %q: %s: %w", l.comment, e.name, err)
			}
			continue
		}
		hdr.Typeflag = tar.TypeReg
		if err := writeFile(tw, hdr, e); err != nil {
			return fmt.Errorf("layer %q: %s: %w", l.comment, e.name, err)
		}
	}
	return tw.Close()
}

// writeFile writes a regular file's header and content.
func writeFile(tw *tar.Writer, hdr *tar.Header, e entry) error {
	if e.path == "" {
		hdr.Size = int64(len(e.data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if n, err := io.Copy(tw, f); err != nil {
		return err
	} else if n != hdr.Size {
		return fmt.Errorf("%s changed while it was read", e.path)
	}
	return nil
}

// Descriptor names a blob, as the OCI specification's descriptors do.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// countingHash digests what is written to it.
type countingHash struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) digest() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// describe digests a layer by writing it once into a hash.
func (l layer) describe(created time.Time) (Descriptor, error) {
	c := &countingHash{h: sha256.New()}
	if err := l.write(c, created); err != nil {
		return Descriptor{}, err
	}
	return Descriptor{MediaType: MediaTypeLayer, Digest: c.digest(), Size: c.n}, nil
}

// blob is a JSON document of the archive.
func blob(mediaType string, v any) ([]byte, Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, Descriptor{}, err
	}
	sum := sha256.Sum256(b)
	return b, Descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}, nil
}

// blobPath is where a blob lives in the archive.
func blobPath(d Descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }

// archive is an image as written: its layers and JSON documents.
type archive struct {
	created time.Time
	layers  []layer
	descs   []Descriptor
	// docs maps archive paths to JSON documents (config, manifest,
	// index.json, manifest.json, oci-layout).
	docs map[string][]byte
}

// writeTo writes the archive as one tar, entries in name order.
func (a *archive) writeTo(w io.Writer) error {
	type item struct {
		name  string
		layer int // index into layers, or -1 for a document
	}
	items := []item{{"blobs/", -1}, {"blobs/sha256/", -1}}
	seen := map[string]bool{}
	for name := range a.docs {
		items = append(items, item{name, -1})
		seen[name] = true
	}
	for i, d := range a.descs {
		if p := blobPath(d); !seen[p] {
			items = append(items, item{p, i})
			seen[p] = true
		}
	}
	slices.SortFunc(items, func(x, y item) int { return strings.Compare(x.name, y.name) })
	tw := tar.NewWriter(w)
	for _, it := range items {
		hdr := &tar.Header{Name: it.name, Mode: 0o644, ModTime: a.created, Format: tar.FormatPAX, Typeflag: tar.TypeReg}
		switch {
		case strings.HasSuffix(it.name, "/"):
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case it.layer >= 0:
			hdr.Size = a.descs[it.layer].Size
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			c := &countingHash{h: sha256.New()}
			if err := a.layers[it.layer].write(io.MultiWriter(tw, c), a.created); err != nil {
				return err
			}
			if c.digest() != a.descs[it.layer].Digest {
				return fmt.Errorf("layer %q changed while the image was written (an input file changed?)", a.layers[it.layer].comment)
			}
		default:
			b := a.docs[it.name]
			hdr.Size = int64(len(b))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(b); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}
