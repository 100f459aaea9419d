// Package listenmux serves gRPC and plain HTTP/1 on one listener, as the
// node's client plane does: a connection that opens with the HTTP/2 client
// preface goes to the gRPC server, anything else to the HTTP server.
package listenmux
