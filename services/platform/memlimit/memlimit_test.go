package memlimit

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ursula/ursula/tests/await"
)

func TestLimit(t *testing.T) {
	tests := []struct {
		name                        string
		live, scan, other, headroom int64
		want                        int64
	}{
		{"live within headroom: GOGC alone", 60 << 20, 10 << 20, 20 << 20, 64 << 20, math.MaxInt64},
		{"live past headroom, mostly buffers", 100 << 20, 10 << 20, 20 << 20, 64 << 20, 184 << 20},
		{"live past headroom, some pointers: room as large as the scanned heap", 170 << 20, 120 << 20, 20 << 20, 64 << 20, (190 + 120) << 20},
		{"live past headroom, mostly pointers: room capped", 400 << 20, 300 << 20, 20 << 20, 64 << 20, (420 + 256) << 20},
		{"live past headroom, mostly pointers: a quarter of the scanned heap", 1200 << 20, 1100 << 20, 20 << 20, 64 << 20, (1220 + 275) << 20},
		{"inconsistent reading", 100 << 20, 0, -1, 64 << 20, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Limit(tt.live, tt.scan, tt.other, tt.headroom); got != tt.want {
				t.Fatalf("Limit = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestRunSetsAndLifts: with a live heap past the headroom, Run sets a limit
// after a collection and lifts it when it returns.
func TestRunSetsAndLifts(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	l, err := New(Config{Headroom: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	keep := make([]byte, 8<<20) // a live heap past the headroom
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	await.True(t, "a memory limit set after a collection", func() bool {
		if debug.SetMemoryLimit(-1) != math.MaxInt64 {
			return true
		}
		runtime.GC()
		return false
	})
	runtime.KeepAlive(keep)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit %d left after Run", got)
	}
}

func TestValidate(t *testing.T) {
	if _, err := New(Config{Headroom: -1}, nil); err == nil {
		t.Fatal("negative headroom accepted")
	}
}

// Past the abort cap, Run logs why and aborts, with or without the limit
// to keep; at or under it, or without a cap, nothing aborts.
func TestAbortCap(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	for _, cfg := range []Config{{AbortCap: 1 << 10}, {Headroom: DefaultHeadroom, AbortCap: 1 << 10}} {
		var log strings.Builder
		l, err := New(cfg, slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil {
			t.Fatal(err)
		}
		aborted := make(chan struct{})
		l.abort = func() { close(aborted) }
		done := make(chan error, 1)
		go func() { done <- l.Run(t.Context()) }()
		<-aborted
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log.String(), "runtime.node_memory_abort_cap_size") {
			t.Fatalf("%+v: no log line naming the setting: %q", cfg, log.String())
		}
	}

	for _, tt := range []struct {
		cap, used int64
		want      bool
	}{
		{0, 1 << 40, false},
		{100, 99, false},
		{100, 100, false},
		{100, 101, true},
	} {
		l, _ := New(Config{AbortCap: tt.cap}, nil)
		aborted := false
		l.abort = func() { aborted = true }
		if got := l.overCap(tt.used); got != tt.want || aborted != tt.want {
			t.Errorf("cap %d, used %d: over %v, aborted %v, want %v", tt.cap, tt.used, got, aborted, tt.want)
		}
	}
	if _, err := New(Config{AbortCap: -1}, nil); err == nil {
		t.Fatal("a negative cap accepted")
	}
}
