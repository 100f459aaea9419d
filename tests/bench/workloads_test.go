package main

import (
	"os"
	"testing"
)

// A workload's measured phase starts where it marks it, and a copy of
// the bench (as mixed makes) marks the same start.
func TestMeasuredPhaseMark(t *testing.T) {
	b := &bench{procs: []proc{{name: "self", pid: os.Getpid()}}, measured: &cpuMark{}}
	if b.takeMeasured() != nil {
		t.Fatal("a mark before any workload marked")
	}
	copied := *b
	copied.markMeasured()
	got := b.takeMeasured()
	if len(got) != 1 {
		t.Fatalf("mark %v, want the CPU time of one process", got)
	}
	if b.takeMeasured() != nil {
		t.Fatal("a mark survived being taken")
	}
	(&bench{}).markMeasured() // a bench without a mark (backup's) ignores it
}
