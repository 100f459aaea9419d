package backup

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenLocation(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_REGION", "us-east-1")
	for _, tc := range []struct {
		spec, want, err string
	}{
		{spec: filepath.Join(dir, "a"), want: filepath.Join(dir, "a")},
		{spec: "file://" + filepath.Join(dir, "b"), want: filepath.Join(dir, "b")},
		{spec: "s3://bucket/some/prefix/", want: "s3://bucket/some/prefix"},
		{spec: "s3://bucket", want: "s3://bucket"},
		{spec: "", err: "empty location"},
		{spec: "s3:///prefix", err: "names no bucket"},
		{spec: "file://host/dir", err: "names host"},
		{spec: "file://relative", err: "names host"},
		{spec: "gs://bucket/x", err: "unsupported scheme"},
		{spec: "https://example.com/x", err: "unsupported scheme"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			l, err := OpenLocation(t.Context(), tc.spec)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.String() != tc.want {
				t.Fatalf("String() %q, want %q", l.String(), tc.want)
			}
		})
	}
}

func TestParseDepth(t *testing.T) {
	for i, name := range []string{"manifest", "objects", "deep"} {
		d, err := ParseDepth(name)
		if err != nil || d != Depth(i) || d.String() != name {
			t.Fatalf("%s: %v %v", name, d, err)
		}
	}
	if _, err := ParseDepth("shallow"); err == nil {
		t.Fatal("parsed shallow")
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"20260725T120000Z": true, "nightly-1.2_x": true,
		"": false, ".hidden": false, "a/b": false, "a b": false, strings.Repeat("x", 129): false,
	} {
		if err := validID(id); (err == nil) != ok {
			t.Errorf("validID(%q): %v", id, err)
		}
	}
}
