package httpserver

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// meter is a request body that hands out its data in reads of at most
// step bytes, recording the budget in use at each read, and then fails
// with end (io.EOF for a complete body).
type meter struct {
	data   []byte
	step   int
	end    error
	budget *Budget
	inUse  []int64
}

func (m *meter) Read(p []byte) (int, error) {
	m.inUse = append(m.inUse, m.budget.InUse())
	if len(m.data) == 0 {
		return 0, m.end
	}
	n := copy(p[:min(len(p), m.step)], m.data)
	m.data = m.data[n:]
	return n, nil
}

func (m *meter) Close() error { return nil }

func request(body io.ReadCloser, contentLength int64) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
	r.Body, r.ContentLength = body, contentLength
	return r
}

// TestReadBodyAnnouncedNotSent: a body announced at 32 MiB of which 10
// bytes arrived before the client stalled holds one 64 KiB piece of the
// budget, never the announced size, and gives it back on the error.
func TestReadBodyAnnouncedNotSent(t *testing.T) {
	budget := NewBudget(64 << 20)
	m := &meter{data: []byte("0123456789"), step: 10, end: ErrBodyStalled, budget: budget}
	_, err := ReadBody(request(m, 32<<20), 32<<20, budget)
	if !errors.Is(err, ErrBodyStalled) {
		t.Fatalf("err %v, want ErrBodyStalled", err)
	}
	for i, n := range m.inUse {
		if n > bodyPiece {
			t.Fatalf("read %d: %d bytes of the budget in use for 10 bytes received", i, n)
		}
	}
	if budget.InUse() != 0 {
		t.Fatalf("budget in use %d after the failed read", budget.InUse())
	}
}

// TestReadBodyGrowsAsBytesArrive: a complete body is read exactly; the
// budget taken grows with what arrived (never more than twice of it, plus
// the first piece), ends at the declared length, and Release gives it all
// back.
func TestReadBodyGrowsAsBytesArrive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		size     int
		declared bool
	}{
		{"declared", 5<<20 + 3, true},
		{"chunked", 5<<20 + 3, false},
		{"small declared", 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budget := NewBudget(64 << 20)
			data := bytes.Repeat([]byte("abcdefg"), tc.size/7+1)[:tc.size]
			m := &meter{data: data, step: 32 << 10, end: io.EOF, budget: budget}
			cl := int64(-1)
			if tc.declared {
				cl = int64(tc.size)
			}
			b, err := ReadBody(request(m, cl), 32<<20, budget)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Bytes(), data) {
				t.Fatalf("read %d bytes, want %d", len(b.Bytes()), len(data))
			}
			received := 0
			for i, n := range m.inUse {
				// Before read i, at most i*step bytes had arrived; a
				// doubling from there plus the first piece is the most
				// that may be taken.
				if n > int64(2*received+bodyPiece) {
					t.Fatalf("read %d: %d bytes taken after %d received", i, n, received)
				}
				received = min(received+m.step, tc.size)
			}
			if tc.declared && budget.InUse() != int64(tc.size) {
				t.Fatalf("budget in use %d, want the declared %d", budget.InUse(), tc.size)
			}
			b.Release()
			b.Release()
			if budget.InUse() != 0 {
				t.Fatalf("budget in use %d after Release", budget.InUse())
			}
		})
	}
}

// TestReadBodyLimits: a declared length above the limit is refused before
// any read; an undeclared body is cut when it passes the limit; a body
// exactly at the limit is accepted.
func TestReadBodyLimits(t *testing.T) {
	budget := NewBudget(0)
	var tooLarge *BodyTooLargeError
	m := &meter{data: make([]byte, 10), step: 10, end: io.EOF, budget: budget}
	if _, err := ReadBody(request(m, 1001), 1000, budget); !errors.As(err, &tooLarge) || tooLarge.Declared != 1001 || len(m.inUse) != 0 {
		t.Fatalf("declared above the limit: %v after %d reads", err, len(m.inUse))
	}
	m = &meter{data: make([]byte, 1001), step: 100, end: io.EOF, budget: budget}
	if _, err := ReadBody(request(m, -1), 1000, budget); !errors.As(err, &tooLarge) || tooLarge.Declared != -1 {
		t.Fatalf("undeclared above the limit: %v", err)
	}
	m = &meter{data: make([]byte, 1000), step: 100, end: io.EOF, budget: budget}
	if b, err := ReadBody(request(m, -1), 1000, budget); err != nil || len(b.Bytes()) != 1000 {
		t.Fatalf("at the limit: %d bytes, %v", len(b.Bytes()), err)
	} else {
		b.Release()
	}
	if b, err := ReadBody(request(http.NoBody, 0), 1000, budget); err != nil || b != nil || b.Bytes() != nil {
		t.Fatalf("empty body: %v, %v", b, err)
	}
	if budget.InUse() != 0 || budget.Limit() != DefaultInflightBodyBytes {
		t.Fatalf("budget %d of %d", budget.InUse(), budget.Limit())
	}
}

// TestReadBodyBudgetExhausted: a body whose next piece the budget cannot
// hold fails with ErrBudgetExhausted and gives back what it held; the
// refusal is counted; once the holder releases, the same body is read.
func TestReadBodyBudgetExhausted(t *testing.T) {
	budget := NewBudget(1 << 20)
	held, err := ReadBody(request(io.NopCloser(strings.NewReader(strings.Repeat("x", 900<<10))), 900<<10), 1<<20, budget)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("y", 300<<10)
	if _, err := ReadBody(request(io.NopCloser(strings.NewReader(body)), -1), 1<<20, budget); !errors.Is(err, ErrBudgetExhausted) {
		t.Fatalf("err %v, want ErrBudgetExhausted", err)
	}
	if budget.InUse() != 900<<10 || budget.Refusals() != 1 {
		t.Fatalf("in use %d, refusals %d", budget.InUse(), budget.Refusals())
	}
	held.Release()
	b, err := ReadBody(request(io.NopCloser(strings.NewReader(body)), -1), 1<<20, budget)
	if err != nil || string(b.Bytes()) != body {
		t.Fatalf("after release: %v", err)
	}
	b.Release()
	if budget.InUse() != 0 {
		t.Fatalf("in use %d", budget.InUse())
	}
}
