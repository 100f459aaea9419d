package listenmux

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"sync"
	"time"
)

// preface is the start of every HTTP/2 (and so gRPC) connection.
var preface = []byte("PRI * HTTP/2.0")

// sniffTimeout bounds how long a new connection may take to send its first
// bytes before it is dropped.
const sniffTimeout = 10 * time.Second

// Mux splits one listener into an HTTP/2 (gRPC) listener and an HTTP/1 one.
type Mux struct {
	root      net.Listener
	grpc      *childListener
	http      *childListener
	closeOnce sync.Once
	done      chan struct{}
}

// New wraps l. Call Serve to start accepting.
func New(l net.Listener) *Mux {
	m := &Mux{root: l, done: make(chan struct{})}
	m.grpc = &childListener{m: m, conns: make(chan net.Conn)}
	m.http = &childListener{m: m, conns: make(chan net.Conn)}
	return m
}

// GRPC is the listener that receives HTTP/2 connections.
func (m *Mux) GRPC() net.Listener { return m.grpc }

// HTTP is the listener that receives every other connection.
func (m *Mux) HTTP() net.Listener { return m.http }

// Serve accepts connections until the root listener is closed.
func (m *Mux) Serve() error {
	for {
		c, err := m.root.Accept()
		if err != nil {
			m.Close()
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go m.route(c)
	}
}

func (m *Mux) route(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, 64)
	head, err := br.Peek(len(preface))
	_ = c.SetReadDeadline(time.Time{})
	if err != nil && len(head) == 0 {
		_ = c.Close()
		return
	}
	target := m.http
	if bytes.Equal(head, preface) {
		target = m.grpc
	}
	select {
	case target.conns <- &peekedConn{Conn: c, r: br}:
	case <-m.done:
		_ = c.Close()
	}
}

// Close stops accepting; child listeners return net.ErrClosed.
func (m *Mux) Close() error {
	var err error
	m.closeOnce.Do(func() {
		close(m.done)
		err = m.root.Close()
	})
	return err
}

type childListener struct {
	m     *Mux
	conns chan net.Conn
}

func (l *childListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.m.done:
		return nil, net.ErrClosed
	}
}

func (l *childListener) Close() error   { return l.m.Close() }
func (l *childListener) Addr() net.Addr { return l.m.root.Addr() }

// peekedConn replays the sniffed bytes before reading from the socket.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
