package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// fixedReport is testdata/report.json, the fixed run the report tests
// render.
func fixedReport(t *testing.T) Report {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestReportGolden renders testdata/report.json (a fixed run) and compares
// the Markdown report and every plot with testdata/*.golden.*.
func TestReportGolden(t *testing.T) {
	rep := fixedReport(t)
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
	rep := fixedReport(t)
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

func loadFixture(t *testing.T) *Report {
	t.Helper()
	rep := fixedReport(t)
	return &rep
}

// TestThroughputFanOut: the null server has no fan-out figure, so fan-out
// is plotted against the fastest server rather than left empty.
func TestThroughputFanOut(t *testing.T) {
	rep := loadFixture(t)
	svg := string(renderThroughputSVG(rep))
	if !strings.Contains(svg, ">fan-out (÷ fastest)</text>") {
		t.Fatal("no fan-out group labelled as a ratio to the fastest server")
	}
	for _, s := range rep.Servers {
		r := s.Workloads["fan-out"]
		if r == nil || r.OpsPerSec == 0 {
			continue
		}
		if !strings.Contains(svg, "<title>"+esc(s.Name)+", fan-out:") {
			t.Errorf("no fan-out bar for %s", s.Name)
		}
	}
}

// TestLegendFits: the legend's longest entry ends inside the plot's width.
func TestLegendFits(t *testing.T) {
	names := []string{"null", "ursula fsync=never cold=s3", "a much longer server name than any of those"}
	c := barChart{title: "t", groups: []string{"g"}, series: names, colors: palette[:3],
		value: [][]float64{{1, 2, 3}}, label: [][]string{{"", "", ""}}}
	svg := string(c.render())
	var width int
	if _, err := fmt.Sscanf(svg[strings.Index(svg, `width="`):], `width="%d"`, &width); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		i := strings.Index(svg, `">`+n+`</text>`)
		if i < 0 {
			t.Fatalf("legend entry %q missing", n)
		}
		var x float64
		j := strings.LastIndex(svg[:i], `<text x="`)
		if _, err := fmt.Sscanf(svg[j:], `<text x="%f"`, &x); err != nil {
			t.Fatal(err)
		}
		// About 7 px per character of the 12 px sans-serif font.
		if end := x + 7*float64(len(n)); end > float64(width) {
			t.Errorf("legend entry %q ends at %.0f px, beyond the width %d", n, end, width)
		}
	}
}

func TestChangedFlags(t *testing.T) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.String("server", "", "")
	fs.String("report", "", "")
	fs.Duration("duration", 10*time.Second, "")
	fs.String("workloads", defaultWorkloads, "")
	fs.Bool("cluster", true, "")
	if err := fs.Parse([]string{"-server", "bin/ursula", "-report", "x.md", "-cluster=true", "-duration", "2s"}); err != nil {
		t.Fatal(err)
	}
	// -cluster=true is its default; -server and -report say where.
	if got, want := changedFlags(fs), "-duration=2s"; got != want {
		t.Errorf("changedFlags = %q, want %q", got, want)
	}
}
