package listenmux

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
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
	tls       *tls.Config
	refused   func(remote net.Addr, err error)
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

// NewTLS wraps l as New does, and runs each connection's TLS handshake
// (bounded by the same deadline as the sniff) before it is split, so both
// servers get decrypted connections (give the gRPC server credentials that
// read the state of a finished handshake: pki.Terminated). A failed
// handshake closes the connection and is passed to refused (which may be
// nil); nothing of it reaches either server.
func NewTLS(l net.Listener, cfg *tls.Config, refused func(remote net.Addr, err error)) *Mux {
	m := New(l)
	m.tls, m.refused = cfg, refused
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
	deadline := time.Now().Add(sniffTimeout)
	if m.tls != nil {
		tc := tls.Server(c, m.tls)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			if m.refused != nil {
				m.refused(c.RemoteAddr(), err)
			}
			_ = c.Close()
			return
		}
		c = tc
	}
	_ = c.SetReadDeadline(deadline)
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

// NetConn is the connection underneath (a *tls.Conn on a TLS mux), for
// code that needs its state.
func (c *peekedConn) NetConn() net.Conn { return c.Conn }
