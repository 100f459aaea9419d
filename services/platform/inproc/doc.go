// Package inproc is an in-process gRPC connection: a Server on which
// generated Register*Server functions register services and through which
// generated New*Client clients call them, with no network and no
// marshalling, while the server side runs what a grpc.Server runs: its
// interceptors and stats handlers, with the same events in the same order.
//
// # Why
//
// The all-in-one binary runs the gateway and the node in one process. Through
// an inproc.Server the gateway calls the node with the same generated
// clients it uses in a split deployment, so there is one code path for both
// deployments; and because the client and server stats handlers (otelgrpc)
// see a call exactly as they would over the network, traces and metrics look
// the same: a client span, and a server span that is its child.
//
// # The no-copy contract
//
// A unary method runs on the caller's goroutine and receives the caller's
// request object itself; its response is shallow-copied (one struct copy,
// by reflection) into the reply the generated client allocated. A stream
// passes message objects through a bounded channel and RecvMsg
// shallow-copies each into the receiver's message. So:
//
//   - a caller must not modify a request after passing it (the handler may
//     keep it, and shares everything it points to);
//   - a handler must not modify a response after returning it (returning
//     one shared, unchanging response to many calls is fine);
//   - neither side of a stream may modify a message after SendMsg, nor send
//     one message object on several streams at once: the receiver's copy
//     shares the sender's nested messages, slices and maps. Over a network
//     SendMsg marshals before it returns, so code that reuses a message for
//     the next SendMsg is correct there and wrong here.
//
// # A call, step by step
//
// The client stats handler tags the call on the caller's context and sees
// Begin, OutHeader and OutPayload. The caller's outgoing metadata, including
// what that handler injected (otelgrpc's traceparent), becomes the handler's
// incoming metadata; the server stats handler tags the call and sees
// InHeader, Begin, InPayload, OutHeader, OutPayload, OutTrailer and End, in
// grpc.Server's order; then the client handler sees InHeader, InPayload,
// InTrailer and End. Payload sizes are proto.Size of the message (the
// WireLength adds grpc's 5-byte frame prefix), as an uncompressed network
// hop reports them; a message that is not a protobuf message counts 0.
//
// The handler's context takes the caller's deadline and cancellation and
// nothing else of the caller's context: no values, no outgoing metadata;
// just what crosses a network. It carries the incoming metadata, a
// peer.Peer whose addresses are Addr ("inproc" network), a
// grpc.ServerTransportStream (so grpc.SetHeader, SendHeader, SetTrailer
// and grpc.Method work, for unary and streaming calls alike) and the values
// the server stats handler's TagConn and TagRPC added. It ends when the
// caller's context ends or the call ends.
//
// Errors reach the caller as they would from a grpc.Server: a status error
// keeps its code, message and details, a context error becomes Canceled or
// DeadlineExceeded, any other error Unknown with its text; an unknown
// service or method is Unimplemented with grpc's message. The caller gets a
// new error built from the status, not the handler's error value.
// grpc.Header, grpc.Trailer, grpc.Peer and grpc.OnFinish call options are
// honoured.
//
// # What differs from a network hop
//
//   - No message size limits, no compression, no wire errors (Unavailable,
//     connection resets), no retries, no keepalive; call options about them
//     are ignored.
//   - No marshalling, hence the contract above. A message of the wrong Go
//     type fails with Internal where protobuf decoding might have accepted
//     it.
//   - Metadata holds only what the caller and the handler set: none of the
//     transport's own headers (:authority, content-type, user-agent).
//   - A unary call waits for its handler even if the caller's context ends
//     first (it then fails with the context's status); handlers must honour
//     their context. A handler panic is not recovered, as in grpc: in a
//     unary call it unwinds into the caller, in a stream it ends the
//     process.
//   - The server's End event comes before the caller's call returns, not
//     possibly after; a streaming caller's InHeader comes when it first
//     looks (Header or RecvMsg), not when the header is sent.
//   - Stats handlers see ConnBegin once, when the Server is made, and never
//     ConnEnd.
//   - Services may be registered after calls have started.
package inproc
