// Package sdnotify tells a service manager (systemd, for a unit of
// Type=notify) how the process is doing, with the notify protocol of
// sd_notify(3): one datagram per message, sent to the AF_UNIX datagram
// socket named by $NOTIFY_SOCKET, holding newline-separated VAR=value
// assignments. A socket name that starts with '@' is in the abstract
// namespace.
//
// The messages this package sends:
//
//	READY=1       the process serves (what that means is the caller's
//	              definition: services/app documents it per target)
//	STATUS=...    one line a human reads in `systemctl status`
//	STOPPING=1    a graceful shutdown began
//	WATCHDOG=1    the process is alive; sent every half of $WATCHDOG_USEC
//	              (set by WatchdogSec=) while a health check passes
//
// Without $NOTIFY_SOCKET (not started by a service manager, or a unit of
// another type) every call does nothing and succeeds: a Notifier's zero
// value and nil are both valid and silent.
package sdnotify
