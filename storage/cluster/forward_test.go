package cluster

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

const testGroups = 16

func testCluster() *Cluster {
	return &Cluster{machines: make([]*stream.Machine, testGroups), now: func() time.Time { return time.UnixMilli(1_700_000_000_000) }}
}

// groupOf is the group of a stream of the test cluster.
func groupOf(b, s string) uint32 { return stream.GroupOf(b, s, testGroups) }

func TestForwardedCommand(t *testing.T) {
	c := testCluster()
	g := groupOf("b", "s")
	prefix := coldfmt.StreamPrefix("b", "s", 7)
	swap := func(key string, grace int64, n int) *storagev1.ColdSwap {
		sw := &storagev1.ColdSwap{Bucket: "b", Stream: "s", Incarnation: 7, GraceMs: grace, Chunk: &storagev1.ColdRef{Key: key}}
		for range n {
			sw.Replaced = append(sw.Replaced, &storagev1.ColdRef{Key: prefix + "x"})
		}
		return sw
	}
	for _, tc := range []struct {
		name string
		req  *raftv1.ForwardProposeRequest
		ok   bool
	}{
		{"barrier", &raftv1.ForwardProposeRequest{GroupId: 3, Op: &raftv1.ForwardProposeRequest_Barrier{Barrier: &storagev1.Barrier{}}}, true},
		{"no operation", &raftv1.ForwardProposeRequest{GroupId: g}, false},
		{"fork reference in its group", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_AddForkRef{AddForkRef: &storagev1.AddForkRef{Bucket: "b", Stream: "s", Incarnation: 7}}}, true},
		{"fork reference in another group", &raftv1.ForwardProposeRequest{GroupId: (g + 1) % testGroups, Op: &raftv1.ForwardProposeRequest_AddForkRef{AddForkRef: &storagev1.AddForkRef{Bucket: "b", Stream: "s", Incarnation: 7}}}, false},
		{"release with a control character", &raftv1.ForwardProposeRequest{GroupId: groupOf("b", "s\x01"), Op: &raftv1.ForwardProposeRequest_ReleaseForkRef{ReleaseForkRef: &storagev1.ReleaseForkRef{Bucket: "b", Stream: "s\x01"}}}, false},
		{"purge", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{Bucket: "b"}}}, true},
		{"purge of no bucket", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{}}}, false},
		{"bucket-delete fence", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_FenceBucket{FenceBucket: &storagev1.FenceBucket{Bucket: "b", Generation: 9}}}, true},
		{"bucket-delete fence lifted", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_FenceBucket{FenceBucket: &storagev1.FenceBucket{Bucket: "b", Generation: 9, Lift: true}}}, true},
		{"bucket-delete fence of no bucket", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_FenceBucket{FenceBucket: &storagev1.FenceBucket{Generation: 9}}}, false},
		{"GC acknowledgement", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_GcAck{GcAck: &storagev1.GCAck{Seqs: []uint64{1, 2}}}}, true},
		{"empty GC acknowledgement", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_GcAck{GcAck: &storagev1.GCAck{}}}, false},
		{"huge GC acknowledgement", &raftv1.ForwardProposeRequest{GroupId: 5, Op: &raftv1.ForwardProposeRequest_GcAck{GcAck: &storagev1.GCAck{Seqs: make([]uint64, maxForwardedGCAcks+1)}}}, false},
		{"compaction", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: swap(prefix+"c/new", 1000, 2)}}, true},
		{"compaction to another stream's prefix", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: swap(coldfmt.StreamPrefix("b", "t", 7)+"c/new", 1000, 2)}}, false},
		{"compaction escaping its prefix", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: swap(prefix+"../../x", 1000, 2)}}, false},
		{"compaction with a negative grace", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: swap(prefix+"c/new", -1, 2)}}, false},
		{"compaction of one chunk", &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: swap(prefix+"c/new", 0, 1)}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, err := c.forwardedCommand(tc.req)
			if !tc.ok {
				if err == nil || !errors.Is(err, fault.ErrInvalidArgument) {
					t.Fatalf("accepted (%v, %v), want INVALID_ARGUMENT", cmd, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cmd.GetNowMs() != c.now().UnixMilli() || cmd.GetOp() == nil {
				t.Fatalf("command %v: want the leader's clock and the operation", cmd)
			}
		})
	}
}

// TestStartHistoryIsNeverForwarded: a group's history event is proposed by
// its leader on its own behalf; a follower that proposes it gets NOT_LEADER
// instead of a forward, and the forwarded-proposal protocol has no way to
// name it.
func TestStartHistoryIsNeverForwarded(t *testing.T) {
	cmd := &storagev1.Command{Op: &storagev1.Command_StartHistory{StartHistory: &storagev1.StartHistory{PlanTerm: 3, Point: 10, Reason: stream.HistoryAcceptLoss}}}
	if req := forwardRequest(1, cmd); req != nil {
		t.Fatalf("StartHistory forwards as %v", req)
	}
	fields := (&raftv1.ForwardProposeRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("op").Fields()
	want := (&storagev1.StartHistory{}).ProtoReflect().Descriptor().FullName()
	for i := range fields.Len() {
		if m := fields.Get(i).Message(); m != nil && m.FullName() == want {
			t.Fatalf("a forwarded proposal can carry %s as %s", want, fields.Get(i).Name())
		}
	}
}

// FuzzForwardedCommand decodes arbitrary bytes as a forwarded proposal:
// the leader never panics, and whatever it accepts is an allow-listed
// operation on a stream of the group named, stamped with its own clock.
func FuzzForwardedCommand(f *testing.F) {
	for _, req := range []*raftv1.ForwardProposeRequest{
		{GroupId: 1, Op: &raftv1.ForwardProposeRequest_Barrier{Barrier: &storagev1.Barrier{}}},
		{GroupId: groupOf("b", "s"), Op: &raftv1.ForwardProposeRequest_AddForkRef{AddForkRef: &storagev1.AddForkRef{Bucket: "b", Stream: "s", Incarnation: 1, Position: 9}}},
		{GroupId: 2, Op: &raftv1.ForwardProposeRequest_GcAck{GcAck: &storagev1.GCAck{Seqs: []uint64{4}}}},
		{GroupId: groupOf("b", "s"), Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: &storagev1.ColdSwap{Bucket: "b", Stream: "s", Incarnation: 1,
			Replaced: []*storagev1.ColdRef{{Key: "k1"}, {Key: "k2"}}, Chunk: &storagev1.ColdRef{Key: coldfmt.StreamPrefix("b", "s", 1) + "c"}}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x02, 0x80, 0x01}) // the old "command" field
	c := testCluster()
	f.Fuzz(func(t *testing.T, b []byte) {
		var req raftv1.ForwardProposeRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		cmd, err := c.forwardedCommand(&req)
		if err != nil {
			return
		}
		if cmd.GetNowMs() != c.now().UnixMilli() {
			t.Fatalf("accepted command carries the sender's clock: %v", cmd)
		}
		var key *stream.Key
		switch op := cmd.GetOp().(type) {
		case *storagev1.Command_Barrier, *storagev1.Command_PurgeBucket, *storagev1.Command_FenceBucket, *storagev1.Command_GcAck:
		case *storagev1.Command_AddForkRef:
			key = &stream.Key{Bucket: op.AddForkRef.GetBucket(), Stream: op.AddForkRef.GetStream()}
		case *storagev1.Command_ReleaseForkRef:
			key = &stream.Key{Bucket: op.ReleaseForkRef.GetBucket(), Stream: op.ReleaseForkRef.GetStream()}
		case *storagev1.Command_ColdSwap:
			key = &stream.Key{Bucket: op.ColdSwap.GetBucket(), Stream: op.ColdSwap.GetStream()}
		default:
			t.Fatalf("accepted an operation outside the allow-list: %T", op)
		}
		if key != nil && (key.Validate() != nil || groupOf(key.Bucket, key.Stream) != req.GetGroupId()) {
			t.Fatalf("accepted %v for group %d", key, req.GetGroupId())
		}
	})
}
