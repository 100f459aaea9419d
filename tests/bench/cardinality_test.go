package main

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestParseCounts(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []int
		err      bool
	}{
		{name: "default", in: "500,10000,100000,1000000", want: []int{500, 10_000, 100_000, 1_000_000}},
		{name: "suffixes", in: "1m, 10k,500", want: []int{500, 10_000, 1_000_000}},
		{name: "sorted and deduplicated", in: "2000,500,2000", want: []int{500, 2000}},
		{name: "underscores", in: "1_000_000", want: []int{1_000_000}},
		{name: "empty", in: "", want: nil},
		{name: "zero", in: "0", err: true},
		{name: "negative", in: "-5", err: true},
		{name: "word", in: "many", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCounts(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("parseCounts(%q) error = %v, want error %v", tc.in, err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("parseCounts(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestWriterStreams(t *testing.T) {
	for _, tc := range []struct {
		name       string
		w, writers int
		n          int
		want       []int
	}{
		{name: "one stream each", w: 3, writers: 500, n: 500, want: []int{3}},
		{name: "round robin", w: 1, writers: 4, n: 10, want: []int{1, 5, 9}},
		{name: "last writer", w: 3, writers: 4, n: 10, want: []int{3, 7}},
		{name: "fewer streams than writers", w: 7, writers: 10, n: 5, want: []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := writerStreams(tc.w, tc.writers, tc.n); !slices.Equal(got, tc.want) {
				t.Errorf("writerStreams(%d, %d, %d) = %v, want %v", tc.w, tc.writers, tc.n, got, tc.want)
			}
		})
	}
	// Every stream has exactly one writer when there are at least as
	// many streams as writers.
	seen := make([]int, 1003)
	for w := range 10 {
		for _, i := range writerStreams(w, 10, len(seen)) {
			seen[i]++
		}
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("stream %d has %d writers", i, n)
		}
	}
}

func measured(n int, ops float64) *CardinalityPoint {
	return &CardinalityPoint{Streams: n, Created: int64(n), Append: &Result{OpsPerSec: ops}}
}

func TestRunSweep(t *testing.T) {
	t.Run("all measured", func(t *testing.T) {
		ops := map[int]float64{500: 10_000, 10_000: 9_000, 1_000_000: 4_000}
		var tried []int
		pts := runSweep(t.Context(), []int{500, 10_000, 1_000_000}, func(_ context.Context, n int) *CardinalityPoint {
			tried = append(tried, n)
			return measured(n, ops[n])
		})
		if !slices.Equal(tried, []int{500, 10_000, 1_000_000}) {
			t.Errorf("tried %v", tried)
		}
		var ratios []float64
		for _, p := range pts {
			ratios = append(ratios, p.RatioToBase)
		}
		if want := []float64{1, 0.9, 0.4}; !slices.Equal(ratios, want) {
			t.Errorf("ratios %v, want %v", ratios, want)
		}
	})
	t.Run("a point that cannot be measured stops the sweep", func(t *testing.T) {
		var tried []int
		pts := runSweep(t.Context(), []int{500, 100_000, 1_000_000}, func(_ context.Context, n int) *CardinalityPoint {
			tried = append(tried, n)
			if n == 100_000 {
				return &CardinalityPoint{Streams: n, Created: 60_000, Skipped: "creating did not finish"}
			}
			return measured(n, 10_000)
		})
		if !slices.Equal(tried, []int{500, 100_000}) {
			t.Errorf("tried %v, want 500 and 100000 only", tried)
		}
		if len(pts) != 3 || pts[2].Streams != 1_000_000 || pts[2].Skipped == "" || pts[2].Append != nil {
			t.Fatalf("the last point is not marked as not tried: %+v", pts[len(pts)-1])
		}
		if pts[0].RatioToBase != 1 || pts[1].RatioToBase != 0 {
			t.Errorf("ratios %v, %v", pts[0].RatioToBase, pts[1].RatioToBase)
		}
	})
	t.Run("the base is the smallest measured count", func(t *testing.T) {
		pts := runSweep(t.Context(), []int{500, 2000}, func(_ context.Context, n int) *CardinalityPoint {
			if n == 500 {
				return &CardinalityPoint{Streams: n, Skipped: "server did not start"}
			}
			return measured(n, 5000)
		})
		// 500 could not be measured, so 2000 was not tried: no ratios.
		if pts[1].Append != nil || pts[1].RatioToBase != 0 {
			t.Errorf("2000 after a failed 500: %+v", pts[1])
		}
		ps := []*CardinalityPoint{{Streams: 500, Skipped: "x"}, measured(2000, 5000), measured(8000, 2500)}
		fillRatios(ps)
		if ps[1].RatioToBase != 1 || ps[2].RatioToBase != 0.5 {
			t.Errorf("ratios %v, %v, want 1 and 0.5", ps[1].RatioToBase, ps[2].RatioToBase)
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		pts := runSweep(ctx, []int{500, 2000}, func(context.Context, int) *CardinalityPoint {
			t.Fatal("measured after the context ended")
			return nil
		})
		if len(pts) != 2 || pts[0].Skipped == "" || pts[1].Skipped == "" {
			t.Errorf("points %+v", pts)
		}
	})
}

func TestEvaluateCardinality(t *testing.T) {
	rep := &Report{Cardinality: []*CardinalityRun{{
		Server: "ursula fsync=never",
		Points: []*CardinalityPoint{measured(500, 10_000), measured(1_000_000, 8_500)},
	}}}
	rep.Cardinality[0].Points[1].RSSPeakMiB = 1400
	evaluate(rep, config{streams: 500, subscribers: 1000, replayCl: 100})
	got := map[string]Target{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg
	}
	if tg := got["1,000,000 streams, fsync never: append ops/s vs 500 streams"]; !tg.OK || tg.Got != 0.85 {
		t.Errorf("throughput target %+v", tg)
	}
	if tg := got["1,000,000 streams, fsync never: peak RSS (MiB)"]; !tg.OK {
		t.Errorf("RSS target %+v", tg)
	}
	if tg := got["1,000,000 streams, fsync never: start after SIGKILL (s)"]; tg.OK || tg.Name == "" {
		t.Errorf("start target without a start figure: %+v", tg)
	}
	if tg := got["1,000,000 streams on the 3-node cluster"]; !tg.NotMeasured {
		t.Errorf("cluster target %+v", tg)
	}

	rep.Cardinality[0].Points[1] = &CardinalityPoint{Streams: 1_000_000, Skipped: "did not finish"}
	rep.Targets = nil
	evaluate(rep, config{streams: 500, subscribers: 1000, replayCl: 100})
	for _, tg := range rep.Targets {
		if tg.Name == "1,000,000 streams, fsync never: measured" {
			if tg.OK || tg.Got != "did not finish" {
				t.Errorf("skipped 1M point: %+v", tg)
			}
			return
		}
	}
	t.Error("a skipped 1M point gives no target")
}

// With a cluster sweep the cluster's million streams are held to the
// single node's bounds and to no error; without one they stay "not
// measured".
func TestEvaluateClusterCardinality(t *testing.T) {
	top := measured(1_000_000, 3_000)
	top.RSSPeakMiB = 1600
	top.Append.Errors = map[string]int{"status_503": 2}
	rep := &Report{Cardinality: []*CardinalityRun{{
		Server: clusterName,
		Points: []*CardinalityPoint{measured(500, 5_000), top},
	}}}
	evaluate(rep, config{streams: 500, subscribers: 1000, replayCl: 100})
	got := map[string]Target{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg
	}
	if _, ok := got["1,000,000 streams on the 3-node cluster"]; ok {
		t.Error("the cluster target is still listed as not measured")
	}
	for name, want := range map[string]any{
		"1,000,000 streams, 3-node cluster: append ops/s vs 500 streams":   0.6,
		"1,000,000 streams, 3-node cluster: largest node's peak RSS (MiB)": 1600.0,
		"1,000,000 streams, 3-node cluster: 503s and other errors":         2,
	} {
		if tg := got[name]; tg.OK || tg.Got != want {
			t.Errorf("%s: %+v, want missed with %v", name, tg, want)
		}
	}

	top.RSSPeakMiB, top.Append.Errors, top.Append.OpsPerSec = 1200, nil, 4_500
	rep.Targets = nil
	evaluate(rep, config{streams: 500, subscribers: 1000, replayCl: 100})
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "1,000,000 streams, 3-node cluster") && !tg.OK {
			t.Errorf("%s missed: %+v", tg.Name, tg)
		}
	}
}
