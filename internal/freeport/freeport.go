package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the first port picked: below it live the well-known and
// commonly configured ports of the machine's own services.
const lowest = 10000

// defaultEphemeralStart is where the ephemeral range starts when the
// kernel does not say (Linux's default).
const defaultEphemeralStart = 32768

// attempts bounds the random picks per address before port 0 is used.
const attempts = 64

// Addrs returns n distinct loopback addresses ("127.0.0.1:port") that were
// free a moment ago, below the kernel's ephemeral range when it leaves
// room there. All n are held at once while picking, so they differ.
func Addrs(n int) ([]string, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	top := ephemeralStart()
	out := make([]string, 0, n)
	for range n {
		l, err := listen(top)
		if err != nil {
			return nil, fmt.Errorf("freeport: reserve a loopback port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// Addr is Addrs(1)[0].
func Addr() (string, error) {
	a, err := Addrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}

// listen binds a random port in [lowest, top), or port 0 when none of its
// picks is free or the range is empty.
func listen(top int) (net.Listener, error) {
	if top > lowest {
		for range attempts {
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lowest+rand.IntN(top-lowest))); err == nil {
				return l, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ephemeralStart reads the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralStart
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return defaultEphemeralStart
	}
	p, err := strconv.Atoi(f[0])
	if err != nil || p <= 0 {
		return defaultEphemeralStart
	}
	return p
}
