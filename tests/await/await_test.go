package await

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	if !Until(time.Minute, func() bool { return calls.Add(1) >= 3 }) {
		t.Fatal("Until reported false for a condition that held")
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("condition evaluated %d times, want 3", n)
	}
}

func TestUntilGivesUpAfterTheTimeout(t *testing.T) {
	if Until(10*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported true for a condition that never held")
	}
}

func TestWithinFailsTheTest(t *testing.T) {
	rec := &recorder{TB: t}
	Within(rec, 5*time.Millisecond, "nothing", func() bool { return false })
	if !rec.failed {
		t.Fatal("Within did not fail the test")
	}
}

// recorder captures Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Fatalf(string, ...any) { r.failed = true }
