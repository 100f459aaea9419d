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
//   - /__ursula/ready and /__ursula/metrics are the gateway's own.
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
// ETags have the form "<incarnation>:<start offset>:<next offset>[:c]" where
// ":c" marks a read that reached the final offset of a closed stream.
package gateway
