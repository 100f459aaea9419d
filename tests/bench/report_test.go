package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// TestReportGolden renders testdata/report.json (a fixed run) and compares
// the Markdown report and every plot with testdata/*.golden.*.
func TestReportGolden(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	files := reportFiles(&rep)
	files["report.md"] = renderMarkdown(&rep)
	for name, got := range files {
		t.Run(name, func(t *testing.T) {
			ext := filepath.Ext(name)
			golden := filepath.Join("testdata", strings.TrimSuffix(name, ext)+".golden"+ext)
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./tests/bench -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from %s (go test ./tests/bench -update rewrites it):\n%s", name, golden, got)
			}
		})
	}
}

// TestWriteReport writes the report and its plots where the Markdown
// links them.
func TestWriteReport(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	md := filepath.Join(dir, "benchmarks.md")
	if err := writeReport(&rep, md); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for name := range reportFiles(&rep) {
		if !bytes.Contains(text, []byte("("+reportImgDir+"/"+name+")")) {
			t.Errorf("report does not link %s", name)
		}
		if _, err := os.Stat(filepath.Join(dir, reportImgDir, name)); err != nil {
			t.Errorf("plot not written: %v", err)
		}
	}
}

func TestNiceMax(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0, 1}, {0.7, 1}, {1, 1}, {1.2, 2}, {3, 5}, {42, 50}, {47041, 50000}, {51000, 100000}} {
		if got := niceMax(tc.in); got != tc.want {
			t.Errorf("niceMax(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestProcCPU(t *testing.T) {
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if _, err := procCPU(0); err == nil {
		t.Error("procCPU(0) gave no error")
	}
}
