package chaos

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// op builds one operation for the model tests.
func op(client int, in Input, call int64, out Output, ret int64) porcupine.Operation {
	if in.Kind == Append && out.Outcome == Unknown {
		ret = math.MaxInt64 / 2
	}
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func app(rec string) Input     { return Input{Kind: Append, Record: rec} }
func rd(from uint64) Input     { return Input{Kind: Read, From: from} }
func acked(end uint64) Output  { return Output{Outcome: Acked, End: end} }
func outcome(o Outcome) Output { return Output{Outcome: o} }
func got(end uint64, data string, upToDate bool) Output {
	return ReadOutput(end, []byte(data), upToDate)
}

// TestModel checks the checker on small histories: the ones a correct
// server can produce pass, and lost, duplicated, reordered or stale
// results are caught.
func TestModel(t *testing.T) {
	tests := []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"sequential appends and a read", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(1, rd(0), 4, got(5, "a\nbb\n", true), 5),
		}, true},
		{"concurrent appends in either order", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(5), 10),
			op(1, app("bb\n"), 0, acked(3), 10),
			op(2, rd(0), 11, got(5, "bb\na\n", true), 12),
		}, true},
		{"acknowledged offset that is not the end of the log", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(3), 3),
		}, false},
		{"acknowledged append lost: an up-to-date read misses it", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(1, rd(0), 4, got(2, "a\n", true), 5),
		}, false},
		{"stale read: up to date but behind an append that finished before it", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(1, rd(0), 2, got(0, "", true), 3),
		}, false},
		{"read concurrent with an append may miss it", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 10),
			op(1, rd(0), 1, got(0, "", true), 3),
		}, true},
		{"a page that is not up to date may end before the tail", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(1, rd(0), 4, got(2, "a\n", false), 5),
			op(1, rd(2), 6, got(5, "bb\n", true), 7),
		}, true},
		{"a read from an offset returns what lies there", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(1, rd(2), 4, got(5, "a\n\n", true), 5),
		}, false},
		{"a read may not end inside a record", []porcupine.Operation{
			op(0, app("abc\n"), 0, acked(4), 1),
			op(1, rd(0), 2, got(2, "ab", false), 3),
		}, false},
		{"a read may not start inside a record", []porcupine.Operation{
			op(0, app("abc\n"), 0, acked(4), 1),
			op(1, rd(2), 2, got(4, "c\n", true), 3),
		}, false},
		{"a read from the middle returns the right bytes", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(0, app("ccc\n"), 4, acked(9), 5),
			op(1, rd(2), 6, got(9, "bb\nccc\n", true), 7),
			op(1, rd(2), 8, got(5, "bb\n", false), 9),
		}, true},
		{"a read with the right length but other bytes", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(0, app("bb\n"), 2, acked(5), 3),
			op(1, rd(2), 6, got(5, "bc\n", true), 7),
		}, false},
		{"unknown append that was applied", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Unknown), 0),
			op(1, app("bb\n"), 5, acked(5), 6),
			op(2, rd(0), 7, got(5, "a\nbb\n", true), 8),
		}, true},
		{"unknown append that was not applied", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Unknown), 0),
			op(1, app("bb\n"), 5, acked(3), 6),
			op(2, rd(0), 7, got(3, "bb\n", true), 8),
		}, true},
		{"unknown append applied twice", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Unknown), 0),
			op(2, rd(0), 7, got(4, "a\na\n", true), 8),
		}, false},
		{"acknowledged append duplicated", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 1),
			op(2, rd(0), 7, got(4, "a\na\n", true), 8),
		}, false},
		{"duplicate answer: the record is there", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Duplicate), 4),
			op(2, rd(0), 5, got(2, "a\n", true), 6),
		}, true},
		{"duplicate answer but the record is missing", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Duplicate), 4),
			op(2, rd(0), 5, got(0, "", true), 6),
		}, false},
		{"refused append never appears", []porcupine.Operation{
			op(0, app("a\n"), 0, outcome(Refused), 4),
			op(2, rd(0), 5, got(2, "a\n", true), 6),
		}, false},
		{"reads go back in time", []porcupine.Operation{
			op(0, app("a\n"), 0, acked(2), 10),
			op(1, rd(0), 1, got(2, "a\n", true), 3),
			op(1, rd(0), 4, got(0, "", true), 5),
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if ok := porcupine.CheckOperations(Model(), tc.ops); ok != tc.want {
				t.Fatalf("linearizable = %v, want %v", ok, tc.want)
			}
		})
	}
}

// TestHistoryCheck runs a recorded history through History.Check and
// writes the visualization of an illegal one.
func TestHistoryCheck(t *testing.T) {
	h := NewHistory()
	h.Add("s", 0, app("a\n"), 0, acked(2), 1)
	h.Add("s", 1, app("b\n"), 0, outcome(Unknown), 0)
	h.Add("s", 2, rd(0), 2, got(4, "a\nb\n", true), 3)
	if res, err := h.Check("s", 0, ""); res != porcupine.Ok || err != nil {
		t.Fatalf("legal history: %v, %v", res, err)
	}
	h.Add("s", 2, rd(0), 4, got(2, "a\n", true), 5)
	vis := t.TempDir() + "/s.html"
	if res, err := h.Check("s", 0, vis); res != porcupine.Illegal || err != nil {
		t.Fatalf("history with a lost append: %v, %v", res, err)
	}
	if c := h.Counts("s"); c[Acked] != 1 || c[Unknown] != 1 || c[Returned] != 2 {
		t.Fatalf("counts %v", c)
	}
}
