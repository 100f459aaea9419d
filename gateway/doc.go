// Package gateway is ursula-gateway: the stateless HTTP front that serves the
// Durable Streams protocol and Ursula's bucket/stream URL family, and reaches
// storage nodes only through the StreamService gRPC client.
//
// # URL families
//
//   - The Durable Streams family at Config.StreamRoot (default "/v1/stream/"):
//     the rest of the path, slashes included, is the stream id in the
//     built-in bucket "__ds". Paths under "<root>__ds/" are reserved for the
//     subscription APIs and go to Config.Subscriptions.
//   - Ursula's family: PUT /{bucket} creates a bucket, and /{bucket}/{stream}
//     (a stream id without "/") serves the same operations as family 1.
//   - /__ursula/ready, /__ursula/metrics and /__ursula/prometheus (the
//     process's metrics in the Prometheus text format, when
//     Config.Prometheus is set) are the gateway's own.
//
// # Request mapping
//
// PUT → CreateStream, POST → Append, GET → Read (catch-up, long-poll with
// wait_ms) or Subscribe (SSE), HEAD → Head, DELETE → DeleteStream. Protocol
// headers are validated here (so a node never sees malformed input), domain
// errors come back as gRPC statuses and are turned into HTTP by the single
// table in errors.go. Every response carries X-Content-Type-Options: nosniff,
// Cross-Origin-Resource-Policy and the CORS headers.
//
// # Wire formats produced here
//
// JSON streams are stored by the node as one compact JSON value per line; the
// gateway serves them as one JSON array ("[]" when empty). SSE events are
// framed as "event: data\n" followed by one "data:<line>\n" per payload line
// (text split on CRLF, CR and LF; binary streams base64-encoded with
// Stream-SSE-Data-Encoding: base64) and a blank line; every data event is
// followed by a control event whose data is a flat JSON object
// {"streamNextOffset", "streamCursor" | "streamClosed", "upToDate"}.
//
// # Live reads
//
// SSE: a connection reads history itself (Read) until it is up to date,
// then follows its stream's hub, the gateway's one upstream Subscribe per
// stream (and incarnation), shared by every SSE connection of that stream.
// The hub encodes each chunk once (data and control event bytes) and keeps
// the events its slowest connection has not taken, plus a few recent ones,
// within fixed bounds. A connection that falls behind what the hub retains
// reads again itself and rejoins: it never loses events and never holds up
// the others. A caught-up connection whose socket has room (its unacked
// send queue, read with SIOCOUTQ on Linux, is small) is written by one of
// the hub's writer goroutines instead of waking its own goroutine for every
// event; a writer hands the connection back to its own goroutine whenever a
// write could block. Control events carry the cursor of the moment the hub
// encoded them, or the connection's own when the client's cursor is ahead.
//
// Long-poll reads are Read calls with wait_ms.
//
// # Tracing
//
// Every request gets a server span, named "<method> <route template>"
// ("POST /v1/stream/{stream...}", "PUT /{bucket}/{stream}"), a child of the
// span in an incoming W3C traceparent header; it records the method, the
// route, the bucket and the status (5xx marks it failed), never the path's
// stream name or the body. The request's context carries the span to the
// StreamService client, whose otelgrpc client handler (gateway/upstream,
// or the in-process connection of services/platform/inproc) makes the
// node's spans its children.
//
// ETags have the form "<incarnation>:<start offset>:<next offset>[:c]" where
// ":c" marks a read that reached the final offset of a closed stream.
package gateway
