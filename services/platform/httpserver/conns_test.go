package httpserver

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// TestConnLimiter: the cap holds, a refused connection that sends its
// request reads the refusal and then end of file, and a connection closed twice gives back one slot.
func TestConnLimiter(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitConnections(raw, 1, []byte("refused\n"))
	defer l.Close()
	accepted := acceptAll(l)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	first := <-accepted

	second := dial()
	if _, err := second.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = second.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a broken limiter
	got, err := io.ReadAll(second)
	if err != nil || string(got) != "refused\n" {
		t.Fatalf("refused connection read %q, %v", got, err)
	}
	if l.Refused() != 1 || l.Active() != 1 {
		t.Fatalf("refused %d, active %d; want 1 and 1", l.Refused(), l.Active())
	}

	_ = first.Close()
	_ = first.Close()
	if l.Active() != 0 {
		t.Fatalf("active %d after closing the only connection twice, want 0", l.Active())
	}
	dial()
	<-accepted
	if l.Active() != 1 {
		t.Fatalf("active %d, want 1", l.Active())
	}
	await.True(t, "the refusal to stop lingering", func() bool { return l.lingering.Load() == 0 })
}

// TestConnLimiterWithoutRefusal: with no refusal to send (a TLS or gRPC
// plane), a connection beyond the cap is closed at once, before it sends
// anything, and never handed to the server.
func TestConnLimiterWithoutRefusal(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitConnections(raw, 1, nil)
	defer l.Close()
	accepted := acceptAll(l)
	first, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	<-accepted
	second, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_ = second.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a broken limiter
	if n, err := second.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("connection beyond the cap read %d bytes, %v; want it closed", n, err)
	}
	if l.Refused() != 1 || l.Active() != 1 || len(accepted) != 0 {
		t.Fatalf("refused %d, active %d, handed over %d more; want 1, 1, 0", l.Refused(), l.Active(), len(accepted))
	}
}

// acceptAll hands over the connections l accepts until it is closed.
func acceptAll(l net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	return accepted
}
