package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ursula/ursula/services/platform/lifecycle"
	"github.com/ursula/ursula/services/platform/sdnotify"
)

// serviceManager tells the service manager that started the process
// (systemd, for a unit of Type=notify) how it is doing: READY=1 once the
// process serves, STATUS= lines, STOPPING=1 when a graceful shutdown
// begins, and WATCHDOG=1 every half of WatchdogSec while it runs
// (startWatchdog). Without
// $NOTIFY_SOCKET it says nothing; nil is valid and silent.
//
// What "serves" means, per target (READY=1):
//
//   - node: the storage is recovered (the journals are replayed, which
//     engine.Open does) and the client, admin and cluster listeners are
//     bound. Not that the cluster has a quorum: the nodes of a cluster
//     start one by one, and a lone node that waited for its peers before
//     saying ready would never start under systemd. The node's own
//     readiness (GET /__ursula/ready) says when it has leaders.
//   - gateway: its listener is bound (and, split, its upstream router
//     built); requests before the nodes are ready are answered 503.
//   - all: both of the above.
//   - coldgc: the cold store is opened and its format checked, and the
//     metrics listener (server.metrics_listen), when set, is bound.
//   - backup: the service is built (location, schedule and node
//     connections configured); its listener is bound right after.
type serviceManager struct {
	sd *sdnotify.Notifier
	// watchdog is the service manager's watchdog timeout (0: none).
	watchdog time.Duration
	logger   *slog.Logger
}

// newServiceManager reads $NOTIFY_SOCKET, $WATCHDOG_USEC and
// $WATCHDOG_PID through getenv.
func newServiceManager(getenv func(string) string, logger *slog.Logger) (*serviceManager, error) {
	sd, err := sdnotify.FromEnv(getenv)
	if err != nil {
		return nil, err
	}
	wd, err := sdnotify.WatchdogTimeout(getenv, os.Getpid())
	if err != nil {
		return nil, err
	}
	if !sd.Enabled() {
		return nil, nil
	}
	return &serviceManager{sd: sd, watchdog: wd, logger: logger.With("component", "sdnotify")}, nil
}

// status sets the status line.
func (m *serviceManager) status(format string, args ...any) {
	if m == nil {
		return
	}
	if err := m.sd.Status(fmt.Sprintf(format, args...)); err != nil {
		m.logger.Warn("cannot tell the service manager", "err", err)
	}
}

// startWatchdog pings the watchdog every half of its timeout from now
// until the returned function is called: from the start of the process,
// so that a long journal replay before READY=1 is not taken for a hang,
// to its end, through the graceful shutdown. The pings say that the Go
// runtime still schedules goroutines; a role that hangs is not detected.
func (m *serviceManager) startWatchdog() (stop func()) {
	if m == nil || m.watchdog <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.sd.RunWatchdog(ctx, m.watchdog, nil, func(err error) {
			m.logger.Warn("watchdog ping failed", "err", err)
		})
	}()
	return func() {
		cancel()
		<-done
	}
}

// run runs roles under lifecycle.Run, says READY=1 once every channel of
// ready is closed, and STOPPING=1 once ctx ends.
func (m *serviceManager) run(ctx context.Context, logger *slog.Logger, ready []<-chan struct{}, status string, roles ...lifecycle.Role) error {
	if m == nil {
		return lifecycle.Run(ctx, logger, roles...)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, ch := range ready {
			select {
			case <-ch:
			case <-done:
				return
			}
		}
		if ctx.Err() != nil {
			return // stopping already: never ready
		}
		if err := m.sd.Ready(status); err != nil {
			m.logger.Warn("cannot tell the service manager that the process is ready", "err", err)
			return
		}
		m.logger.Info("told the service manager: ready", "status", status)
	})
	wg.Go(func() {
		select {
		case <-ctx.Done():
			if err := m.sd.Stopping("stopping: draining and syncing"); err != nil {
				m.logger.Warn("cannot tell the service manager", "err", err)
			}
		case <-done:
		}
	})
	err := lifecycle.Run(ctx, logger, roles...)
	close(done)
	wg.Wait()
	if err != nil {
		m.status("failed: %v", err)
	}
	return err
}
