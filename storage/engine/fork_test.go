package engine

import (
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
)

func forkReq(name, source, offset string, sub uint64) *streamv1.CreateStreamRequest {
	return &streamv1.CreateStreamRequest{Ref: ref(name), Fork: &streamv1.ForkSpec{Source: ref(source), Offset: offset, SubOffset: sub}}
}

// forkRefs is the reference count of a stream on this replica.
func forkRefs(tb testing.TB, e *testEngine, name string) uint64 {
	tb.Helper()
	m, ok := e.machine(key(name)).Lookup(key(name))
	if !ok {
		tb.Fatalf("stream %s does not exist", name)
	}
	return m.ForkRefs
}

func exists(e *testEngine, name string) bool {
	_, ok := e.machine(key(name)).Lookup(key(name))
	return ok
}

func TestForkCreate(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("src"), ContentType: "text/plain", HasBody: true, Body: []byte("hello")})
	mustAppend(t, e, "src", "text/plain", "world")
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("jsrc"), ContentType: "application/json", HasBody: true, Body: []byte(`[1, 2, 3]`)})
	mustAppend(t, e, "jsrc", "application/json", `[4, 5]`)

	tests := []struct {
		name     string
		req      *streamv1.CreateStreamRequest
		wantCode *fault.Kind
		wantData string // the fork's view right after creation
		wantType string
	}{
		{"default offset is the source tail", forkReq("f-tail", "src", "", 0), nil, "helloworld", "text/plain"},
		{"explicit offset", forkReq("f-5", "src", off(5), 0), nil, "hello", "text/plain"},
		{"start", forkReq("f-start", "src", "-1", 0), nil, "", "text/plain"},
		{"now", forkReq("f-now", "src", "now", 0), nil, "helloworld", "text/plain"},
		{"byte sub-offset", forkReq("f-sub", "src", off(5), 3), nil, "hellowor", "text/plain"},
		{"whole next append as sub-offset", forkReq("f-sub5", "src", off(5), 5), nil, "helloworld", "text/plain"},
		{"json sub-offset counts messages", forkReq("j-sub", "jsrc", off(0), 2), nil, "1\n2\n", "application/json"},
		{"json sub-offset in a later append", forkReq("j-sub2", "jsrc", off(6), 1), nil, "1\n2\n3\n4\n", "application/json"},
		{"same content type is accepted", &streamv1.CreateStreamRequest{Ref: ref("f-ct"), ContentType: "text/plain; charset=utf-8", Fork: &streamv1.ForkSpec{Source: ref("src")}}, nil, "helloworld", "text/plain; charset=utf-8"},
		{"sub-offset past the append", forkReq("bad-sub", "src", off(5), 6), fault.ErrInvalidArgument, "", ""},
		{"json sub-offset past the append", forkReq("bad-jsub", "jsrc", off(0), 4), fault.ErrInvalidArgument, "", ""},
		{"sub-offset needs an offset", forkReq("bad-sub2", "src", "", 1), fault.ErrInvalidArgument, "", ""},
		{"offset beyond the tail", forkReq("bad-off", "src", off(11), 0), fault.ErrOffsetOutOfRange, "", ""},
		{"malformed offset", forkReq("bad-off2", "src", "x", 0), fault.ErrInvalidArgument, "", ""},
		{"missing source", forkReq("bad-src", "nope", "", 0), fault.ErrStreamNotFound, "", ""},
		{"content type mismatch", &streamv1.CreateStreamRequest{Ref: ref("bad-ct"), ContentType: "application/json", Fork: &streamv1.ForkSpec{Source: ref("src")}}, fault.ErrContentTypeMismatch, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.req.GetFork().GetSource().GetStream()
			var before uint64
			if exists(e, src) {
				before = forkRefs(t, e, src)
			}
			resp, err := e.CreateStream(t.Context(), tc.req)
			wantCode(t, "CreateStream", err, tc.wantCode)
			if err != nil {
				if exists(e, tc.req.GetRef().GetStream()) {
					t.Fatal("a failed fork create left the fork behind")
				}
				if exists(e, src) && forkRefs(t, e, src) != before {
					t.Fatalf("a failed fork create changed the source's references: %d → %d", before, forkRefs(t, e, src))
				}
				return
			}
			if !resp.GetCreated() || resp.GetInfo().GetContentType() != tc.wantType {
				t.Fatalf("created %v, content type %q", resp.GetCreated(), resp.GetInfo().GetContentType())
			}
			if got := readAll(t, e, tc.req.GetRef().GetStream()); got != tc.wantData {
				t.Fatalf("fork reads %q, want %q", got, tc.wantData)
			}
			if got := forkRefs(t, e, src); got != before+1 {
				t.Fatalf("source references %d → %d, want one more", before, got)
			}
		})
	}
}

func TestForkWritesAndChains(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("src"), ContentType: "text/plain", HasBody: true, Body: []byte("abc")})
	mustCreate(t, e, forkReq("f1", "src", "", 0))

	t.Run("repeat create is idempotent and takes no second reference", func(t *testing.T) {
		r := mustCreate(t, e, forkReq("f1", "src", "", 0))
		if r.GetCreated() {
			t.Fatal("repeat create reported created")
		}
		if got := forkRefs(t, e, "src"); got != 1 {
			t.Fatalf("source references = %d, want 1", got)
		}
	})
	t.Run("conflicting repeat", func(t *testing.T) {
		_, err := e.CreateStream(t.Context(), forkReq("f1", "other", "", 0))
		wantCode(t, "CreateStream", err, fault.ErrStreamNotFound)
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("other"), ContentType: "text/plain"})
		_, err = e.CreateStream(t.Context(), forkReq("f1", "other", "", 0))
		wantCode(t, "CreateStream", err, fault.ErrStreamExists)
		if got := forkRefs(t, e, "other"); got != 0 {
			t.Fatalf("a refused fork create kept a reference on other: %d", got)
		}
	})
	t.Run("writes diverge", func(t *testing.T) {
		mustAppend(t, e, "src", "text/plain", "S")
		mustAppend(t, e, "f1", "text/plain", "F")
		if got := readAll(t, e, "src"); got != "abcS" {
			t.Fatalf("source = %q", got)
		}
		if got := readAll(t, e, "f1"); got != "abcF" {
			t.Fatalf("fork = %q", got)
		}
	})
	t.Run("fork of fork", func(t *testing.T) {
		mustCreate(t, e, forkReq("f2", "f1", off(4), 0))
		mustAppend(t, e, "f2", "text/plain", "G")
		if got := readAll(t, e, "f2"); got != "abcFG" {
			t.Fatalf("fork of fork = %q", got)
		}
		r, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("f2"), Offset: off(2), MaxBytes: 2, NoTouch: true})
		if err != nil || string(r.GetData()) != "cF" {
			t.Fatalf("read across two bases = %v, %v", r, err)
		}
		mustCreate(t, e, forkReq("f3", "f2", off(1), 0))
		if got := readAll(t, e, "f3"); got != "a" {
			t.Fatalf("fork below its source's base = %q", got)
		}
		mustCreate(t, e, forkReq("f4", "f2", off(3), 1))
		if got := readAll(t, e, "f4"); got != "abcF" {
			t.Fatalf("sub-offset through the chain = %q", got)
		}
	})
}

// TestForkDeleteCascade deletes a source with forks (soft delete, 410),
// then the forks: the last release removes the source.
func TestForkDeleteCascade(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("root"), ContentType: "text/plain", HasBody: true, Body: []byte("root")})
	mustCreate(t, e, forkReq("mid", "root", "", 0))
	mustAppend(t, e, "mid", "text/plain", "+mid")
	mustCreate(t, e, forkReq("leaf", "mid", "", 0))
	mustCreate(t, e, forkReq("side", "root", off(2), 0))

	del := func(tb testing.TB, name string) error {
		tb.Helper()
		_, err := e.DeleteStream(tb.Context(), &streamv1.DeleteStreamRequest{Ref: ref(name)})
		return err
	}
	if err := del(t, "root"); err != nil {
		t.Fatalf("delete root: %v", err)
	}
	t.Run("soft-deleted source answers gone", func(t *testing.T) {
		ops := []struct {
			name string
			op   func() error
			want *fault.Kind
		}{
			{"head", func() error { _, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("root")}); return err }, fault.ErrStreamGone},
			{"read", func() error { _, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("root")}); return err }, fault.ErrStreamGone},
			{"append", func() error {
				_, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("root"), ContentType: "text/plain", Body: []byte("x")})
				return err
			}, fault.ErrStreamGone},
			{"delete again", func() error { return del(t, "root") }, fault.ErrStreamGone},
			{"new fork", func() error { _, err := e.CreateStream(t.Context(), forkReq("late", "root", "", 0)); return err }, fault.ErrForkSourceGone},
			{"recreate", func() error {
				_, err := e.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: ref("root"), ContentType: "text/plain"})
				return err
			}, fault.ErrStreamExists},
		}
		for _, tc := range ops {
			t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.name, tc.op(), tc.want) })
		}
	})
	t.Run("forks still read the source's bytes", func(t *testing.T) {
		if got := readAll(t, e, "leaf"); got != "root+mid" {
			t.Fatalf("leaf = %q", got)
		}
		if got := readAll(t, e, "side"); got != "ro" {
			t.Fatalf("side = %q", got)
		}
	})
	steps := []struct {
		name       string
		delete     string
		wantExists map[string]bool
	}{
		{"deleting side keeps root for mid", "side", map[string]bool{"root": true, "mid": true, "leaf": true, "side": false}},
		{"deleting mid soft-deletes it for leaf", "mid", map[string]bool{"root": true, "mid": true, "leaf": true}},
		{"deleting leaf cascades to mid and root", "leaf", map[string]bool{"root": false, "mid": false, "leaf": false}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := del(t, st.delete); err != nil {
				t.Fatalf("delete %s: %v", st.delete, err)
			}
			for name, want := range st.wantExists {
				if got := exists(e, name); got != want {
					t.Errorf("%s exists = %v, want %v", name, got, want)
				}
			}
		})
	}
	t.Run("name is free again", func(t *testing.T) {
		r := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("root"), ContentType: "application/json"})
		if !r.GetCreated() {
			t.Fatal("recreate after the cascade was not a create")
		}
	})
}
