// Package grpcmem is the buffer pool of every gRPC server, client and
// codec in an Ursula process: grpc-go's tiered pool, without the zeroing.
//
// grpc-go zeroes every buffer its default pool hands out, so that code
// reading a buffer before writing it cannot see another call's bytes. In
// grpc-go itself no such reader exists: the codec marshals a message of
// exactly the buffer's length into it, the transport fills frame buffers
// with io.ReadFull, and materializing a received message copies its whole
// length. The zeroing is then pure cost, and a large one for reads: a
// 200 KiB ReadResponse took a buffer from the 1 MiB tier and cleared all
// of it, on the node that marshalled it and again on the gateway that
// received it (18 % of a node's CPU under the replay benchmark). Ursula
// hands no pooled buffer to code of its own, so the pool skips the clear.
//
// Install replaces grpc-go's default pool; the services call it once,
// first thing in app.Main, before any server or connection exists.
package grpcmem
