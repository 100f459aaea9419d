package httpserver

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// Request-body budget defaults and bounds.
const (
	// DefaultInflightBodyBytes is the default budget of request-body bytes
	// a process holds in memory at once (server.http_inflight_body_size).
	DefaultInflightBodyBytes = 128 << 20
	// MinInflightBodyBytesColdBackend is the least budget of a node with a
	// cold backend: two of the largest bodies a gateway accepts.
	MinInflightBodyBytesColdBackend = 64 << 20
	// MaxRequestBodyBytes is the largest request-body limit a gateway may
	// be configured with; larger snapshots go up in parts.
	MaxRequestBodyBytes = 32 << 20
	// bodyPiece is the first allocation for a body; the buffer then
	// doubles as bytes arrive.
	bodyPiece = 64 << 10
)

// ErrBudgetExhausted is returned by ReadBody when the process's in-flight
// request-body budget cannot hold the next piece of a body.
var ErrBudgetExhausted = errors.New("httpserver: the in-flight request-body budget is exhausted")

// BodyTooLargeError is returned by ReadBody for a body above its limit.
type BodyTooLargeError struct {
	// Limit is the largest body accepted.
	Limit int64
	// Declared is the body's Content-Length, -1 when it was not declared
	// (the body was cut when it passed the limit).
	Declared int64
}

func (e *BodyTooLargeError) Error() string {
	if e.Declared >= 0 {
		return fmt.Sprintf("request body of %d bytes exceeds %d", e.Declared, e.Limit)
	}
	return fmt.Sprintf("request body exceeds %d bytes", e.Limit)
}

// Budget is a process-wide budget of request-body bytes held in memory.
// Its methods are safe for concurrent use.
type Budget struct {
	limit   int64
	used    atomic.Int64
	refused atomic.Uint64
}

// NewBudget returns a budget of limit bytes (DefaultInflightBodyBytes when
// limit <= 0).
func NewBudget(limit int64) *Budget {
	if limit <= 0 {
		limit = DefaultInflightBodyBytes
	}
	return &Budget{limit: limit}
}

// TryAcquire takes n bytes of the budget if they are free and reports
// whether it did; a refusal is counted.
func (b *Budget) TryAcquire(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.limit {
			b.refused.Add(1)
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// Release gives n bytes back.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// InUse is the number of bytes taken now.
func (b *Budget) InUse() int64 { return b.used.Load() }

// Refusals counts the pieces of bodies the budget could not hold.
func (b *Budget) Refusals() uint64 { return b.refused.Load() }

// Body is a request body held in memory under a Budget. A nil *Body is
// an empty body.
type Body struct {
	buf    []byte
	held   int64
	budget *Budget
}

// Bytes returns the body.
func (b *Body) Bytes() []byte {
	if b == nil {
		return nil
	}
	return b.buf
}

// Release gives the body's bytes back to the budget; call it once the
// request no longer needs them. It is idempotent.
func (b *Body) Release() {
	if b == nil || b.held == 0 {
		return
	}
	b.budget.Release(b.held)
	b.held = 0
}

// ReadBody reads r's body into memory, at most limit bytes. A declared
// Content-Length above limit is refused before anything is read. Nothing is
// allocated from the declared length: the buffer starts at 64 KiB (or the
// declared length, when smaller) and doubles as bytes arrive, never past
// the declared length, and every allocation is taken from budget first; a
// piece the budget cannot hold ends the read with ErrBudgetExhausted, so a
// client that announces a large body and sends nothing costs nothing, and
// the bodies of every request together stay within the budget. The caller
// releases the returned Body once done with its bytes. An empty body is a
// nil *Body.
//
// Errors: *BodyTooLargeError, ErrBudgetExhausted, an error matching
// ErrBodyStalled (from the body's progress deadline, see Handler), or the
// body's own read error.
func ReadBody(r *http.Request, limit int64, budget *Budget) (*Body, error) {
	if r.ContentLength > limit {
		return nil, &BodyTooLargeError{Limit: limit, Declared: r.ContentLength}
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	want := limit // the most the buffer may have to hold
	if r.ContentLength > 0 {
		want = r.ContentLength
	}
	b := &Body{budget: budget}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= want {
				// Full: the body must end here.
				var probe [1]byte
				n, err := r.Body.Read(probe[:])
				if n > 0 {
					b.Release()
					return nil, &BodyTooLargeError{Limit: limit, Declared: -1}
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Release()
					return nil, err
				}
				continue
			}
			// The budget counts the buffer a body holds; the one it
			// outgrew is garbage once copied.
			size := min(max(int64(cap(buf))*2, bodyPiece), want)
			if !budget.TryAcquire(size - int64(cap(buf))) {
				b.Release()
				return nil, ErrBudgetExhausted
			}
			b.held = size
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Release()
			return nil, err
		}
	}
	if len(buf) == 0 {
		b.Release()
		return nil, nil
	}
	b.buf = buf
	return b, nil
}
