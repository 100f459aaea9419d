package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	addrs, err := Addrs(20)
	if err != nil {
		t.Fatal(err)
	}
	top := ephemeralStart()
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s picked twice in %v", a, addrs)
		}
		seen[a] = true
		host, port, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q: %v", a, err)
		}
		if p, _ := strconv.Atoi(port); top > lowest && (p < lowest || p >= top) {
			t.Fatalf("port %d outside [%d, %d)", p, lowest, top)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("bind %s: %v", a, err)
		}
		l.Close()
	}
}

func TestFallsBackToPortZeroWithoutRoom(t *testing.T) {
	l, err := listen(lowest) // an empty range
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := l.Addr().(*net.TCPAddr).Port; p < ephemeralStart() {
		t.Fatalf("port %d: want one the kernel picked from its ephemeral range", p)
	}
}
