package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ProxyMode is what a Proxy does with traffic.
type ProxyMode int

const (
	// ProxyPass forwards traffic (after the configured delay).
	ProxyPass ProxyMode = iota
	// ProxyBlackhole keeps connections open but drops every byte in both
	// directions, like a network partition: new connections are accepted
	// and never reach the target. Heal closes the connections that lost
	// bytes, since their streams are no longer whole; the peers reconnect.
	ProxyBlackhole
	// ProxyCut closes every connection and closes new ones as soon as they
	// are accepted, like a peer whose port is closed.
	ProxyCut
)

func (m ProxyMode) String() string {
	switch m {
	case ProxyPass:
		return "pass"
	case ProxyBlackhole:
		return "blackhole"
	case ProxyCut:
		return "cut"
	}
	return fmt.Sprintf("ProxyMode(%d)", int(m))
}

// Proxy is a TCP proxy for one directed link, from the nodes that dial its
// address to Target. Chaos tests point a node's [[raft.peers]] cluster_url at
// a proxy per peer, so that one link, or every link of one node, can be
// blackholed, delayed or cut while the processes keep running. It is the
// fault-injection seam of the cluster plane: the nodes run unmodified.
type Proxy struct {
	// Name labels the link in logs, e.g. "1->2".
	Name string
	// Target is the address connections are forwarded to.
	Target string

	ln net.Listener

	mu     sync.Mutex
	mode   ProxyMode
	delay  time.Duration
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// proxyConn is one accepted connection and its upstream.
type proxyConn struct {
	client net.Conn
	server net.Conn // nil while the connection is blackholed from the start
	// tainted is set once the connection dropped bytes.
	tainted bool
	// halves counts the directions that ended.
	halves int
	once   sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.client.Close()
		if c.server != nil {
			c.server.Close()
		}
	})
}

// NewProxy listens on a free loopback port and forwards to target. It runs
// until Close.
func NewProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy %s: listen: %w", name, err)
	}
	p := &Proxy{Name: name, Target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listen address, to be dialed instead of Target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() ProxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Blackhole drops all traffic, on open and new connections, until Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = ProxyBlackhole
}

// Cut closes every open connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.mode = ProxyCut
	conns := p.takeConnsLocked(func(*proxyConn) bool { return true })
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Reset closes every open connection once; new connections pass.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := p.takeConnsLocked(func(*proxyConn) bool { return true })
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// SetDelay delays every chunk of data by d in each direction (0 removes
// the delay). Bytes keep their order.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Heal passes traffic again and removes the delay. Connections that dropped
// bytes while blackholed are closed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.mode = ProxyPass
	p.delay = 0
	conns := p.takeConnsLocked(func(c *proxyConn) bool { return c.tainted || c.server == nil })
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Close stops listening and closes every connection. It waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.takeConnsLocked(func(*proxyConn) bool { return true })
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
}

func (p *Proxy) takeConnsLocked(match func(*proxyConn) bool) []*proxyConn {
	var out []*proxyConn
	for c := range p.conns {
		if match(c) {
			out = append(out, c)
			delete(p.conns, c)
		}
	}
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		p.mu.Unlock()
		if closed || mode == ProxyCut {
			client.Close()
			continue
		}
		c := &proxyConn{client: client}
		if mode == ProxyPass {
			server, err := net.DialTimeout("tcp", p.Target, 2*time.Second)
			if err != nil {
				client.Close() // the target is down: the dialer sees a reset
				continue
			}
			c.server = server
		} else {
			c.tainted = true
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, c.client, c.server)
		go p.pipe(c, c.server, c.client)
	}
}

// chunk is data read from one side, due at the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through a queue that applies the delay, dropping
// data while blackholed. A nil side (a connection accepted while
// blackholed) only drains.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	if src == nil {
		p.halfDone(c)
		return
	}
	queue := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range queue {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if dst == nil {
				continue
			}
			if _, err := dst.Write(ch.data); err != nil {
				c.close()
				for range queue {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			mode, delay := p.mode, p.delay
			if mode != ProxyPass || dst == nil {
				c.tainted = true
			}
			p.mu.Unlock()
			if mode == ProxyPass && dst != nil {
				queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay)}
			}
		}
		if err != nil {
			close(queue)
			<-done
			tc, ok := dst.(*net.TCPConn)
			if errors.Is(err, io.EOF) && ok {
				// Half-close: pass the EOF on; the other direction may go on.
				tc.CloseWrite()
			} else {
				c.close()
			}
			p.halfDone(c)
			return
		}
	}
}

// halfDone records that one direction of c ended; after both, c is closed
// and forgotten.
func (p *Proxy) halfDone(c *proxyConn) {
	p.mu.Lock()
	c.halves++
	both := c.halves == 2
	if both {
		delete(p.conns, c)
	}
	p.mu.Unlock()
	if both {
		c.close()
	}
}
