package node

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/tests/await"
)

func TestAppendStream(t *testing.T) {
	s := runNode(t, testConfig("", ""))
	c := streamv1.NewStreamServiceClient(dial(t, s.cfg.Listen))
	ctx := t.Context()
	await.True(t, "the node serves", func() bool {
		_, err := c.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: "b"})
		return err == nil
	})
	ref := func(name string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: "b", Stream: name} }
	const streams, each = 8, 25
	for i := range streams {
		if _, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref(fmt.Sprint("s", i)), ContentType: "text/plain"}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("appends are answered by id, each as Append answers it", func(t *testing.T) {
		call, err := c.AppendStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := map[uint64]string{} // id → stream
		id := uint64(0)
		for k := range each {
			for i := range streams {
				id++
				sent[id] = fmt.Sprint("s", i)
				if err := call.Send(&streamv1.AppendStreamRequest{Id: id, Append: &streamv1.AppendRequest{
					Ref: ref(sent[id]), ContentType: "text/plain", Body: []byte(fmt.Sprintf("%02d;", k)),
				}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// One the engine refuses: its error is Append's, with its details.
		id++
		if err := call.Send(&streamv1.AppendStreamRequest{Id: id, Append: &streamv1.AppendRequest{
			Ref: ref("s0"), ContentType: "application/json", Body: []byte("1"),
		}}); err != nil {
			t.Fatal(err)
		}
		refused := id
		if err := call.CloseSend(); err != nil {
			t.Fatal(err)
		}
		answered := map[uint64]bool{}
		for {
			msg, err := call.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if answered[msg.GetId()] {
				t.Fatalf("id %d answered twice", msg.GetId())
			}
			answered[msg.GetId()] = true
			if msg.GetId() == refused {
				st := &spb.Status{}
				if err := proto.Unmarshal(msg.GetError(), st); err != nil {
					t.Fatal(err)
				}
				_, unary := c.Append(ctx, &streamv1.AppendRequest{Ref: ref("s0"), ContentType: "application/json", Body: []byte("1")})
				if _, info := errorInfo(status.ErrorProto(st)); info.GetReason() != errcode.Reason(errcode.ContentTypeMismatch) || !proto.Equal(st, status.Convert(unary).Proto()) {
					t.Fatalf("refused append: %v, want Append's %v", st, status.Convert(unary).Proto())
				}
				continue
			}
			if len(msg.GetError()) > 0 || msg.GetAppend().GetNextOffset() == "" {
				t.Fatalf("id %d (%s) answered %v", msg.GetId(), sent[msg.GetId()], msg)
			}
		}
		if len(answered) != int(id) {
			t.Fatalf("%d of %d appends answered", len(answered), id)
		}
		for i := range streams {
			r, err := c.Read(ctx, &streamv1.ReadRequest{Ref: ref(fmt.Sprint("s", i)), Offset: "-1"})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Count(string(r.GetData()), ";"); got != each {
				t.Fatalf("s%d holds %d appends, want %d: %q", i, got, each, r.GetData())
			}
		}
	})

	t.Run("a request without an id ends the call", func(t *testing.T) {
		call, err := c.AppendStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := call.Send(&streamv1.AppendStreamRequest{Append: &streamv1.AppendRequest{Ref: ref("s0"), ContentType: "text/plain", Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if _, err := call.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Recv = %v, want INVALID_ARGUMENT", err)
		}
	})

	t.Run("a draining node tells the caller and answers what it sends", func(t *testing.T) {
		call, err := c.AppendStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The call is open before the drain.
		if err := call.Send(&streamv1.AppendStreamRequest{Id: 1, Append: &streamv1.AppendRequest{Ref: ref("s1"), ContentType: "text/plain", Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if msg, err := call.Recv(); err != nil || msg.GetId() != 1 || msg.GetAppend() == nil {
			t.Fatalf("Recv = %v, %v", msg, err)
		}
		s.streams.drain()
		if msg, err := call.Recv(); err != nil || !msg.GetDraining() {
			t.Fatalf("Recv = %v, %v; want the drain notice", msg, err)
		}
		if err := call.Send(&streamv1.AppendStreamRequest{Id: 2, Append: &streamv1.AppendRequest{Ref: ref("s1"), ContentType: "text/plain", Body: []byte("y")}}); err != nil {
			t.Fatal(err)
		}
		if err := call.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if msg, err := call.Recv(); err != nil || msg.GetId() != 2 || msg.GetAppend() == nil {
			t.Fatalf("Recv = %v, %v; want the answer sent after the notice", msg, err)
		}
		if _, err := call.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Recv = %v, want the end of the call", err)
		}
	})
}
