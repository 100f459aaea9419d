package await

import (
	"os"
	"testing"
	"time"
)

// DefaultTimeout bounds a wait when the caller names none. It is generous
// on purpose: a wait ends as soon as its condition holds, so a long bound
// costs nothing when things work and keeps a busy machine from failing a
// test that would have passed. URSULA_TEST_WAIT (a Go duration) overrides
// it.
var DefaultTimeout = 60 * time.Second

func init() {
	if v := os.Getenv("URSULA_TEST_WAIT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			DefaultTimeout = d
		}
	}
}

// Poll bounds between two evaluations of a condition: the first retries
// come quickly, later ones back off so a long wait does not spin.
const (
	firstPoll = time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// True polls cond until it returns true and fails tb, naming what, if it
// does not within DefaultTimeout.
func True(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Within(tb, DefaultTimeout, what, cond)
}

// Within is True with its own bound.
func Within(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Until(timeout, cond) {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Until polls cond until it returns true or timeout passes, and reports
// whether it held.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := firstPoll
	for !cond() {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPoll)
	}
	return true
}
