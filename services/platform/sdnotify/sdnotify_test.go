package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen opens a datagram socket at name (a path, or '@' for an abstract
// name) as a service manager would, and returns its name.
func listen(t testing.TB, name string) (*net.UnixConn, string) {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", name, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, name
}

// receive reads one datagram; the test's deadline bounds the wait.
func receive(t testing.TB, conn *net.UnixConn) string {
	t.Helper()
	if d, ok := t.(*testing.T).Deadline(); ok {
		_ = conn.SetReadDeadline(d)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("read notify message: %v", err)
	}
	return string(buf[:n])
}

func TestMessages(t *testing.T) {
	sockets := map[string]string{
		"path":     filepath.Join(t.TempDir(), "notify.sock"),
		"abstract": fmt.Sprintf("@ursula-sdnotify-test-%d", os.Getpid()),
	}
	for kind, name := range sockets {
		t.Run(kind, func(t *testing.T) {
			conn, socket := listen(t, name)
			n, err := FromEnv(func(k string) string {
				if k == EnvSocket {
					return socket
				}
				return ""
			})
			if err != nil {
				t.Fatal(err)
			}
			tests := []struct {
				name string
				send func() error
				want string
			}{
				{"ready", func() error { return n.Ready("serving\nsecond line dropped") }, "READY=1\nSTATUS=serving\n"},
				{"status", func() error { return n.Status("recovering storage") }, "STATUS=recovering storage\n"},
				{"stopping", func() error { return n.Stopping("draining") }, "STOPPING=1\nSTATUS=draining\n"},
				{"watchdog", n.Watchdog, "WATCHDOG=1\n"},
			}
			for _, tc := range tests {
				if err := tc.send(); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if got := receive(t, conn); got != tc.want {
					t.Fatalf("%s sent %q, want %q", tc.name, got, tc.want)
				}
			}
		})
	}
}

func TestWithoutSocketNothingIsSent(t *testing.T) {
	for name, n := range map[string]*Notifier{"nil": nil, "zero": {}, "empty env": mustNew(t, "")} {
		t.Run(name, func(t *testing.T) {
			if n.Enabled() {
				t.Fatal("Enabled without a socket")
			}
			for _, err := range []error{n.Ready("x"), n.Status("x"), n.Stopping("x"), n.Watchdog()} {
				if err != nil {
					t.Fatalf("a silent notifier failed: %v", err)
				}
			}
			// Returns at once instead of ticking.
			n.RunWatchdog(t.Context(), time.Second, nil, nil)
		})
	}
}

func mustNew(t testing.TB, socket string) *Notifier {
	t.Helper()
	n, err := New(socket)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBadInput(t *testing.T) {
	for _, socket := range []string{"relative.sock", "vsock:2:1234", "@"} {
		if _, err := New(socket); !errors.Is(err, ErrUnsupportedSocket) {
			t.Errorf("New(%q) = %v, want ErrUnsupportedSocket", socket, err)
		}
	}
	conn, socket := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	n := mustNew(t, socket)
	for _, a := range []string{"STATUS=two\nREADY=1", "no assignment"} {
		if err := n.Notify(a); err == nil {
			t.Errorf("Notify(%q) succeeded", a)
		}
	}
	// Nothing was sent: the next message is the first one read.
	if err := n.Watchdog(); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, conn); got != "WATCHDOG=1\n" {
		t.Fatalf("first message %q: a malformed one was sent", got)
	}
	// A socket nobody listens on is an error, not a hang.
	gone := mustNew(t, filepath.Join(t.TempDir(), "nobody.sock"))
	if err := gone.Watchdog(); err == nil {
		t.Fatal("sending to a missing socket succeeded")
	}
}

func TestWatchdogTimeout(t *testing.T) {
	const pid = 4242
	tests := []struct {
		name    string
		env     map[string]string
		want    time.Duration
		wantErr bool
	}{
		{"unset", nil, 0, false},
		{"set", map[string]string{EnvWatchdogUsec: "30000000"}, 30 * time.Second, false},
		{"for this process", map[string]string{EnvWatchdogUsec: "1000", EnvWatchdogPID: "4242"}, time.Millisecond, false},
		{"for another process", map[string]string{EnvWatchdogUsec: "1000", EnvWatchdogPID: "1"}, 0, false},
		{"zero", map[string]string{EnvWatchdogUsec: "0"}, 0, true},
		{"garbage", map[string]string{EnvWatchdogUsec: "30s"}, 0, true},
		{"bad pid", map[string]string{EnvWatchdogUsec: "1000", EnvWatchdogPID: "me"}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WatchdogTimeout(func(k string) string { return tc.env[k] }, pid)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("WatchdogTimeout = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestRunWatchdogPingsWhileHealthy(t *testing.T) {
	conn, socket := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	n := mustNew(t, socket)
	// The health check answers what the test tells it, one answer per
	// round, so the test decides which rounds ping.
	answers := make(chan error)
	reports := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.RunWatchdog(ctx, time.Millisecond, func(ctx context.Context) error {
			select {
			case err := <-answers:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}, func(err error) { reports <- err })
	}()
	answers <- nil
	if got := receive(t, conn); got != "WATCHDOG=1\n" {
		t.Fatalf("healthy round sent %q", got)
	}
	sick := errors.New("storage stalled")
	answers <- sick
	if err := <-reports; !errors.Is(err, sick) {
		t.Fatalf("reported %v, want the health failure", err)
	}
	answers <- nil
	// The unhealthy round sent nothing: the next datagram is this round's.
	if got := receive(t, conn); got != "WATCHDOG=1\n" {
		t.Fatalf("healthy round sent %q", got)
	}
	cancel()
	<-done
}
