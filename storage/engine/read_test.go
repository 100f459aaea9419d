package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

func TestReadPagination(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("bin")})
	for _, b := range []string{"aaa", "bbbb", "cc"} {
		mustAppend(t, e, "bin", DefaultContentType, b)
	}
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("big")})
	mustAppend(t, e, "big", DefaultContentType, "0123456789")
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("json"), ContentType: "application/json"})
	mustAppend(t, e, "json", "application/json", `[1, 22, 333]`) // "1\n22\n333\n", one append
	mustAppend(t, e, "json", "application/json", `4444`)         // "4444\n"
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("text"), ContentType: "text/plain"})
	mustAppend(t, e, "text", "text/plain", "héllo")

	tests := []struct {
		name         string
		stream       string
		offset       string
		maxBytes     uint64
		wantData     string
		wantNext     uint64
		wantUpToDate bool
	}{
		{"whole stream", "bin", "-1", 0, "aaabbbbcc", 9, true},
		{"cut on the last append boundary", "bin", "-1", 5, "aaa", 3, false},
		{"two appends fit", "bin", "-1", 7, "aaabbbb", 7, false},
		{"next page", "bin", off(3), 5, "bbbb", 7, false},
		{"last page", "bin", off(7), 5, "cc", 9, true},
		{"mid-append offset ends on the append boundary", "bin", off(1), 4, "aa", 3, false},
		{"at the tail", "bin", off(9), 5, "", 9, true},
		{"now", "bin", "now", 0, "", 9, true},
		{"one append larger than the limit is cut at the byte", "big", "-1", 4, "0123", 4, false},
		{"json: cut at a message boundary inside an append", "json", "-1", 4, "1\n", 2, false},
		{"json: next messages", "json", off(2), 7, "22\n333\n", 9, false},
		{"json: a message larger than the limit comes whole", "json", off(5), 1, "333\n", 9, false},
		{"json: append boundary", "json", off(9), 100, "4444\n", 14, true},
		{"text: never splits a rune", "text", "-1", 2, "h", 1, false},
		{"text: rest", "text", off(1), 100, "éllo", 6, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(tc.stream), Offset: tc.offset, MaxBytes: tc.maxBytes})
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if string(r.GetData()) != tc.wantData || r.GetNextOffset() != off(tc.wantNext) || r.GetUpToDate() != tc.wantUpToDate {
				t.Fatalf("Read = (%q, next %s, up to date %v), want (%q, %s, %v)",
					r.GetData(), r.GetNextOffset(), r.GetUpToDate(), tc.wantData, off(tc.wantNext), tc.wantUpToDate)
			}
		})
	}
	t.Run("page through with next offsets", func(t *testing.T) {
		var got []byte
		pos := stream.OffsetStart
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("pagination does not end")
			}
			r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("json"), Offset: pos, MaxBytes: 3})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r.GetData()...)
			pos = r.GetNextOffset()
			if r.GetUpToDate() {
				break
			}
		}
		if string(got) != "1\n22\n333\n4444\n" {
			t.Fatalf("paged read = %q", got)
		}
	})
}

func TestReadOffsetErrors(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), HasBody: true, Body: []byte("12345")})
	tests := []struct {
		name   string
		offset string
		want   *fault.Kind
	}{
		{"letters", "abc", fault.ErrInvalidArgument},
		{"no position", "1_", fault.ErrInvalidArgument},
		{"no sequence", "_1", fault.ErrInvalidArgument},
		{"two separators", "1_2_3", fault.ErrInvalidArgument},
		{"negative other than -1", "-2", fault.ErrInvalidArgument},
		{"sign inside", "0_-1", fault.ErrInvalidArgument},
		{"too many sequence digits", "00000000000000000000_0", fault.ErrInvalidArgument},
		{"position overflows", "0_99999999999999999999", fault.ErrInvalidArgument},
		{"beyond the tail", off(6), fault.ErrOffsetOutOfRange},
		{"start", "-1", nil},
		{"empty means start", "", nil},
		{"short form", "0_5", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("s"), Offset: tc.offset})
			wantCode(t, "Read", err, tc.want)
			err = e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("s"), Offset: tc.offset}, func(*streamv1.ReadResponse) error {
				return errStopSubscribe
			})
			if tc.want == nil {
				if !errors.Is(err, errStopSubscribe) {
					t.Fatalf("Subscribe: %v, want the first chunk", err)
				}
				return
			}
			wantCode(t, "Subscribe", err, tc.want)
		})
	}
}

var errStopSubscribe = errors.New("test: stop subscribing")

func TestLongPoll(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("lp"), HasBody: true, Body: []byte("ab")})
	tail := off(2)

	t.Run("data at the offset answers at once", func(t *testing.T) {
		start := time.Now()
		r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("lp"), Offset: off(0), WaitMs: 5000})
		if err != nil || string(r.GetData()) != "ab" || time.Since(start) > 2*time.Second {
			t.Fatalf("Read = %v, %v after %v", r, err, time.Since(start))
		}
	})
	t.Run("times out", func(t *testing.T) {
		start := time.Now()
		r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("lp"), Offset: tail, WaitMs: 150})
		if err != nil {
			t.Fatal(err)
		}
		if !r.GetTimedOut() || len(r.GetData()) != 0 || !r.GetUpToDate() || r.GetNextOffset() != tail {
			t.Fatalf("Read = %v, want an empty timed-out answer at the tail", r)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Fatalf("returned after %v, before the wait", d)
		}
	})
	t.Run("wakes on append", func(t *testing.T) {
		type answer struct {
			r   *streamv1.ReadResponse
			err error
		}
		got := make(chan answer, 1)
		go func() {
			r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("lp"), Offset: tail, WaitMs: 10000})
			got <- answer{r, err}
		}()
		time.Sleep(100 * time.Millisecond) // pacing: lets the read start waiting; the outcome is the same either way
		mustAppend(t, e, "lp", DefaultContentType, "cd")
		select {
		case a := <-got:
			if a.err != nil || string(a.r.GetData()) != "cd" || a.r.GetTimedOut() || a.r.GetNextOffset() != off(4) {
				t.Fatalf("Read = %v, %v", a.r, a.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("long poll did not wake on append")
		}
	})
	t.Run("wakes on close", func(t *testing.T) {
		got := make(chan *streamv1.ReadResponse, 1)
		go func() {
			r, _ := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("lp"), Offset: off(4), WaitMs: 10000})
			got <- r
		}()
		time.Sleep(100 * time.Millisecond) // pacing: lets the read start waiting; the outcome is the same either way
		if _, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("lp"), Close: true}); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if !r.GetClosed() || r.GetTimedOut() {
				t.Fatalf("Read = %v, want closed", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("long poll did not wake on close")
		}
	})
	t.Run("ends with its context", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("lp2")})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := e.Read(ctx, &streamv1.ReadRequest{Ref: ref("lp2"), Offset: "now", WaitMs: 10000})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Read = %v, want the context's error", err)
		}
	})
	t.Run("wakes with an error on delete", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("lp3")})
		got := make(chan error, 1)
		go func() {
			_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("lp3"), Offset: "now", WaitMs: 10000})
			got <- err
		}()
		time.Sleep(100 * time.Millisecond) // pacing: lets the read start waiting; the outcome is the same either way
		if _, err := e.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: ref("lp3")}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			wantCode(t, "Read", err, fault.ErrStreamNotFound)
		case <-time.After(5 * time.Second):
			t.Fatal("long poll did not wake on delete")
		}
	})
}

// subscription runs Subscribe in a goroutine and collects its chunks.
type subscription struct {
	chunks chan *streamv1.ReadResponse
	done   chan error
	cancel context.CancelFunc
}

func subscribe(tb testing.TB, e *testEngine, req *streamv1.SubscribeRequest) *subscription {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	s := &subscription{chunks: make(chan *streamv1.ReadResponse, 64), done: make(chan error, 1), cancel: cancel}
	go func() {
		s.done <- e.Subscribe(ctx, req, func(r *streamv1.ReadResponse) error {
			s.chunks <- r
			return nil
		})
	}()
	tb.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// next returns the next chunk. Chunks sent before Subscribe returned come
// first, whichever channel is ready.
func (s *subscription) next(tb testing.TB) *streamv1.ReadResponse {
	tb.Helper()
	select {
	case r := <-s.chunks:
		return r
	case err := <-s.done:
		s.done <- err // for end and the cleanup
		select {
		case r := <-s.chunks:
			return r
		default:
		}
		tb.Fatalf("subscription ended early: %v", err)
	case <-time.After(5 * time.Second):
		tb.Fatal("no chunk within 5s")
	}
	return nil
}

// end waits for Subscribe to return, with no chunk left unread.
func (s *subscription) end(tb testing.TB) error {
	tb.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		select {
		case r := <-s.chunks:
			tb.Fatalf("unexpected chunk %v", r)
		default:
		}
		return err
	case r := <-s.chunks:
		tb.Fatalf("unexpected chunk %v", r)
	case <-time.After(5 * time.Second):
		tb.Fatal("subscription did not end within 5s")
	}
	return nil
}

func TestSubscribe(t *testing.T) {
	e := startEngine(t, nil)

	t.Run("catch-up, live, then end after close", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("sub"), HasBody: true, Body: []byte("aaa")})
		mustAppend(t, e, "sub", DefaultContentType, "bbb")
		mustAppend(t, e, "sub", DefaultContentType, "ccc")
		s := subscribe(t, e, &streamv1.SubscribeRequest{Ref: ref("sub"), Offset: "-1", MaxBytes: 4})
		// Catch-up in pages of at most 4 bytes, cut on append boundaries.
		for i, want := range []string{"aaa", "bbb", "ccc"} {
			r := s.next(t)
			if string(r.GetData()) != want || r.GetUpToDate() != (i == 2) {
				t.Fatalf("catch-up chunk %d = %q (up to date %v), want %q", i, r.GetData(), r.GetUpToDate(), want)
			}
		}
		mustAppend(t, e, "sub", DefaultContentType, "dd")
		if r := s.next(t); string(r.GetData()) != "dd" || r.GetStartOffset() != off(9) || r.GetNextOffset() != off(11) {
			t.Fatalf("live chunk = %v", r)
		}
		if _, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("sub"), ContentType: DefaultContentType, Body: []byte("e"), Close: true}); err != nil {
			t.Fatal(err)
		}
		r := s.next(t)
		if string(r.GetData()) != "e" || !r.GetClosed() {
			t.Fatalf("final chunk = %v, want the closing append", r)
		}
		if err := s.end(t); err != nil {
			t.Fatalf("Subscribe after close = %v, want nil", err)
		}
	})
	t.Run("empty stream announces its tail", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("empty")})
		s := subscribe(t, e, &streamv1.SubscribeRequest{Ref: ref("empty"), Offset: "now"})
		r := s.next(t)
		if len(r.GetData()) != 0 || !r.GetUpToDate() || r.GetNextOffset() != off(0) {
			t.Fatalf("first chunk = %v, want an empty up-to-date chunk", r)
		}
		mustAppend(t, e, "empty", DefaultContentType, "x")
		if r := s.next(t); string(r.GetData()) != "x" {
			t.Fatalf("live chunk = %v", r)
		}
	})
	t.Run("closed stream sends one final chunk", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("closed"), Closed: true, HasBody: true, Body: []byte("zz")})
		s := subscribe(t, e, &streamv1.SubscribeRequest{Ref: ref("closed")})
		if r := s.next(t); string(r.GetData()) != "zz" || !r.GetClosed() {
			t.Fatalf("chunk = %v", r)
		}
		if err := s.end(t); err != nil {
			t.Fatalf("Subscribe = %v", err)
		}
	})
	t.Run("ends on delete", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("del")})
		s := subscribe(t, e, &streamv1.SubscribeRequest{Ref: ref("del")})
		s.next(t)
		if _, err := e.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: ref("del")}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "Subscribe", s.end(t), fault.ErrStreamNotFound)
	})
	t.Run("ends with its context", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("ctx")})
		s := subscribe(t, e, &streamv1.SubscribeRequest{Ref: ref("ctx")})
		s.next(t)
		s.cancel()
		if err := s.end(t); !errors.Is(err, context.Canceled) {
			t.Fatalf("Subscribe = %v, want context.Canceled", err)
		}
	})
	t.Run("send error ends it", func(t *testing.T) {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("senderr"), HasBody: true, Body: []byte("x")})
		err := e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("senderr")}, func(*streamv1.ReadResponse) error { return errStopSubscribe })
		if !errors.Is(err, errStopSubscribe) {
			t.Fatalf("Subscribe = %v", err)
		}
	})
	t.Run("missing stream", func(t *testing.T) {
		err := e.Subscribe(t.Context(), &streamv1.SubscribeRequest{Ref: ref("nope")}, func(*streamv1.ReadResponse) error { return nil })
		wantCode(t, "Subscribe", err, fault.ErrStreamNotFound)
	})
}
