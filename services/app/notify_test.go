package app

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/services/platform/sdnotify"
)

// notifySocket listens as a service manager would and passes on every
// message it receives, until the test ends.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			select {
			case msgs <- string(buf[:n]):
			default: // a test that stopped reading: drop
			}
		}
	}()
	t.Cleanup(func() { _ = conn.Close(); <-done })
	return name, msgs
}

// await returns the first message holding want, skipping others (watchdog
// pings); the test's deadline bounds the wait.
func await(t *testing.T, msgs <-chan string, want string) string {
	t.Helper()
	for m := range msgs {
		if strings.Contains(m, want) {
			return m
		}
	}
	t.Fatalf("no message with %q", want)
	return ""
}

func TestServiceManagerHearsReadyWatchdogAndStopping(t *testing.T) {
	tests := []struct {
		name   string
		target string
		args   []string
	}{
		{"all", TargetAll, []string{"-node.listen", "127.0.0.1:0", "-gateway.listen", "127.0.0.1:0"}},
		{"node", TargetNode, []string{"-node.listen", "127.0.0.1:0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			socket, msgs := notifySocket(t)
			args := append([]string{"-data-dir", t.TempDir(), "-admin.listen", ""}, tc.args...)
			cfg, _, err := Load(args, tc.target)
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			sd, err := sdnotify.New(socket)
			if err != nil {
				t.Fatal(err)
			}
			logger := slog.New(slog.DiscardHandler)
			sm := &serviceManager{sd: sd, watchdog: 20 * time.Millisecond, logger: logger}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			errc := make(chan error, 1)
			stopWatchdog := sm.startWatchdog()
			defer stopWatchdog()
			go func() { errc <- Run(ctx, cfg, logger, sm) }()

			await(t, msgs, "STATUS=recovering storage")
			if m := await(t, msgs, "READY=1"); !strings.Contains(m, "STATUS=serving (target "+tc.target+")") {
				t.Fatalf("ready message %q has no serving status", m)
			}
			await(t, msgs, "WATCHDOG=1")
			cancel()
			await(t, msgs, "STOPPING=1")
			if err := <-errc; err != nil {
				t.Fatalf("Run = %v after a clean stop", err)
			}
		})
	}
}

func TestServiceManagerHearsNothingReadyWhenAListenerFails(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	socket, msgs := notifySocket(t)
	cfg, _, err := Load([]string{"-data-dir", t.TempDir(), "-admin.listen", "", "-node.listen", busy.Addr().String()}, TargetNode)
	if err != nil {
		t.Fatal(err)
	}
	sd, err := sdnotify.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if err := Run(t.Context(), cfg, logger, &serviceManager{sd: sd, logger: logger}); err == nil {
		t.Fatal("Run succeeded on a busy address")
	}
	// Run returned: every message it sent is in the socket's queue. The
	// last one says why it failed; none says ready.
	for {
		m := await(t, msgs, "STATUS=")
		if strings.Contains(m, "READY=1") {
			t.Fatalf("ready sent by a node that could not listen: %q", m)
		}
		if strings.HasPrefix(m, "STATUS=failed: ") {
			return
		}
	}
}
