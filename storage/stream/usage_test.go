package stream

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// applyCmd applies a whole command (any op) with the next index.
func (a *applier) applyCmd(now int64, cmd *storagev1.Command) *Result {
	a.t.Helper()
	cmd.NowMs = now
	data, err := proto.Marshal(cmd)
	if err != nil {
		a.t.Fatal(err)
	}
	a.index++
	return a.applyRaw(data)
}

func setAttrsCmd(stream, title, md string, inc uint64) *storagev1.Command {
	return &storagev1.Command{Op: &storagev1.Command_SetAttrs{SetAttrs: &storagev1.SetAttrs{
		Bucket: "b", Stream: stream, Incarnation: inc, Title: title, Metadata: []byte(md),
	}}}
}

func TestSetAttrs(t *testing.T) {
	a := newApplier(t)
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"}).Meta.Incarnation
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "closed", ContentType: "text/plain", Closed: true})
	tests := []struct {
		name      string
		cmd       *storagev1.Command
		stream    string
		wantCode  *fault.Kind
		wantSet   bool
		wantTitle string
		wantMD    string
	}{
		{"title and metadata", setAttrsCmd("s", "hello", `{"a":1}`, inc), "s", nil, true, "hello", `{"a":1}`},
		{"replace with metadata only", setAttrsCmd("s", "", `{"b":2}`, 0), "s", nil, true, "", `{"b":2}`},
		{"empty clears", setAttrsCmd("s", "", "", inc), "s", nil, false, "", ""},
		{"a closed stream accepts it", setAttrsCmd("closed", "t", "", 0), "closed", nil, true, "t", ""},
		{"another incarnation", setAttrsCmd("s", "x", "", inc+100), "s", fault.ErrIncarnationMismatch, false, "", ""},
		{"missing stream", setAttrsCmd("nope", "x", "", 0), "nope", fault.ErrStreamNotFound, false, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := a.applyCmd(2, tc.cmd)
			if code(r) != tc.wantCode {
				t.Fatalf("code %q, want %q", code(r), tc.wantCode)
			}
			if tc.wantCode != nil {
				return
			}
			got, set, ok := a.m.Attrs(Key{"b", tc.stream}, 0)
			if !ok || set != tc.wantSet || got.Title != tc.wantTitle || string(got.Metadata) != tc.wantMD {
				t.Fatalf("attrs = %+v set %v ok %v", got, set, ok)
			}
		})
	}
	// Attributes survive a snapshot and do not move the tail.
	a.applyCmd(3, setAttrsCmd("s", "kept", `{"k":true}`, 0))
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m2 := NewMachine(0)
	if err := m2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	got, set, _ := m2.Attrs(Key{"b", "s"}, 0)
	if !set || got.Title != "kept" || string(got.Metadata) != `{"k":true}` {
		t.Fatalf("restored attrs = %+v", got)
	}
	if mv, _ := m2.Lookup(Key{"b", "s"}); mv.Tail != 0 {
		t.Fatalf("tail moved to %d", mv.Tail)
	}
}

func TestDeleteBucket(t *testing.T) {
	del := func(b string) *storagev1.Command {
		return &storagev1.Command{Op: &storagev1.Command_DeleteBucket{DeleteBucket: &storagev1.DeleteBucket{Bucket: b}}}
	}
	a := newApplier(t)
	a.apply(5, &storagev1.CreateBucket{Bucket: "full"})
	a.apply(6, &storagev1.CreateBucket{Bucket: "empty"})
	a.apply(7, &storagev1.CreateStream{Bucket: "full", Stream: "s", ContentType: "text/plain"})
	if ms, ok := a.m.BucketCreated("empty"); !ok || ms != 6 {
		t.Fatalf("created %d %v", ms, ok)
	}
	tests := []struct {
		name     string
		bucket   string
		wantCode *fault.Kind
	}{
		{"not empty", "full", fault.ErrBucketExists},
		{"empty", "empty", nil},
		{"again", "empty", fault.ErrBucketNotFound},
		{"missing", "nope", fault.ErrBucketNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if r := a.applyCmd(8, del(tc.bucket)); code(r) != tc.wantCode {
				t.Fatalf("code %q, want %q", code(r), tc.wantCode)
			}
		})
	}
	if a.m.HasBucket("empty") || !a.m.HasBucket("full") {
		t.Fatal("wrong buckets left")
	}
	// A recreated bucket gets a new creation time.
	a.apply(9, &storagev1.CreateBucket{Bucket: "empty"})
	if ms, _ := a.m.BucketCreated("empty"); ms != 9 {
		t.Fatalf("recreated at %d", ms)
	}
}

func TestListStreams(t *testing.T) {
	a := newApplier(t)
	for _, s := range []string{"c", "a", "b/1", "b/2", "d"} {
		a.apply(10, &storagev1.CreateStream{Bucket: "b", Stream: s, ContentType: "text/plain"})
	}
	a.apply(10, &storagev1.CreateStream{Bucket: "other", Stream: "a", ContentType: "text/plain"})
	a.apply(10, &storagev1.CreateStream{Bucket: "b", Stream: "ttl", ContentType: "text/plain", HasTtl: true, TtlSeconds: 1})
	a.apply(20, &storagev1.Append{Bucket: "b", Stream: "a", ContentType: "text/plain", Body: []byte("xy")})
	ids := func(ls []Listing) string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Meta.Key.Stream)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		name, prefix, after string
		limit               int
		now                 int64
		want                string
	}{
		{"all", "", "", 100, 11, "a,b/1,b/2,c,d,ttl"},
		{"limit", "", "", 2, 11, "a,b/1"},
		{"after", "", "b/1", 2, 11, "b/2,c"},
		{"prefix", "b/", "", 100, 11, "b/1,b/2"},
		{"prefix after", "b/", "b/1", 100, 11, "b/2"},
		{"expired left out", "", "d", 100, 5000, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(a.m.ListStreams("b", tc.prefix, tc.after, tc.limit, tc.now)); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	l := a.m.ListStreams("b", "a", "", 1, 11)[0]
	if l.CreatedMs != 10 || l.LastWriteMs != 20 || l.Meta.Tail != 2 {
		t.Fatalf("listing = %+v", l)
	}
}

func TestExpireMore(t *testing.T) {
	a := newApplier(t)
	var incs []uint64
	for _, s := range []string{"x", "y", "z", "keep"} {
		incs = append(incs, a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: s, ContentType: "text/plain"}).Meta.Incarnation)
	}
	r := a.applyCmd(2, &storagev1.Command{Op: &storagev1.Command_Expire{Expire: &storagev1.Expire{
		Bucket: "b", Stream: "x", Incarnation: incs[0],
		More: []*storagev1.StreamKey{
			{Bucket: "b", Stream: "y", Incarnation: incs[1]},
			{Bucket: "b", Stream: "z", Incarnation: incs[2]},
			{Bucket: "b", Stream: "keep", Incarnation: incs[3] + 1}, // another incarnation: kept
			{Bucket: "b", Stream: "gone"},
		},
	}}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	for _, s := range []string{"x", "y", "z"} {
		if _, ok := a.m.Lookup(Key{"b", s}); ok {
			t.Fatalf("%s not expired", s)
		}
	}
	if _, ok := a.m.Lookup(Key{"b", "keep"}); !ok {
		t.Fatal("keep was expired")
	}
}

func TestUsageCounters(t *testing.T) {
	a := newApplier(t)
	big := strings.Repeat("x", WriteUnitBytes+1)
	a.apply(1, &storagev1.CreateBucket{Bucket: "b"})
	inc := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("abc")}).Meta.Incarnation
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("abc")}) // idempotent repeat: not counted
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "empty", ContentType: "text/plain"})
	a.apply(2, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte(big)})
	a.apply(2, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("r1r2"), Records: []uint64{2, 4}})
	p := producer("p", 0, 0)
	a.apply(3, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("d"), Producer: p})
	if r := a.apply(3, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("d"), Producer: p}); !r.Duplicate {
		t.Fatal("expected a duplicate")
	}
	a.apply(4, &storagev1.Append{Bucket: "b", Stream: "empty", Close: true}) // close only: one unit
	a.apply(4, &storagev1.Append{Bucket: "b", Stream: "empty", Close: true}) // closing again: a no-op

	counted := BucketUsage{
		CommittedAppendBytes: 3 + uint64(len(big)) + 4 + 1,
		CommittedRecords:     1 + 1 + 2 + 1,
		CommittedWriteUnits:  1 + 1 + 2 + 1 + 1 + 1,
	}
	want := counted
	want.RetainedBytes, want.StreamCount = counted.CommittedAppendBytes, 2
	check := func(m *Machine, want BucketUsage) {
		t.Helper()
		if got := m.Usage()["b"]; got != want {
			t.Fatalf("usage = %+v, want %+v", got, want)
		}
	}
	check(a.m, want)

	// The counters survive a snapshot; the gauges follow the state.
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m2 := NewMachine(0)
	if err := m2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	check(m2, want)

	// Deletion and purge leave the counters, drop the gauges.
	a.apply(5, &storagev1.DeleteStream{Bucket: "b", Stream: "s", Incarnation: inc})
	after := counted
	after.StreamCount = 1
	check(a.m, after)
	a.apply(6, &storagev1.PurgeBucket{Bucket: "b"})
	check(a.m, counted)

	// A snapshot counted with another unit is refused.
	var s storagev1.Snapshot
	if err := proto.Unmarshal(snap, &s); err != nil {
		t.Fatal(err)
	}
	s.WriteUnitBytes = 4096
	bad, _ := proto.Marshal(&s)
	if err := NewMachine(0).Restore(bad); err == nil || !strings.Contains(err.Error(), "write unit") {
		t.Fatalf("restore with another unit: %v", err)
	}
}
