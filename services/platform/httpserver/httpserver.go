package httpserver

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"
)

// Defaults for Config.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyReadTimeout   = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
)

// writePiece bounds one write to the connection: larger writes are split,
// each piece with its own progress deadline.
const writePiece = 64 << 10

// ErrBodyStalled is matched by the error of a request-body read that made
// no progress within the body read timeout.
var ErrBodyStalled = errors.New("httpserver: the request body made no progress within the body read timeout")

// Config holds the timeouts of one HTTP server. Zero fields take the
// defaults.
type Config struct {
	// ReadHeaderTimeout bounds reading a request's header block.
	ReadHeaderTimeout time.Duration `toml:"read_header_timeout" yaml:"read_header_timeout"`
	// BodyReadTimeout cuts off a request body that makes no progress for
	// this long (between half and all of it); every read that makes
	// progress extends it.
	BodyReadTimeout time.Duration `toml:"body_read_timeout" yaml:"body_read_timeout"`
	// WriteTimeout fails a response write that makes no progress for this
	// long; it applies to each write (of at most 64 KiB) and flush, never
	// to a response as a whole, so long-polls and SSE stay open.
	WriteTimeout time.Duration `toml:"write_timeout" yaml:"write_timeout"`
	// IdleTimeout closes a kept-alive connection that waits this long for
	// its next request.
	IdleTimeout time.Duration `toml:"idle_timeout" yaml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's header block (431 above).
	MaxHeaderBytes int `toml:"max_header_bytes" yaml:"max_header_bytes"`
}

// RegisterFlags registers the timeouts on fs, each name prefixed with
// prefix (for example "gateway.http."), using the current values of c (or
// the defaults for zero fields) as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	c.ApplyDefaults()
	fs.DurationVar(&c.ReadHeaderTimeout, prefix+"read_header_timeout", c.ReadHeaderTimeout, "HTTP: time allowed to read a request's headers.")
	fs.DurationVar(&c.BodyReadTimeout, prefix+"body_read_timeout", c.BodyReadTimeout, "HTTP: a request body that makes no progress for this long is cut off.")
	fs.DurationVar(&c.WriteTimeout, prefix+"write_timeout", c.WriteTimeout, "HTTP: a response write (of at most 64 KiB) that makes no progress for this long fails and closes the connection.")
	fs.DurationVar(&c.IdleTimeout, prefix+"idle_timeout", c.IdleTimeout, "HTTP: a kept-alive connection idle this long is closed.")
	fs.IntVar(&c.MaxHeaderBytes, prefix+"max_header_bytes", c.MaxHeaderBytes, "HTTP: largest request header block in bytes.")
}

// ApplyDefaults replaces zero fields with the defaults.
func (c *Config) ApplyDefaults() {
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
}

// Validate reports negative values; name prefixes the messages (for
// example "gateway.http").
func (c Config) Validate(name string) error {
	var errs []error
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"read_header_timeout", c.ReadHeaderTimeout},
		{"body_read_timeout", c.BodyReadTimeout},
		{"write_timeout", c.WriteTimeout},
		{"idle_timeout", c.IdleTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s.%s %v must not be negative", name, d.key, d.v))
		}
	}
	if c.MaxHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("%s.max_header_bytes %d must not be negative", name, c.MaxHeaderBytes))
	}
	return errors.Join(errs...)
}

// Server returns an http.Server serving h behind Handler, with the header
// and idle timeouts and the header limit of c; errorLog may be nil.
func (c Config) Server(h http.Handler, errorLog *log.Logger) *http.Server {
	c.ApplyDefaults()
	return &http.Server{
		Handler:           c.Handler(h),
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// Handler wraps h with the body read and write progress deadlines of c.
// The response writer h sees implements Flush, FlushError, Unwrap and
// SetWriteDeadline (a deadline of the handler's own, kept until it sets the
// zero time); the request body, when there is one, extends its read
// deadline as bytes arrive.
func (c Config) Handler(h http.Handler) http.Handler {
	c.ApplyDefaults()
	return &handler{next: h, read: c.BodyReadTimeout, write: c.WriteTimeout, now: time.Now}
}

type handler struct {
	next        http.Handler
	read, write time.Duration
	now         func() time.Time // the clock deadlines are computed from
}

// exchange is what the handler adds to one request: its response writer,
// the controller both deadlines go through, and its request body. It is
// pooled: a request should not cost the wrapper an allocation.
type exchange struct {
	w    progressWriter
	ctl  http.ResponseController
	body progressBody
}

var exchangePool = sync.Pool{New: func() any { return new(exchange) }}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := exchangePool.Get().(*exchange)
	x.ctl = *http.NewResponseController(w)
	h2 := r.ProtoMajor >= 2
	x.w = progressWriter{ResponseWriter: w, rc: &x.ctl, timeout: h.write, h2: h2, now: h.now}
	body := r.Body
	if body != nil && body != http.NoBody && r.ContentLength != 0 {
		x.body = progressBody{rc: body, ctl: &x.ctl, timeout: h.read, h2: h2, now: h.now}
		// The first deadline is set now, not at the first read: it also
		// bounds the server's own reading of a body the handler leaves
		// unread (before its first response bytes, and after it returns).
		// No background read runs on an HTTP/1 connection before its
		// request body is consumed, so the deadline cannot end one.
		x.body.extend()
		// Replaced in place, as http.MaxBytesReader's documentation
		// does (the server closes and drains the body through a reference
		// of its own), and put back below: the pooled body must not stay
		// reachable from the request once the handler returned.
		r.Body = &x.body
	}
	defer func() {
		r.Body = body
		x.w.finish()
		*x = exchange{}
		exchangePool.Put(x)
	}()
	h.next.ServeHTTP(&x.w, r)
}

// progressBody is a request body whose reads extend its read deadline.
type progressBody struct {
	rc       io.ReadCloser
	ctl      *http.ResponseController
	timeout  time.Duration
	now      func() time.Time
	deadline time.Time
	h2       bool
	done     bool // EOF or an error was returned: never touch the deadline again
	off      bool // the connection has no deadlines (a test recorder)
}

// extend moves the read deadline forward when less than half of the
// timeout is left.
func (b *progressBody) extend() {
	if b.off || b.done {
		return
	}
	now := b.now()
	if b.deadline.Sub(now) >= b.timeout/2 {
		return
	}
	b.deadline = now.Add(b.timeout)
	if err := b.ctl.SetReadDeadline(b.deadline); err != nil {
		b.off = true
	}
}

func (b *progressBody) Read(p []byte) (int, error) {
	b.extend()
	n, err := b.rc.Read(p)
	if err != nil && !b.done {
		b.done = true
		// On HTTP/1 the server starts its background read at EOF and
		// clears the deadline itself; touching it afterwards would end
		// that read. On HTTP/2 the deadline is the stream's: clear it.
		if b.h2 && !b.off {
			_ = b.ctl.SetReadDeadline(time.Time{})
		}
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: %w", ErrBodyStalled, err)
	}
	return n, err
}

func (b *progressBody) Close() error { return b.rc.Close() }

// progressWriter sets a write deadline before each write and flush.
type progressWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	now      func() time.Time
	deadline time.Time
	h2       bool
	pinned   bool // the handler set a deadline of its own
	off      bool // the connection has no deadlines
}

// arm sets the deadline for a write about to start.
func (w *progressWriter) arm() {
	if w.pinned || w.off {
		return
	}
	now := w.now()
	if !w.h2 && w.deadline.Sub(now) >= w.timeout/2 {
		return
	}
	w.deadline = now.Add(w.timeout)
	if err := w.rc.SetWriteDeadline(w.deadline); err != nil {
		w.off = true
	}
}

// disarm clears an HTTP/2 stream's deadline after a write: there a
// deadline that passes resets the stream even when nothing is written.
func (w *progressWriter) disarm() {
	if w.h2 && !w.pinned && !w.off {
		w.deadline = time.Time{}
		_ = w.rc.SetWriteDeadline(time.Time{})
	}
}

// Write writes p in pieces of at most writePiece bytes, each under its own
// deadline.
func (w *progressWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return w.ResponseWriter.Write(p)
	}
	written := 0
	for len(p) > 0 {
		piece := p[:min(len(p), writePiece)]
		w.arm()
		n, err := w.ResponseWriter.Write(piece)
		w.disarm()
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// FlushError flushes under a deadline.
func (w *progressWriter) FlushError() error {
	w.arm()
	err := w.rc.Flush()
	w.disarm()
	return err
}

// Flush flushes under a deadline.
func (w *progressWriter) Flush() { _ = w.FlushError() }

// SetWriteDeadline sets a deadline of the handler's own, which replaces
// the per-write deadlines until the handler sets the zero time.
func (w *progressWriter) SetWriteDeadline(t time.Time) error {
	w.pinned = !t.IsZero()
	w.deadline = t
	return w.rc.SetWriteDeadline(t)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *progressWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish sets the deadline of the server's last flush, after the handler
// returned (HTTP/1; the server clears it afterwards).
func (w *progressWriter) finish() {
	if w.h2 || w.off {
		return
	}
	w.pinned = false
	w.arm()
}
