// Package httpserver builds the HTTP servers of every Ursula surface — the
// gateway, a node's client-plane HTTP side, its admin plane and its
// cluster plane's HTTP side — with one set of timeouts, so that a client
// that stops sending or stops reading holds a connection, a goroutine and
// the memory of its request for a bounded time only.
//
// # Timeouts
//
// A Config has four (zero takes the default):
//
//   - read_header_timeout (10 s): reading a request's header block, from
//     the connection's accept or, on a kept-alive connection, from the
//     first byte of the next request (http.Server.ReadHeaderTimeout).
//   - body_read_timeout (30 s): a request body that makes no progress for
//     this long is cut off. It is a progress deadline, not a deadline for
//     the whole body: every read of the body extends it (through
//     http.ResponseController.SetReadDeadline), so a large upload that
//     keeps arriving slowly is never cut, and a stalled one is cut after
//     between half and all of the timeout (the deadline is moved only when
//     less than half of it is left, which saves a timer update per read).
//     It also bounds the server's own reading of a body the handler left
//     unread. A read that hits it fails with an error matching
//     ErrBodyStalled.
//   - write_timeout (30 s): a response write that makes no progress for
//     this long fails, and the connection is closed. The deadline is set
//     (http.ResponseController.SetWriteDeadline) before each write and
//     flush, and large writes go out in pieces of at most 64 KiB, each
//     with its own deadline: a long-poll or an SSE response stays open for
//     as long as its handler keeps it open, and only a write that a reader
//     does not take is cut off. A handler that sets a write deadline of its
//     own through a ResponseController keeps it until it sets the zero
//     time again (the gateway's SSE hub writers use a shorter one).
//   - idle_timeout (2 min): a kept-alive connection waiting for its next
//     request (http.Server.IdleTimeout).
//
// and max_header_bytes (64 KiB) bounds a request's header block
// (http.Server.MaxHeaderBytes).
//
// # Request bodies
//
// ReadBody reads a body into memory under a Budget, the process's budget
// of request-body bytes in flight (server.http_inflight_body_size, 128 MiB
// by default): nothing is allocated from a declared Content-Length (a
// declared length above the limit is refused before any read); the buffer
// starts at 64 KiB, or the declared length when smaller, and doubles as
// bytes arrive, never past the declared length, each growth taken from the
// budget first. A growth the budget cannot hold fails with
// ErrBudgetExhausted, which servers answer with 503 and Retry-After. The
// budget counts the buffer each body holds until its Body is released. A
// node with a cold backend needs a budget of at least
// MinInflightBodyBytesColdBackend (64 MiB, two of the largest bodies), and
// a gateway's body limit is at most MaxRequestBodyBytes (32 MiB).
//
// HTTP/1.1 deadlines are connection deadlines, which only fail I/O that is
// under way, so they are moved forward lazily; on HTTP/2 (where a deadline
// that passes resets the stream whether or not a write is under way) a
// write deadline covers one write and is cleared after it, and the read
// deadline is cleared once the body has been read.
package httpserver
