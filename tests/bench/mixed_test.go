package main

import (
	"context"
	"sync"
	"testing"
)

func TestBarrier(t *testing.T) {
	t.Run("every party waits for the others", func(t *testing.T) {
		b := newBarrier(3)
		var wg sync.WaitGroup
		passed := make(chan int, 3)
		for i := range 3 {
			gate, done := b.party(t.Context())
			wg.Go(func() {
				defer done()
				gate()
				passed <- i
			})
		}
		wg.Wait()
		if len(passed) != 3 {
			t.Fatalf("%d of 3 parties passed", len(passed))
		}
	})
	t.Run("a party that gives up before its gate releases the others", func(t *testing.T) {
		b := newBarrier(2)
		gate, done := b.party(t.Context())
		_, quit := b.party(t.Context())
		quit() // set-up failed: arrives without waiting
		gate()
		done()
		done() // arriving twice counts once
		if b.left != 0 {
			t.Errorf("left = %d", b.left)
		}
	})
	t.Run("a cancelled context releases a waiting party", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		b := newBarrier(2)
		gate, _ := b.party(ctx)
		cancel()
		gate() // returns: ctx ended
	})
}

func TestMixedRatios(t *testing.T) {
	lat := func(p99 float64) Latency { return Latency{Count: 10, P99MS: p99} }
	s := &ServerRun{Workloads: map[string]*Result{
		"multi-stream": {Latency: lat(40)},
		"fan-out":      {Latency: lat(10)},
		"mixed": {Parts: map[string]*Result{
			"multi-stream": {Latency: lat(50)},
			"fan-out":      {Latency: lat(30)},
			"replay":       {Latency: lat(20)},
		}},
	}}
	got := mixedRatios(s)
	want := []MixedRatio{
		{Workload: "multi-stream", P99MS: 50, AloneP99MS: 40, Ratio: 1.25},
		{Workload: "fan-out", P99MS: 30, AloneP99MS: 10, Ratio: 3},
		{Workload: "replay", P99MS: 20}, // not run alone: no ratio
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("part %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if mixedRatios(&ServerRun{Workloads: map[string]*Result{}}) != nil {
		t.Error("ratios without a mixed result")
	}
}

func TestNoteNode404(t *testing.T) {
	for _, tc := range []struct {
		name string
		sr   *ServerRun
		want bool
	}{
		{"append 404s", &ServerRun{Name: "node files", Workloads: map[string]*Result{"multi-stream": {Errors: map[string]int{"status_404": 3}}}}, true},
		{"a part of mixed", &ServerRun{Name: "node files", Workloads: map[string]*Result{"mixed": {Parts: map[string]*Result{"replay": {Errors: map[string]int{"status_404": 1}}}}}}, true},
		{"a failed workload", &ServerRun{Name: "node files", Workloads: map[string]*Result{}, Errors: map[string]string{"mixed": "replay: pre-fill x: 404 Not Found"}}, true},
		{"no 404", &ServerRun{Name: "node files", Workloads: map[string]*Result{"multi-stream": {}}}, false},
		{"another server", &ServerRun{Name: "node memory", Workloads: map[string]*Result{"multi-stream": {Errors: map[string]int{"status_404": 3}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &Report{}
			noteNode404(rep, tc.sr)
			if got := rep.Notes["node_files_404"] != ""; got != tc.want {
				t.Errorf("note = %v, want %v", got, tc.want)
			}
		})
	}
}
