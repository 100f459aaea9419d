package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// The environment variables of the notify protocol.
const (
	// EnvSocket names the socket the service manager listens on.
	EnvSocket = "NOTIFY_SOCKET"
	// EnvWatchdogUsec is the watchdog timeout in microseconds.
	EnvWatchdogUsec = "WATCHDOG_USEC"
	// EnvWatchdogPID, when set, names the process the watchdog is meant
	// for: another process (a child that inherited the environment)
	// ignores it.
	EnvWatchdogPID = "WATCHDOG_PID"
)

// ErrUnsupportedSocket is returned for a $NOTIFY_SOCKET that is neither a
// path nor an abstract name (systemd also knows vsock: addresses).
var ErrUnsupportedSocket = errors.New("sdnotify: unsupported NOTIFY_SOCKET address")

// Notifier sends notify messages to one socket. Its methods are safe for
// concurrent use; on a nil or zero Notifier they do nothing.
type Notifier struct {
	addr *net.UnixAddr
}

// New returns a Notifier for socket, the value of $NOTIFY_SOCKET: an
// absolute path or an abstract name starting with '@'. An empty socket
// gives a Notifier that does nothing.
func New(socket string) (*Notifier, error) {
	if socket == "" {
		return &Notifier{}, nil
	}
	if socket[0] != '/' && socket[0] != '@' {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedSocket, socket)
	}
	if len(socket) < 2 {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedSocket, socket)
	}
	// The net package maps a leading '@' to the abstract namespace.
	return &Notifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// FromEnv returns a Notifier for $NOTIFY_SOCKET as getenv reads it
// (os.Getenv in a process).
func FromEnv(getenv func(string) string) (*Notifier, error) {
	return New(getenv(EnvSocket))
}

// Enabled reports whether messages go anywhere.
func (n *Notifier) Enabled() bool { return n != nil && n.addr != nil }

// Notify sends one message of the given VAR=value assignments. A
// value must not hold a newline: it would start another assignment.
func (n *Notifier) Notify(assignments ...string) error {
	if !n.Enabled() || len(assignments) == 0 {
		return nil
	}
	for _, a := range assignments {
		if strings.ContainsRune(a, '\n') || !strings.Contains(a, "=") {
			return fmt.Errorf("sdnotify: malformed assignment %q", a)
		}
	}
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sdnotify: dial %s: %w", n.addr.Name, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(assignments, "\n") + "\n")); err != nil {
		return fmt.Errorf("sdnotify: send to %s: %w", n.addr.Name, err)
	}
	return nil
}

// Ready says the process serves, with a status line.
func (n *Notifier) Ready(status string) error {
	return n.Notify("READY=1", "STATUS="+oneLine(status))
}

// Status sets the status line.
func (n *Notifier) Status(status string) error { return n.Notify("STATUS=" + oneLine(status)) }

// Stopping says a graceful shutdown began, with a status line.
func (n *Notifier) Stopping(status string) error {
	return n.Notify("STOPPING=1", "STATUS="+oneLine(status))
}

// Watchdog pings the watchdog once.
func (n *Notifier) Watchdog() error { return n.Notify("WATCHDOG=1") }

// oneLine keeps a status to its first line.
func oneLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// WatchdogTimeout returns the watchdog timeout the service manager set
// for this process (pid), or 0 when there is none: $WATCHDOG_USEC unset,
// or $WATCHDOG_PID naming another process.
func WatchdogTimeout(getenv func(string) string, pid int) (time.Duration, error) {
	usec := getenv(EnvWatchdogUsec)
	if usec == "" {
		return 0, nil
	}
	if p := getenv(EnvWatchdogPID); p != "" {
		want, err := strconv.Atoi(p)
		if err != nil {
			return 0, fmt.Errorf("sdnotify: %s=%q: %w", EnvWatchdogPID, p, err)
		}
		if want != pid {
			return 0, nil
		}
	}
	v, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("sdnotify: %s=%q is not a positive number of microseconds", EnvWatchdogUsec, usec)
	}
	return time.Duration(v) * time.Microsecond, nil
}

// RunWatchdog pings the watchdog every half of timeout, whenever healthy
// (nil: always) returns nil, until ctx ends. A failed health check skips
// the ping, so that a process that stays unhealthy is restarted by the
// service manager once timeout passes; report hears of each failure (and
// of each ping that could not be sent). A zero timeout returns at once.
func (n *Notifier) RunWatchdog(ctx context.Context, timeout time.Duration, healthy func(context.Context) error, report func(error)) {
	if !n.Enabled() || timeout <= 0 {
		return
	}
	if report == nil {
		report = func(error) {}
	}
	t := time.NewTicker(timeout / 2)
	defer t.Stop()
	for {
		err := error(nil)
		if healthy != nil {
			err = healthy(ctx)
		}
		if err == nil {
			err = n.Watchdog()
		}
		if err != nil && ctx.Err() == nil {
			report(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
