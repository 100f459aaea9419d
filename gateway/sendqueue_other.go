//go:build !linux

package gateway

import "net"

// socketQueue is unavailable here: hub writers never write to clients
// directly; every client writes its own events.
type socketQueue struct{ room int }

func newSocketQueue(net.Conn) *socketQueue { return nil }

func (*socketQueue) queued() (int, bool) { return 0, false }
