package e2e

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// TestSystemdNotify runs the all-in-one binary as systemd runs a unit of
// Type=notify with WatchdogSec (deploy/*.service): $NOTIFY_SOCKET and
// $WATCHDOG_USEC set, a datagram socket listening. The process must say
// READY=1 by the time it serves, ping the watchdog, and say STOPPING=1
// when SIGTERM starts its graceful shutdown, then exit 0.
func TestSystemdNotify(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 256)
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
			default: // the test stopped reading
			}
		}
	}()
	defer func() { _ = conn.Close(); <-done }()

	s := StartServer(t, Options{Env: []string{
		"NOTIFY_SOCKET=" + socket,
		// A ping every 100 ms.
		"WATCHDOG_USEC=200000",
	}})
	// Served: READY=1 came first, after the recovery status.
	var seen []string
	next := func(want string) {
		t.Helper()
		deadline := time.After(await.DefaultTimeout)
		for {
			select {
			case m := <-msgs:
				seen = append(seen, m)
				if strings.Contains(m, want) {
					return
				}
				if strings.Contains(m, "STOPPING=1") {
					t.Fatalf("STOPPING=1 before %s; messages: %q", want, seen)
				}
			case <-deadline:
				t.Fatalf("no %s from the process; messages: %q", want, seen)
			}
		}
	}
	next("STATUS=recovering storage")
	next("READY=1")
	if last := seen[len(seen)-1]; !strings.Contains(last, "STATUS=serving") {
		t.Errorf("READY=1 without a serving status: %q", last)
	}
	next("WATCHDOG=1")
	next("WATCHDOG=1")
	if err := s.Terminate(await.DefaultTimeout); err != nil {
		t.Fatal(err)
	}
	next("STOPPING=1")
}
