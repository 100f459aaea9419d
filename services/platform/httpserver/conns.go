package httpserver

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Bounds of a refused connection's answer: it is given refusalLinger to
// send its request and take the answer (and have up to refusalDrain bytes
// of its request read and dropped, so that closing does not reset the
// connection before the client reads the answer), and at most
// maxLingering refusals are answered at once; beyond that a refused
// connection is closed at once.
const (
	refusalLinger = time.Second
	refusalDrain  = 64 << 10
	maxLingering  = 64
)

// ConnLimiter is a listener that holds at most a fixed number of
// connections at once: a connection accepted beyond it is answered with a
// canned response (a plaintext HTTP 503) and closed, or closed at once
// when there is no response to give (TLS and gRPC planes), never handed to
// the server. Each connection, kept alive or idle, costs a goroutine and its
// buffers, so without the cap clients alone decide how much memory the
// process holds. Refusing, rather than not accepting, tells the client at
// once instead of leaving it in the kernel's backlog until it times out.
type ConnLimiter struct {
	net.Listener
	max       int64
	refusal   []byte
	active    atomic.Int64
	refused   atomic.Uint64
	lingering atomic.Int64
}

// SidePlaneMaxConnections caps the listeners of the side services (the
// cold-GC worker's metrics plane, the backup service's HTTP API), called
// by a scraper or an operator now and then: far above their need, far
// below a process's descriptors.
const SidePlaneMaxConnections = 1024

// LimitConnections wraps ln so that it holds at most max connections. A
// refused connection is sent refusal as is (an HTTP answer, for a
// plaintext HTTP listener) or, when refusal is nil, just closed.
func LimitConnections(ln net.Listener, max int, refusal []byte) *ConnLimiter {
	return &ConnLimiter{Listener: ln, max: int64(max), refusal: refusal}
}

// Accept returns the next connection within the cap; the ones beyond it
// are refused here and never returned.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.active.Add(1) <= l.max {
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.active.Add(-1)
		l.refused.Add(1)
		l.refuse(c)
	}
}

// refuse answers c with the refusal and closes it, without blocking
// Accept.
func (l *ConnLimiter) refuse(c net.Conn) {
	if l.refusal == nil {
		_ = c.Close()
		return
	}
	if l.lingering.Add(1) > maxLingering {
		l.lingering.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer l.lingering.Add(-1)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refusalLinger))
		// The answer goes out once the request has started to arrive: an
		// answer that comes before it is, to a client such as Go's, an
		// unsolicited response on an idle connection, not an answer.
		buf := make([]byte, 4<<10)
		if _, err := c.Read(buf); err != nil {
			return
		}
		if _, err := c.Write(l.refusal); err != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.CopyN(io.Discard, c, refusalDrain)
	}()
}

// Active returns the connections held now.
func (l *ConnLimiter) Active() int64 { return l.active.Load() }

// Refused returns the connections refused so far.
func (l *ConnLimiter) Refused() uint64 { return l.refused.Load() }

// Max returns the cap.
func (l *ConnLimiter) Max() int64 { return l.max }

// limitedConn gives its slot back when it is closed (once, however often
// the server closes it).
type limitedConn struct {
	net.Conn
	l      *ConnLimiter
	closed atomic.Bool
}

func (c *limitedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.active.Add(-1)
	}
	return c.Conn.Close()
}

// NetConn returns the accepted connection, as tls.Conn's does, for code
// that reads the socket itself (the gateway's send-queue probe).
func (c *limitedConn) NetConn() net.Conn { return c.Conn }
