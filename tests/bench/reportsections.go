package main

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The report's sections for mixed load, the cluster and the cardinality
// sweep, and the plots they and the CPU and memory section need. Pure
// functions of the Report, like report.go.

// renderMixed writes each server's mixed-load p99 beside its p99 alone.
func renderMixed(b *bytes.Buffer, rep *Report) {
	var rows []string
	for _, s := range rep.Servers {
		for _, mr := range mixedRatios(s) {
			ratio, met := "–", "–"
			if mr.Ratio > 0 {
				ratio = fmt.Sprintf("%.2f", mr.Ratio)
				met = "no"
				if mr.Ratio <= 1.5 {
					met = "yes"
				}
			}
			part := s.Workloads["mixed"].Parts[mr.Workload]
			rows = append(rows, fmt.Sprintf("| %s | %s | %.0f | %s | %.2f | %s | %s | %s |\n", s.Name, mr.Workload, part.OpsPerSec,
				fmtOr(mr.AloneP99MS, "%.2f"), mr.P99MS, ratio, met, errText(part.Errors)))
		}
		if e := s.Errors["mixed"]; e != "" {
			rows = append(rows, fmt.Sprintf("| %s | failed: %s | | | | | | |\n", s.Name, oneLine(e)))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Mixed load\n\n")
	fmt.Fprintf(b, "Multi-stream appends, the fan-out subscribers and the replay clients at once against one server, measured from a common start once all three are set up; ")
	fmt.Fprintf(b, "each p99 beside that of the same workload alone against the same server earlier in the run (target: at most 1.5 ×). ")
	fmt.Fprintf(b, "The appends are closed-loop (one request always in flight per stream), so they take whatever the server can give; fan-out latency runs from the writer's send, so it includes the writer's append.\n\n")
	fmt.Fprintf(b, "| server | workload | ops/s mixed | p99 alone (ms) | p99 mixed (ms) | mixed ÷ alone | ≤ 1.5 × | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r)
	}
}

// renderCluster writes the cluster's figures per process.
func renderCluster(b *bytes.Buffer, rep *Report) {
	s := rep.server(clusterName)
	if s == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## 3-node cluster\n\n")
	p("Three `ursula-node` processes and an `ursula-gateway` on loopback (`%s`), fsync never; every request goes through the gateway. ", strings.ReplaceAll(s.Command, "`", "'"))
	p("Server CPU per operation is split between the nodes (their sum) and the gateway; RSS max is the highest VmRSS of each process during the workload.\n\n")
	procs := clusterProcs(s)
	p("| workload | ops/s | × null | p99 (ms) | CPU per op, all (µs) | nodes (µs) | gateway (µs) |")
	for _, n := range procs {
		p(" RSS %s (MiB) |", n)
	}
	p(" errors |\n|---|---|---|---|---|---|---|%s---|\n", strings.Repeat("---|", len(procs)))
	for _, w := range []string{"multi-stream", "fan-out", "replay", "mixed"} {
		r := s.Workloads[w]
		if r == nil {
			if e := s.Errors[w]; e != "" {
				p("| %s | failed: %s |%s\n", w, oneLine(e), strings.Repeat(" |", 6+len(procs)))
			}
			continue
		}
		ratio := "–"
		if v, ok := rep.ratioToNull(s, w); ok {
			ratio = fmt.Sprintf("%.2f", v)
		}
		nodes, gw := 0.0, 0.0
		for name, u := range r.Processes {
			if name == "gateway" {
				gw = u.CPUPerOpUS
			} else {
				nodes += u.CPUPerOpUS
			}
		}
		ops, p99 := fmt.Sprintf("%.0f", r.OpsPerSec), fmt.Sprintf("%.2f", r.Latency.P99MS)
		if w == "mixed" {
			ops, p99 = "–", "–" // per part in Mixed load
		}
		p("| %s | %s | %s | %s | %s | %s | %s |", w, ops, ratio, p99, fmtOr(r.CPUPerOpUS, "%.1f"), fmtOr(nodes, "%.1f"), fmtOr(gw, "%.1f"))
		for _, n := range procs {
			v := 0.0
			if u := r.Processes[n]; u != nil {
				v = u.RSSMaxMiB
			}
			p(" %s |", fmtOr(v, "%.0f"))
		}
		p(" %s |\n", errText(r.Errors))
	}
	if len(s.RSSPeakPerProcessMiB) > 0 {
		p("\nPeak RSS (VmHWM):")
		for i, n := range procs {
			sep := ","
			if i == 0 {
				sep = ""
			}
			p("%s %s %.0f MiB", sep, n, s.RSSPeakPerProcessMiB[n])
		}
		p("; %.0f MiB in all.\n", s.RSSPeakMiB)
	}
	if len(s.Errors) > 0 {
		p("\nFailures: %s.\n", strings.Join(sortedErrs(s.Errors), "; "))
	}
}

// clusterProcs are the process names of a cluster run, nodes first, then
// the gateway.
func clusterProcs(s *ServerRun) []string {
	seen := map[string]bool{}
	for n := range s.RSSPeakPerProcessMiB {
		seen[n] = true
	}
	for _, r := range s.Workloads {
		for n := range r.Processes {
			seen[n] = true
		}
	}
	var out []string
	for n := range seen {
		if n != "gateway" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	if seen["gateway"] {
		out = append(out, "gateway")
	}
	return out
}

func sortedErrs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+": "+oneLine(v))
	}
	slices.Sort(out)
	return out
}

// renderCardinality writes the sweep's table per server and links its
// plots.
func renderCardinality(b *bytes.Buffer, rep *Report) {
	if len(rep.Cardinality) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Cardinality\n\n")
	p("For each stream count a fresh server; the streams are created with %d PUTs in flight, then %s writers append %s B round-robin over them, one request in flight each, with producer headers, for %s s. ",
		createInFlight, cell(rep.Config["cardinality_writers"]), cell(rep.Config["payload_bytes"]), cell(rep.Config["duration_s"]))
	p("Creating one count's streams may take at most %s s; a count that does not make it is reported as such, and larger ones are not tried against that server. ", cell(rep.Config["cardinality_create_timeout_s"]))
	p("\"× first\" is the throughput over that of the smallest stream count against the same server.\n\n")
	for _, k := range cardinalityPlots {
		p("![%s](%s/bench-cardinality-%s.svg)\n\n", k.title, reportImgDir, k.file)
	}
	for _, run := range rep.Cardinality {
		p("### %s\n\n", run.Server)
		if run.Server == clusterName {
			p("A fresh 3-node cluster per stream count (fsync never), every request through its gateway; CPU is that of the four processes, RSS that of the largest node.\n\n")
		}
		p("| streams | create (s) | creates/s | CPU per create (µs) | appends/s | × first | p50 (ms) | p99 (ms) | CPU per append (µs) | RSS after create (MiB) | peak RSS (MiB) | errors |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, pt := range run.Points {
			if pt.Append == nil {
				p("| %d | %s | %s | %s | %s | | | | | | | |\n", pt.Streams, fmtOr(pt.CreateS, "%.1f"), fmtOr(pt.CreatePerSec, "%.0f"),
					fmtOr(pt.CreateCPUPerStreamUS, "%.1f"), "skipped: "+oneLine(pt.Skipped))
				continue
			}
			a := pt.Append
			errs := errText(a.Errors)
			if pt.Note != "" {
				errs += "; " + oneLine(pt.Note)
			}
			p("| %d | %.1f | %.0f | %s | %.0f | %.2f | %.2f | %.2f | %s | %s | %s | %s |\n", pt.Streams, pt.CreateS, pt.CreatePerSec,
				fmtOr(pt.CreateCPUPerStreamUS, "%.1f"), a.OpsPerSec, pt.RatioToBase, a.Latency.P50MS, a.Latency.P99MS,
				fmtOr(a.CPUPerOpUS, "%.1f"), fmtOr(pt.RSSAfterCreateMiB, "%.0f"), fmtOr(pt.RSSPeakMiB, "%.0f"), errs)
		}
		p("\n")
		for _, pt := range run.Points {
			if pt.StartAfterStopS > 0 {
				p("With %d streams: a graceful stop took %.1f s, a start after it %.1f s to ready, a start after SIGKILL %s s.\n\n",
					pt.Streams, pt.StopS, pt.StartAfterStopS, fmtOr(pt.StartAfterCrashS, "%.1f"))
			}
		}
	}
}

// cardinalityPlot is one figure of the sweep plotted against the stream
// count.
type cardinalityPlot struct {
	file, title, yLabel string
	value               func(*CardinalityPoint) float64
}

var cardinalityPlots = []cardinalityPlot{
	{"throughput", "Appends per second against the number of streams", "appends/s", func(p *CardinalityPoint) float64 { return p.Append.OpsPerSec }},
	{"cpu", "Server CPU per append against the number of streams", "µs of server CPU per append", func(p *CardinalityPoint) float64 { return p.Append.CPUPerOpUS }},
	{"rss", "Peak RSS against the number of streams", "MiB", func(p *CardinalityPoint) float64 { return p.RSSPeakMiB }},
}

// renderCardinalitySVG plots one figure of every server's sweep against
// the stream count (log x axis).
func renderCardinalitySVG(rep *Report, k cardinalityPlot) []byte {
	c := lineChart{title: k.title, xLabel: "streams (log scale)", yLabel: k.yLabel}
	for _, run := range rep.Cardinality {
		var pts []xy
		for _, p := range run.Points {
			if p.Append == nil {
				continue
			}
			if v := k.value(p); v > 0 {
				pts = append(pts, xy{float64(p.Streams), v, fmt.Sprintf("%s, %d streams: %s %s", run.Server, p.Streams, trimFloat(v), k.yLabel)})
			}
		}
		c.series = append(c.series, run.Server)
		c.colors = append(c.colors, rep.color(run.Server))
		c.points = append(c.points, pts)
	}
	return c.render()
}

// renderCPUSVG plots server CPU per operation per server, one bar per
// workload (log scale: appends and deliveries cost tens of µs, reads of
// 200 KiB hundreds).
func renderCPUSVG(rep *Report) []byte {
	ws := reportWorkloads(rep)
	c := barChart{title: "Server CPU per operation", yLabel: "µs per op (log scale)", log: true}
	for i, w := range ws {
		c.series = append(c.series, w)
		c.colors = append(c.colors, palette[(i+1)%len(palette)])
	}
	for _, s := range rep.Servers {
		vals, labels, texts := make([]float64, len(ws)), make([]string, len(ws)), make([]string, len(ws))
		measured := false
		for i, w := range ws {
			vals[i] = math.NaN()
			r := s.Workloads[w]
			if r == nil || r.CPUPerOpUS <= 0 || r.Ops == 0 {
				continue
			}
			vals[i], measured = r.CPUPerOpUS, true
			labels[i] = fmt.Sprintf("%s, %s: %.1f µs of server CPU per op", s.Name, w, r.CPUPerOpUS)
			texts[i] = fmt.Sprintf("%.0f", r.CPUPerOpUS)
		}
		if !measured {
			continue
		}
		c.groups = append(c.groups, s.Name)
		c.value, c.label, c.text = append(c.value, vals), append(c.label, labels), append(c.text, texts)
	}
	return c.render()
}

// renderRSSSVG plots each server's peak RSS (the cluster's summed over its
// processes).
func renderRSSSVG(rep *Report) []byte {
	c := barChart{title: "Peak RSS per server", yLabel: "MiB", series: []string{"peak RSS"}, colors: []string{palette[1]}}
	for _, s := range rep.Servers {
		if s.RSSPeakMiB <= 0 {
			continue
		}
		name := s.Name
		if len(s.RSSPeakPerProcessMiB) > 1 {
			name += fmt.Sprintf(" (%d processes)", len(s.RSSPeakPerProcessMiB))
		}
		c.groups = append(c.groups, name)
		c.value = append(c.value, []float64{s.RSSPeakMiB})
		c.label = append(c.label, []string{fmt.Sprintf("%s: %.0f MiB", name, s.RSSPeakMiB)})
		c.text = append(c.text, []string{fmt.Sprintf("%.0f", s.RSSPeakMiB)})
	}
	return c.render()
}

// xy is a point of a line chart with its tooltip.
type xy struct {
	x, y  float64
	label string
}

// lineChart draws one line per series over a log10 x axis and a linear y
// axis from 0.
type lineChart struct {
	title, xLabel, yLabel string
	series                []string
	colors                []string
	points                [][]xy
}

func (c lineChart) render() []byte {
	const w, h = 760.0, 380.0
	const left, top, bottom = 72.0, 36.0, 52.0
	right := legendWidth(c.series)
	pw, ph := w-left-right, h-top-bottom
	s := newSVG(int(w), int(h))
	s.text(w/2, 20, "middle", c.title, ` font-size="14" font-weight="bold"`)
	xmin, xmax, ymax := math.Inf(1), 0.0, 0.0
	for _, pts := range c.points {
		for _, p := range pts {
			xmin, xmax, ymax = min(xmin, p.x), max(xmax, p.x), max(ymax, p.y)
		}
	}
	lo, hi := 2.0, 6.0 // 100 to 1M when there is nothing to plot
	if !math.IsInf(xmin, 1) {
		lo, hi = math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
		if hi <= lo {
			hi = lo + 1
		}
	}
	ymax = niceMax(ymax)
	px := func(x float64) float64 { return left + pw*(math.Log10(x)-lo)/(hi-lo) }
	py := func(y float64) float64 { return top + ph - ph*y/ymax }
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		s.line(left, py(v), left+pw, py(v), "#e0e0e0")
		s.text(left-6, py(v)+4, "end", trimFloat(v), "")
	}
	for e := lo; e <= hi; e++ {
		x := px(math.Pow(10, e))
		s.line(x, top, x, top+ph, "#e0e0e0")
		s.text(x, top+ph+16, "middle", countLabel(math.Pow(10, e)), "")
	}
	s.line(left, top, left, top+ph, "#000000")
	s.line(left, top+ph, left+pw, top+ph, "#000000")
	s.text(left+pw/2, h-10, "middle", c.xLabel, "")
	s.text(14, top+ph/2, "middle", c.yLabel, fmt.Sprintf(` transform="rotate(-90 14 %.1f)"`, top+ph/2))
	for si, pts := range c.points {
		if len(pts) > 1 {
			var d strings.Builder
			for i, p := range pts {
				cmd := "L"
				if i == 0 {
					cmd = "M"
				}
				fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, px(p.x), py(p.y))
			}
			fmt.Fprintf(&s.b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.TrimSpace(d.String()), c.colors[si])
		}
		for _, p := range pts {
			fmt.Fprintf(&s.b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s</title></circle>`+"\n", px(p.x), py(p.y), c.colors[si], esc(p.label))
		}
	}
	for si, name := range c.series {
		y := top + 16*float64(si)
		s.rect(left+pw+16, y, 10, 10, c.colors[si], name)
		s.text(left+pw+32, y+9, "start", name, "")
	}
	return s.bytes()
}

// countLabel writes a power of ten as 100, 1k, 10k, 1M.
func countLabel(v float64) string {
	switch {
	case v >= 1e6:
		return trimFloat(v/1e6) + "M"
	case v >= 1e3:
		return trimFloat(v/1e3) + "k"
	}
	return trimFloat(v)
}
