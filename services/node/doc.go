// Package node is the ursula-node server: it serves the StreamService data
// API over gRPC and /__ursula/{metrics,ready} over HTTP on the client plane
// (one port, split by protocol), and the admin API (gRPC with REST
// mappings) on the loopback admin plane. The storage engine does the work;
// this package only adapts it to the wire and maps errors in one place.
package node
