package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// echoServer answers every line with the same line.
func echoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

func newTestProxy(t testing.TB) *Proxy {
	t.Helper()
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func dialProxy(t testing.TB, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), await.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and waits up to timeout for the echo.
func roundTrip(c net.Conn, r *bufio.Reader, line string, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echo mismatch: " + got)
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func TestProxy(t *testing.T) {
	t.Run("pass", func(t *testing.T) {
		p := newTestProxy(t)
		c, r := dialProxy(t, p)
		for _, l := range []string{"a", "bb", "ccc"} {
			if err := roundTrip(c, r, l, await.DefaultTimeout); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("blackhole drops both ways, heal resets the link", func(t *testing.T) {
		p := newTestProxy(t)
		c, r := dialProxy(t, p)
		if err := roundTrip(c, r, "before", await.DefaultTimeout); err != nil {
			t.Fatal(err)
		}
		p.Blackhole()
		if err := roundTrip(c, r, "during", 300*time.Millisecond); !isTimeout(err) {
			t.Fatalf("open connection while blackholed: want a timeout, got %v", err)
		}
		c2, r2 := dialProxy(t, p) // accepted, goes nowhere
		if err := roundTrip(c2, r2, "new", 300*time.Millisecond); !isTimeout(err) {
			t.Fatalf("new connection while blackholed: want a timeout, got %v", err)
		}
		p.Heal()
		for _, cc := range []net.Conn{c, c2} {
			cc.SetReadDeadline(time.Now().Add(await.DefaultTimeout))
			if _, err := cc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Fatalf("a connection that lost bytes must be closed at heal, read gave %v", err)
			}
		}
		c3, r3 := dialProxy(t, p)
		if err := roundTrip(c3, r3, "after", await.DefaultTimeout); err != nil {
			t.Fatalf("after heal: %v", err)
		}
	})
	t.Run("cut closes and refuses", func(t *testing.T) {
		p := newTestProxy(t)
		c, r := dialProxy(t, p)
		if err := roundTrip(c, r, "before", await.DefaultTimeout); err != nil {
			t.Fatal(err)
		}
		p.Cut()
		if err := roundTrip(c, r, "during", await.DefaultTimeout); err == nil || isTimeout(err) {
			t.Fatalf("open connection after cut: want it closed, got %v", err)
		}
		c2, r2 := dialProxy(t, p)
		if err := roundTrip(c2, r2, "new", await.DefaultTimeout); err == nil || isTimeout(err) {
			t.Fatalf("new connection while cut: want it closed, got %v", err)
		}
		p.Heal()
		c3, r3 := dialProxy(t, p)
		if err := roundTrip(c3, r3, "after", await.DefaultTimeout); err != nil {
			t.Fatalf("after heal: %v", err)
		}
	})
	t.Run("delay", func(t *testing.T) {
		p := newTestProxy(t)
		c, r := dialProxy(t, p)
		p.SetDelay(150 * time.Millisecond)
		start := time.Now()
		if err := roundTrip(c, r, "slow", await.DefaultTimeout); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("round trip through a 150 ms delay each way took %v", d)
		}
		// Heal removes the delay: with a delay as long as the wait, the
		// round trip below could not finish in time unless it is gone.
		// (No upper bound on how long an undelayed round trip takes.)
		p.SetDelay(await.DefaultTimeout)
		p.Heal()
		if err := roundTrip(c, r, "fast", await.DefaultTimeout); err != nil {
			t.Fatalf("round trip after heal: %v", err)
		}
	})
	t.Run("reset closes open connections only", func(t *testing.T) {
		p := newTestProxy(t)
		c, r := dialProxy(t, p)
		if err := roundTrip(c, r, "before", await.DefaultTimeout); err != nil {
			t.Fatal(err)
		}
		p.Reset()
		if err := roundTrip(c, r, "during", await.DefaultTimeout); err == nil || isTimeout(err) {
			t.Fatalf("open connection after reset: want it closed, got %v", err)
		}
		c2, r2 := dialProxy(t, p)
		if err := roundTrip(c2, r2, "new", await.DefaultTimeout); err != nil {
			t.Fatalf("new connection after reset: %v", err)
		}
	})
}
