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
//   - /__ursula/ready, /__ursula/metrics, /__ursula/prometheus (the
//     process's metrics in the Prometheus text format, when
//     Config.Prometheus is set) and /__ursula/openapi.json are the
//     gateway's own.
//   - /__ursula/ui/ is the cluster status page (Config.StatusUI, package
//     services/platform/statuspage), served as Config.StatusPage allows:
//     "loopback" (the default) to clients on this host only, "on" to
//     everyone, "off" to nobody; its answers carry no CORS headers.
//
// openapi.yaml is the OpenAPI 3 document of both families and the
// gateway's own routes, kept by hand; `make generate` writes openapi.json
// from it, which the gateway serves at /__ursula/openapi.json.
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
// # Limits
//
// Config.HTTP holds the server's timeouts (services/platform/httpserver;
// TOML [gateway.http], flags -gateway.http.*): read_header_timeout (10 s),
// body_read_timeout (30 s: a request body that makes no progress for this
// long is cut off with 408 REQUEST_TIMEOUT, a slow upload that keeps
// arriving is not), write_timeout (30 s: a response write of at most 64
// KiB that makes no progress fails and the connection is closed; a
// long-poll or SSE response stays open as long as its reader reads),
// idle_timeout (2 min) and max_header_bytes (64 KiB). Handler leaves them
// out; Serve adds them.
//
// Request bodies (appends, creates, append batches, snapshots, staged
// parts, commits) are read in pieces charged against the process's
// in-flight request-body budget (Config.BodyBudget, set from
// server.http_inflight_body_size, 128 MiB by default) as they arrive;
// nothing is allocated from a declared Content-Length. A request whose
// next piece the budget cannot hold answers 503 OVERLOADED with
// Retry-After: 1. Each is bounded by max_body_bytes (default and most
// 32 MiB; a larger value refuses to start; larger snapshots go up in
// parts), a declared length above it answering 413 before anything is
// read. Producer-Id, Stream-Seq and Content-Type must be at most 256 bytes
// of valid UTF-8 without control characters (a tab is allowed in
// Content-Type), and stream ids valid UTF-8: 400 otherwise, since the
// node keeps them in protobuf strings.
//
// The server holds at most max_connections client connections at once
// (16384 by default; SSE and long-polls included): one accepted beyond it
// is answered 503 OVERLOADED with Retry-After: 1 before its request is
// read, and closed (services/platform/httpserver.ConnLimiter).
//
// Requests with plain HTTP/1.1 framing are served by httpserver.Lite, a
// lighter loop than net/http's; every other connection (live reads
// included) goes to net/http unread.
//
// A read's body is written in pieces (JSON arrays and record envelopes are
// rendered through a 32 KiB buffer, never whole), so a reader that does
// not read holds the read's data (usually the stored bytes themselves)
// and that buffer until the write timeout frees its connection.
//
// /__ursula/metrics reports, besides the request counters,
// requests_in_flight, inflight_body_bytes (budget in use),
// inflight_body_limit_bytes, inflight_body_refusals, connections,
// max_connections, connections_refused and heap_live_bytes
// (the process's live Go heap as of the last collection).
//
// # Wire formats produced here
//
// JSON streams are stored by the node as one compact JSON value per line; the
// gateway serves them as one JSON array ("[]" when empty). SSE events are
// framed as "event: data\n" followed by one "data:<line>\n" per payload line
// (text split on CRLF, CR and LF; binary streams base64-encoded with
// Stream-SSE-Data-Encoding: base64) and a blank line; every data event is
// followed by a control event whose data is a flat JSON object
// {"streamNextOffset", "streamCursor" | "streamClosed", "upToDate"}; for a
// JSON stream it also holds "streamFirstRecord" and "streamNextRecord"
// (numbers), the record range of the data event before it, as reads answer
// it in Stream-Record-First/Stream-Record-Next (equal without data).
//
// An SSE read starts where a plain read with the same parameters would:
// offset, or record=<n>|now or tail_records=<k> (JSON streams); the first
// read resolves the record, and the connection then goes by offset.
// max_records and record_view=envelope are refused with live=sse (400).
//
// Snapshot publish and retention take a record instead of an offset for
// JSON streams: PUT …/snapshot?record=N and PUT …/retention?record=N. A
// retention beyond the visible snapshot is 409 SNAPSHOT_CONFLICT, one at
// or below the current retention a 204 that changes nothing; its answer
// carries Stream-Retained-Offset and, for JSON streams, Stream-Record-First.
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
