// Package freeport picks loopback TCP addresses for tests that start
// servers of their own (in the test process or as child processes).
//
// An address picked by binding port 0 comes from the kernel's ephemeral
// range, the range every outgoing connection also draws its local port
// from. Between the pick and the server's bind the port is free, and on a
// busy machine (tests running side by side, each dialing thousands of
// connections) an outgoing connection sometimes takes it: the server then
// fails with "address already in use". Ports below the ephemeral range
// are never handed to outgoing connections, so the gap is closed for
// everything but another test picking the same port, which a random pick
// over twenty thousand ports makes rare.
package freeport
