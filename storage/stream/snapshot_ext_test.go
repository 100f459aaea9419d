package stream

import (
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// publish applies a PublishSnapshot through the applier's log.
func publish(t testing.TB, a *applier, now int64, c *storagev1.PublishSnapshot) *Result {
	t.Helper()
	data, err := proto.Marshal(&storagev1.Command{NowMs: now, Op: &storagev1.Command_PublishSnapshot{PublishSnapshot: c}})
	if err != nil {
		t.Fatal(err)
	}
	a.index++
	return a.applyRaw(data)
}

func snapRef(pos uint64, body string) *storagev1.SnapshotRef {
	return &storagev1.SnapshotRef{Position: pos, Digest: SnapshotDigest("application/x", []byte(body)), ContentType: "application/x",
		Key: "k/" + FormatOffset(pos) + "/" + body, Size: uint64(len(body))}
}

func TestPublishSnapshotStateMachine(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"}).Meta.Incarnation
	for _, body := range []string{"aaaa", "bbbb", "cccc"} { // records end at 4, 8, 12
		a.apply(1, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte(body)})
	}
	a.apply(1, &storagev1.SetRetention{Bucket: "b", Stream: "s", Incarnation: inc, Position: 4})
	key := Key{"b", "s"}
	first := snapRef(8, "one")
	steps := []struct {
		name    string
		cmd     *storagev1.PublishSnapshot
		code    *fault.Kind
		dup     bool
		wantPos uint64 // latest snapshot after the step (0: none)
		gc      int    // GC queue length after the step
	}{
		{"beyond the tail", &storagev1.PublishSnapshot{Snapshot: snapRef(13, "x")}, fault.ErrSnapshotConflict, false, 0, 0},
		{"below the retention", &storagev1.PublishSnapshot{Snapshot: snapRef(0, "x")}, fault.ErrOffsetTrimmed, false, 0, 0},
		{"match without a snapshot", &storagev1.PublishSnapshot{Snapshot: first, Match: "nope"}, fault.ErrSnapshotConflict, false, 0, 0},
		{"wrong incarnation", &storagev1.PublishSnapshot{Snapshot: first, Incarnation: inc + 1}, fault.ErrStreamNotFound, false, 0, 0},
		{"first", &storagev1.PublishSnapshot{Snapshot: first}, nil, false, 8, 0},
		{"same again", &storagev1.PublishSnapshot{Snapshot: snapRef(8, "one")}, nil, true, 8, 0},
		{"same again, stale match", &storagev1.PublishSnapshot{Snapshot: snapRef(8, "one"), Match: "old"}, nil, true, 8, 0},
		{"other bytes, same offset", &storagev1.PublishSnapshot{Snapshot: snapRef(8, "two")}, fault.ErrSnapshotConflict, false, 8, 0},
		{"match mismatch", &storagev1.PublishSnapshot{Snapshot: snapRef(12, "two"), Match: "nope"}, fault.ErrSnapshotConflict, false, 8, 0},
		{"replace with match", &storagev1.PublishSnapshot{Snapshot: snapRef(12, "two"), Match: first.GetDigest(), GraceMs: 50}, nil, false, 12, 1},
		{"replace unconditionally", &storagev1.PublishSnapshot{Snapshot: snapRef(4, "three")}, nil, false, 4, 2},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			c := st.cmd
			c.Bucket, c.Stream = "b", "s"
			if c.Incarnation == 0 {
				c.Incarnation = inc
			}
			r := publish(t, a, 100, c)
			if code(r) != st.code || r.Duplicate != st.dup {
				t.Fatalf("code %q dup %v, want %q %v (%v)", code(r), r.Duplicate, st.code, st.dup, r.Err)
			}
			got := a.m.SnapshotOf(key, inc)
			if got.GetPosition() != st.wantPos || (st.wantPos == 0) != (got == nil) {
				t.Fatalf("snapshot = %v, want position %d", got, st.wantPos)
			}
			if q, n := a.m.GCQueue(10); n != st.gc {
				t.Fatalf("GC queue %v, want %d entries", q, st.gc)
			}
		})
	}
	q, _ := a.m.GCQueue(10)
	if q[0].GetKey() != first.GetKey() || q[0].GetNotBeforeMs() != 150 || q[0].GetKind() != storagev1.GCKind_GC_KIND_OBJECT {
		t.Fatalf("replaced snapshot queued as %v", q[0])
	}

	// The snapshot is part of the group's state: it survives a restore.
	data, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m2 := NewMachine(0)
	if err := m2.Restore(data); err != nil {
		t.Fatal(err)
	}
	if got := m2.SnapshotOf(key, inc); !proto.Equal(got, snapRef(4, "three")) {
		t.Fatalf("restored snapshot = %v", got)
	}

	// Deleting the stream collects the snapshot with the stream's prefix.
	a.apply(200, &storagev1.DeleteStream{Bucket: "b", Stream: "s"})
	if a.m.SnapshotOf(key, inc) != nil {
		t.Fatal("snapshot outlived its stream")
	}
}

func TestBoundary(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "j", ContentType: "application/json", Json: true}).Meta.Incarnation
	// One append of two messages ("1\n2\n", records at its end only), then "3\n".
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "j", ContentType: "application/json", Body: []byte("1\n2\n")})
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "j", ContentType: "application/json", Body: []byte("3\n")})
	incB := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "o", ContentType: "text/plain"}).Meta.Incarnation
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "o", ContentType: "text/plain", Body: []byte("abc")})
	a.apply(1, &storagev1.Append{Bucket: "b", Stream: "o", ContentType: "text/plain", Body: []byte("de")})
	tests := []struct {
		name     string
		stream   string
		inc      uint64
		pos      uint64
		boundary bool
		found    bool
	}{
		{"json start", "j", inc, 0, true, true},
		{"json inside a message", "j", inc, 1, false, true},
		{"json message end inside an append", "j", inc, 2, true, true},
		{"json append end", "j", inc, 4, true, true},
		{"json tail", "j", inc, 6, true, true},
		{"json past the tail", "j", inc, 7, false, false},
		{"bytes inside an append", "o", incB, 2, false, true},
		{"bytes append end", "o", incB, 3, true, true},
		{"bytes tail", "o", incB, 5, true, true},
		{"wrong incarnation", "o", incB + 1, 3, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, ref, found := a.m.Boundary(Key{"b", tt.stream}, tt.inc, tt.pos)
			if ok != tt.boundary || found != tt.found || ref != nil {
				t.Fatalf("Boundary = %v, %v, %v; want %v, nil, %v", ok, ref, found, tt.boundary, tt.found)
			}
		})
	}
	// Once flushed, positions inside the cold range are the caller's to
	// decide: Boundary returns the covering reference.
	flushAll(t, a, "o", incB)
	ok, ref, found := a.m.Boundary(Key{"b", "o"}, incB, 2)
	if ok || ref == nil || !found {
		t.Fatalf("cold Boundary = %v, %v, %v", ok, ref, found)
	}
	if ok, _, _ := a.m.Boundary(Key{"b", "o"}, incB, 5); !ok {
		t.Fatal("the tail of a flushed stream is a boundary")
	}
}
