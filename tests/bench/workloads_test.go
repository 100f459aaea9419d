package main

import (
	"os"
	"testing"
)

// A workload's measured phase starts where it marks it and ends where it
// ends it, if it does, and a copy of the bench (as mixed makes) marks the
// same phase.
func TestMeasuredPhaseMark(t *testing.T) {
	b := &bench{procs: []proc{{name: "self", pid: os.Getpid()}}, measured: &cpuMark{}}
	if from, to := b.takeMeasured(); from != nil || to != nil {
		t.Fatal("a mark before any workload marked")
	}
	copied := *b
	copied.markMeasured()
	from, to := b.takeMeasured()
	if len(from) != 1 || to != nil {
		t.Fatalf("marks %v, %v: want the CPU time of one process, and no end", from, to)
	}
	if from, to := b.takeMeasured(); from != nil || to != nil {
		t.Fatal("a mark survived being taken")
	}

	copied.markMeasured()
	copied.endMeasured()
	from2, to2 := b.takeMeasured()
	if len(from2) != 1 || len(to2) != 1 || to2[0] < from2[0] {
		t.Fatalf("marks %v, %v: want a start and an end no earlier of one process", from2, to2)
	}
	copied.markMeasured() // a new start forgets an earlier end
	copied.endMeasured()
	copied.markMeasured()
	if _, to := b.takeMeasured(); to != nil {
		t.Fatalf("an end %v survived a later start", to)
	}

	(&bench{}).markMeasured() // a bench without a mark (backup's) ignores it
	(&bench{}).endMeasured()
}
