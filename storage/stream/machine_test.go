package stream

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
)

// applier feeds commands to a machine with increasing indexes.
type applier struct {
	t     testing.TB
	m     *Machine
	index uint64
}

func newApplier(t testing.TB) *applier { return &applier{t: t, m: NewMachine(0)} }

func (a *applier) apply(now int64, op any) *Result {
	a.t.Helper()
	cmd := &storagev1.Command{NowMs: now}
	switch o := op.(type) {
	case *storagev1.CreateStream:
		cmd.Op = &storagev1.Command_CreateStream{CreateStream: o}
	case *storagev1.Append:
		cmd.Op = &storagev1.Command_Append{Append: o}
	case *storagev1.DeleteStream:
		cmd.Op = &storagev1.Command_DeleteStream{DeleteStream: o}
	case *storagev1.AddForkRef:
		cmd.Op = &storagev1.Command_AddForkRef{AddForkRef: o}
	case *storagev1.ReleaseForkRef:
		cmd.Op = &storagev1.Command_ReleaseForkRef{ReleaseForkRef: o}
	case *storagev1.ColdFlush:
		cmd.Op = &storagev1.Command_ColdFlush{ColdFlush: o}
	case *storagev1.SetRetention:
		cmd.Op = &storagev1.Command_SetRetention{SetRetention: o}
	case *storagev1.ColdRetire:
		cmd.Op = &storagev1.Command_ColdRetire{ColdRetire: o}
	case *storagev1.ColdSwap:
		cmd.Op = &storagev1.Command_ColdSwap{ColdSwap: o}
	case *storagev1.GCAck:
		cmd.Op = &storagev1.Command_GcAck{GcAck: o}
	case *storagev1.PurgeBucket:
		cmd.Op = &storagev1.Command_PurgeBucket{PurgeBucket: o}
	case *storagev1.CreateBucket:
		cmd.Op = &storagev1.Command_CreateBucket{CreateBucket: o}
	case *storagev1.DeleteBucket:
		cmd.Op = &storagev1.Command_DeleteBucket{DeleteBucket: o}
	case *storagev1.FenceBucket:
		cmd.Op = &storagev1.Command_FenceBucket{FenceBucket: o}
	case *storagev1.SetFeatureLevel:
		cmd.Op = &storagev1.Command_SetFeatureLevel{SetFeatureLevel: o}
	case *storagev1.Expire:
		cmd.Op = &storagev1.Command_Expire{Expire: o}
	case *storagev1.Touch:
		cmd.Op = &storagev1.Command_Touch{Touch: o}
	default:
		a.t.Fatalf("unsupported op %T", op)
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		a.t.Fatal(err)
	}
	a.index++
	return a.applyRaw(data)
}

func code(r *Result) *fault.Kind {
	if r.Err == nil {
		return nil
	}
	return r.Err.Kind
}

func producer(id string, epoch, seq uint64) *storagev1.ProducerRef {
	return &storagev1.ProducerRef{Id: id, Epoch: epoch, Seq: seq}
}

func TestProducerStateMachine(t *testing.T) {
	tests := []struct {
		name      string
		p         *storagev1.ProducerRef
		wantCode  *fault.Kind
		wantDup   bool
		wantTail  uint64
		wantMetaK string
		wantMetaV string
	}{
		{"first write at seq 0", producer("p", 0, 0), nil, false, 1, "", ""},
		{"next seq", producer("p", 0, 1), nil, false, 2, "", ""},
		{"retry is a duplicate", producer("p", 0, 1), nil, true, 2, "", ""},
		{"gap", producer("p", 0, 5), fault.ErrProducerSeqGap, false, 2, fault.DetailExpectedSeq, "2"},
		{"new epoch must start at 0", producer("p", 1, 3), fault.ErrProducerEpochSeq, false, 2, "", ""},
		{"new epoch at 0", producer("p", 1, 0), nil, false, 3, "", ""},
		{"stale epoch fenced", producer("p", 0, 2), fault.ErrProducerStaleEpoch, false, 3, fault.DetailProducerEpoch, "1"},
		{"unknown producer not at 0", producer("q", 0, 1), fault.ErrProducerSeqGap, false, 3, fault.DetailExpectedSeq, "0"},
	}
	a := newApplier(t)
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := a.apply(2, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("x"), Producer: tc.p})
			if code(r) != tc.wantCode {
				t.Fatalf("code = %q, want %q (%v)", code(r), tc.wantCode, r.Err)
			}
			if r.Err == nil && r.Duplicate != tc.wantDup {
				t.Fatalf("duplicate = %v, want %v", r.Duplicate, tc.wantDup)
			}
			if tc.wantMetaK != "" && r.Err.Details[tc.wantMetaK] != tc.wantMetaV {
				t.Fatalf("%s = %q, want %q", tc.wantMetaK, r.Err.Details[tc.wantMetaK], tc.wantMetaV)
			}
			if m, _ := a.m.Lookup(Key{"b", "s"}); m.Tail != tc.wantTail {
				t.Fatalf("tail = %d, want %d", m.Tail, tc.wantTail)
			}
		})
	}
}

func TestClosureOrderAndIdempotence(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"})
	if r := a.apply(2, &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("end"), Close: true, Producer: producer("p", 0, 0)}); r.Err != nil || !r.Meta.Closed {
		t.Fatalf("append-and-close: %v closed=%v", r.Err, r.Meta.Closed)
	}
	tests := []struct {
		name     string
		a        *storagev1.Append
		wantCode *fault.Kind
		wantDup  bool
	}{
		{"retry of the closing tuple", &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("other"), Close: true, Producer: producer("p", 0, 0)}, nil, true},
		{"another producer", &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("x"), Producer: producer("q", 0, 0)}, fault.ErrStreamClosed, false},
		{"closed before content type", &storagev1.Append{Bucket: "b", Stream: "s", ContentType: "application/json", Body: []byte("1")}, fault.ErrStreamClosed, false},
		{"close-only again is fine", &storagev1.Append{Bucket: "b", Stream: "s", Close: true}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := a.apply(3, tc.a)
			if code(r) != tc.wantCode || (r.Err == nil && r.Duplicate != tc.wantDup) {
				t.Fatalf("got code %q dup %v, want %q dup %v", code(r), r.Duplicate, tc.wantCode, tc.wantDup)
			}
			if tc.wantCode == fault.ErrStreamClosed && r.Err.Details[fault.DetailNextOffset] != FormatOffset(3) {
				t.Fatalf("next_offset = %q", r.Err.Details[fault.DetailNextOffset])
			}
		})
	}
}

func TestForkLifecycle(t *testing.T) {
	a := newApplier(t)
	src := a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "src", ContentType: "text/plain", Body: []byte("abcdef")})
	inc := src.Meta.Incarnation
	if r := a.apply(2, &storagev1.AddForkRef{Bucket: "b", Stream: "src", Incarnation: inc, Position: 7}); code(r) != fault.ErrOffsetOutOfRange {
		t.Fatalf("fork past tail: %v", r.Err)
	}
	a.apply(2, &storagev1.AddForkRef{Bucket: "b", Stream: "src", Incarnation: inc, Position: 4})
	fork := a.apply(2, &storagev1.CreateStream{Bucket: "b", Stream: "fork", ContentType: "text/plain",
		Fork: &storagev1.ForkOrigin{SourceBucket: "b", SourceStream: "src", SourceIncarnation: inc, Position: 4}})
	if fork.Meta.Base != 4 || fork.Meta.Tail != 4 {
		t.Fatalf("fork base/tail = %d/%d", fork.Meta.Base, fork.Meta.Tail)
	}
	if r := a.apply(3, &storagev1.DeleteStream{Bucket: "b", Stream: "src", Incarnation: inc}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if m, _ := a.m.Lookup(Key{"b", "src"}); !m.SoftDeleted {
		t.Fatal("source with a fork must be soft-deleted")
	}
	if got, _, _, _ := a.m.ReadOwn(Key{"b", "src"}, inc, 0, 4, 0, nil); string(got) != "abcd" {
		t.Fatalf("soft-deleted source data = %q", got)
	}
	r := a.apply(4, &storagev1.DeleteStream{Bucket: "b", Stream: "fork", Incarnation: fork.Meta.Incarnation})
	if len(r.Release) != 1 || r.Release[0].GetSourceStream() != "src" {
		t.Fatalf("deleting the fork must release its source: %v", r.Release)
	}
	a.apply(5, &storagev1.ReleaseForkRef{Bucket: "b", Stream: "src", Incarnation: inc})
	if _, ok := a.m.Lookup(Key{"b", "src"}); ok {
		t.Fatal("soft-deleted source must be removed after its last fork is released")
	}
}

func TestSnapshotIsDeterministicAndRestores(t *testing.T) {
	build := func() *Machine {
		a := newApplier(t)
		for _, s := range []string{"z", "a", "m"} {
			a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: s, ContentType: "application/json", Json: true, HasTtl: true, TtlSeconds: 60})
			for i := range 5 {
				a.apply(2, &storagev1.Append{Bucket: "b", Stream: s, ContentType: "application/json", Body: []byte("{\"i\":1}\n"),
					Producer: producer(string(rune('p'+i%3)), 0, uint64(i/3))})
			}
		}
		return a.m
	}
	one, err := build().Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	two, _ := build().Snapshot()
	if !bytes.Equal(one, two) {
		t.Fatal("same state produced different snapshot bytes")
	}
	restored := NewMachine(0)
	if err := restored.Restore(one); err != nil {
		t.Fatal(err)
	}
	again, _ := restored.Snapshot()
	if !bytes.Equal(one, again) {
		t.Fatal("restore + snapshot changed the bytes")
	}
	if err := restored.Restore([]byte{0xff, 0x01}); err == nil {
		t.Fatal("garbage snapshot must be refused")
	}
}

// applyRaw applies an encoded command at the next index; a command the
// machine cannot apply fails the test.
func (a *applier) applyRaw(data []byte) *Result {
	a.t.Helper()
	a.index++
	v, err := a.m.Apply(a.index, data)
	if err != nil {
		a.t.Fatalf("apply at %d: %v", a.index, err)
	}
	return v.(*Result)
}

// TestCommandsThisBuildCannotApply: a command that does not decode, or
// names an operation this build does not know (a newer node's), is refused
// with ErrUnknownCommand and changes nothing, not even the applied index:
// the node stops rather than diverge from replicas that can apply it.
func TestCommandsThisBuildCannotApply(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain", Body: []byte("abc")})
	before, _ := a.m.Snapshot()
	// Field 1000 of Command: a oneof case a later release might add.
	future := protowire.AppendTag(nil, 1000, protowire.BytesType)
	future = protowire.AppendBytes(future, []byte{0x0a, 0x01, 'x'})
	noOp, _ := proto.Marshal(&storagev1.Command{NowMs: 5})
	for name, data := range map[string][]byte{
		"undecodable":       {0xff, 0xff, 0xff},
		"unknown operation": future,
		"no operation":      noOp,
	} {
		t.Run(name, func(t *testing.T) {
			v, err := a.m.Apply(99, data)
			if !errors.Is(err, ErrUnknownCommand) || v != nil {
				t.Fatalf("Apply = %v, %v; want ErrUnknownCommand", v, err)
			}
			after, _ := a.m.Snapshot()
			if !bytes.Equal(before, after) {
				t.Fatal("the refused command changed the state")
			}
		})
	}
}

// TestSnapshotStreamsMatchTheState: each stream of a snapshot, decoded, is
// the machine's state of it: the metadata message with the producers (by
// id), the records, the hot external payloads and the hot bytes the
// machine keeps beside it (the capture encodes those parts itself rather
// than cloning the stream).
func TestSnapshotStreamsMatchTheState(t *testing.T) {
	m := variedGroup(t, nil).m
	raw, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(raw, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.GetStreams()) != len(m.streams) {
		t.Fatalf("%d streams in the snapshot, %d in the machine", len(snap.GetStreams()), len(m.streams))
	}
	withParts := 0
	for _, got := range snap.GetStreams() {
		s := m.streams[Key{got.GetBucket(), got.GetStream()}]
		if s == nil {
			t.Fatalf("snapshot names %s/%s, which the machine does not hold", got.GetBucket(), got.GetStream())
		}
		want := proto.CloneOf(s.meta.toProto())
		want.Records = slices.Clone(s.records)
		var ids []string
		s.producers.each(func(p *storagev1.ProducerState) { ids = append(ids, p.GetId()) })
		for _, id := range slices.Sorted(slices.Values(ids)) {
			want.Producers = append(want.Producers, s.producers.get(id))
		}
		s.buf.Holes(func(_, _ uint64, tag any) {
			want.HotExternal = append(want.HotExternal, &storagev1.HotExternal{Ref: tag.(*storagev1.ColdRef)})
		})
		want.Data = bytes.Join(s.buf.AppendHeld(nil), nil)
		want.ColdIndex = s.coldLevels()
		if len(want.Producers) > 0 && len(want.Records) > 0 && len(want.Data) > 0 && len(want.ColdIndex) > 0 {
			withParts++
		}
		if !proto.Equal(got, want) {
			t.Errorf("stream %s/%s:\n got %v\nwant %v", got.GetBucket(), got.GetStream(), got, want)
		}
	}
	if withParts == 0 {
		t.Fatal("no stream with producers, records, hot bytes and a cold index: the test proves nothing")
	}
}

// TestColdIndexFindMatchesTheDecodedIndex: the walk over a cold index's
// encoding finds, at every position of every stream, the entry a search of
// the decoded levels finds (or none where it finds none).
func TestColdIndexFindMatchesTheDecodedIndex(t *testing.T) {
	m := variedGroup(t, nil).m
	checked := 0
	for k, s := range m.streams {
		levels := s.coldLevels()
		for pos := uint64(0); pos <= s.buf.End()+1; pos++ {
			var want *storagev1.ColdRef
			for _, lv := range levels {
				if want = coldfmt.FindRef(lv.GetEntries(), pos); want != nil {
					break
				}
			}
			got := s.cold.find(pos)
			if !proto.Equal(got, want) {
				t.Fatalf("stream %s at %d: find %v, the decoded index %v", k.Stream, pos, got, want)
			}
			if want != nil {
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no position is covered by a cold index entry: the test proves nothing")
	}
}
