package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// journal records the order in which roles stop.
type journal struct {
	mu      sync.Mutex
	stopped []string
}

func (j *journal) add(name string) {
	j.mu.Lock()
	j.stopped = append(j.stopped, name)
	j.mu.Unlock()
}

// waiting is a role that runs until it is stopped.
func waiting(name string, j *journal) Role {
	return Role{Name: name, Run: func(ctx context.Context) error {
		<-ctx.Done()
		j.add(name)
		return nil
	}}
}

func TestCleanStopIsInReverseOrder(t *testing.T) {
	var j journal
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, slog.New(slog.DiscardHandler), waiting("storage", &j), waiting("node", &j), waiting("gateway", &j))
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after a clean stop", err)
	}
	if want := []string{"gateway", "node", "storage"}; !slices.Equal(j.stopped, want) {
		t.Fatalf("stop order %v, want %v", j.stopped, want)
	}
}

func TestFirstFailureStopsEveryRole(t *testing.T) {
	tests := []struct {
		name  string
		role  Role
		cause error
	}{
		{"an error", Role{Name: "node", Run: func(context.Context) error { return errors.New("listen tcp :4437: address already in use") }}, nil},
		{"returning early", Role{Name: "node", Run: func(context.Context) error { return nil }}, ErrStoppedOnItsOwn},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			err := Run(t.Context(), slog.New(slog.DiscardHandler), waiting("storage", &j), tc.role, waiting("gateway", &j))
			if err == nil || !strings.HasPrefix(err.Error(), "node: ") {
				t.Fatalf("Run = %v, want the node's failure", err)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Fatalf("Run = %v, want %v", err, tc.cause)
			}
			if want := []string{"gateway", "storage"}; !slices.Equal(j.stopped, want) {
				t.Fatalf("stop order %v, want %v", j.stopped, want)
			}
		})
	}
}

func TestFailureWhileStopping(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := Run(ctx, slog.New(slog.DiscardHandler), Role{Name: "storage", Run: func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("sync journal: input/output error")
	}})
	if err == nil || !strings.Contains(err.Error(), "storage: sync journal") {
		t.Fatalf("Run = %v, want the stop failure", err)
	}
}
