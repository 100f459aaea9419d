//go:build linux

package gateway

import (
	"net"
	"syscall"
	"unsafe"
)

// socketQueue reads how much a TCP connection has queued for sending.
type socketQueue struct {
	raw syscall.RawConn
	// room is the most a hub writer lets be queued (including its own
	// write) and still write without risk of blocking: a quarter of the
	// send buffer, at most directMaxQueued.
	room int
}

// newSocketQueue returns the queue of c, or nil when c is not a TCP
// connection whose queue can be read.
func newSocketQueue(c net.Conn) *socketQueue {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	sndbuf := 0
	cerr := raw.Control(func(fd uintptr) {
		sndbuf, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	})
	if cerr != nil || err != nil || sndbuf <= 0 {
		return nil
	}
	return &socketQueue{raw: raw, room: min(sndbuf/4, directMaxQueued)}
}

// queued returns the bytes written but not yet acknowledged by the peer
// (SIOCOUTQ); ok is false when it cannot tell.
func (q *socketQueue) queued() (n int, ok bool) {
	var v int32
	var errno syscall.Errno
	if err := q.raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&v)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(v), true
}
