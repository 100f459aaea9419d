package upstream

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// fakeCluster is a set of fake nodes sharing one notion of who leads what.
type fakeCluster struct {
	t      testing.TB
	id     string
	groups int

	mu sync.Mutex
	// leaders[g] is the real leader of g: it serves, the others refuse.
	leaders []uint64
	// reported[g], when set, is what GetClusterInfo reports instead.
	reported []uint64
	nodes    []*fakeNode
	// hidden node ids are left out of GetClusterInfo's node list.
	hidden map[uint64]bool
}

// newFakeCluster starts n nodes (ids 1..n) with groups groups, all led by
// node 1.
func newFakeCluster(t testing.TB, n, groups int) *fakeCluster {
	t.Helper()
	c := &fakeCluster{t: t, id: "test-cluster", groups: groups, leaders: make([]uint64, groups), hidden: map[uint64]bool{}}
	for g := range c.leaders {
		c.leaders[g] = 1
	}
	for i := range n {
		c.nodes = append(c.nodes, startFakeNode(t, c, uint64(i+1)))
	}
	return c
}

func (c *fakeCluster) node(id uint64) *fakeNode { return c.nodes[id-1] }

func (c *fakeCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.addr)
	}
	return out
}

// setLeader makes id the real and reported leader of every group in gs
// (every group when gs is empty).
func (c *fakeCluster) setLeader(id uint64, gs ...uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(gs) == 0 {
		for g := range c.leaders {
			c.leaders[g] = id
		}
		return
	}
	for _, g := range gs {
		c.leaders[g] = id
	}
}

func (c *fakeCluster) leader(g uint32) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaders[g]
}

func (c *fakeCluster) group(bucket, stream string) uint32 {
	return groupOf(bucket, stream, c.groups)
}

// streamInGroup returns a stream name of bucket b that lives in group g.
func (c *fakeCluster) streamInGroup(b string, g uint32) string {
	c.t.Helper()
	for i := range 10000 {
		s := "s" + strconv.Itoa(i)
		if c.group(b, s) == g {
			return s
		}
	}
	c.t.Fatalf("no stream in group %d", g)
	return ""
}

// fakeNode is one node: a real gRPC server on loopback.
type fakeNode struct {
	streamv1.UnimplementedStreamServiceServer
	c    *fakeCluster
	id   uint64
	addr string
	srv  *grpc.Server

	mu sync.Mutex
	// calls counts calls by method name.
	calls map[string]int
	// script holds errors to return, in order, by method name.
	script map[string][]error
	// refuseHistory makes the node answer NOT_LEADER to history reads.
	refuseHistory bool
	// subChunks is how many chunks Subscribe sends before returning.
	subChunks int
	// noAppendStream makes the node an older release without
	// AppendStream.
	noAppendStream bool
}

func startFakeNode(t testing.TB, c *fakeCluster, id uint64) *fakeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	n := &fakeNode{c: c, id: id, addr: lis.Addr().String(), srv: grpc.NewServer(), calls: map[string]int{}, script: map[string][]error{}, subChunks: 2}
	streamv1.RegisterStreamServiceServer(n.srv, n)
	go func() { _ = n.srv.Serve(lis) }()
	t.Cleanup(n.stop)
	return n
}

func (n *fakeNode) stop() { n.srv.Stop() }

// fail queues errors for method.
func (n *fakeNode) fail(method string, errs ...error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.script[method] = append(n.script[method], errs...)
}

func (n *fakeNode) count(method string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[method]
}

// enter counts a call and returns its scripted error, if any.
func (n *fakeNode) enter(method string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls[method]++
	if q := n.script[method]; len(q) > 0 {
		n.script[method] = q[1:]
		return q[0]
	}
	return nil
}

// lead answers NOT_LEADER unless this node leads g.
func (n *fakeNode) lead(g uint32) error {
	l := n.c.leader(g)
	if l == n.id {
		return nil
	}
	e := errcode.New(errcode.NotLeader, "node %d does not lead group %d", n.id, g)
	if l != 0 {
		e = e.With(errcode.KeyLeaderID, strconv.FormatUint(l, 10)).With(errcode.KeyLeaderAddr, n.c.node(l).addr)
	}
	return grpcerr.ToStatus(e)
}

func (n *fakeNode) served(ref *streamv1.StreamRef, method string, history bool) error {
	if err := n.enter(method); err != nil {
		return err
	}
	g := uint32(0)
	if ref != nil {
		g = n.c.group(ref.GetBucket(), ref.GetStream())
	}
	if history {
		n.mu.Lock()
		refuse := n.refuseHistory
		n.mu.Unlock()
		if !refuse {
			return nil
		}
		return grpcerr.ToStatus(errcode.New(errcode.NotLeader, "cannot serve history"))
	}
	return n.lead(g)
}

// by names the serving node in responses.
func (n *fakeNode) by() string { return fmt.Sprintf("node%d", n.id) }

func (n *fakeNode) CreateBucket(_ context.Context, _ *streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error) {
	if err := n.served(nil, "CreateBucket", false); err != nil {
		return nil, err
	}
	return &streamv1.CreateBucketResponse{Created: true}, nil
}

// ListStreams answers one page from this node, naming it in the cursor.
func (n *fakeNode) ListStreams(_ context.Context, _ *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
	if err := n.served(nil, "ListStreams", false); err != nil {
		return nil, err
	}
	return &streamv1.ListStreamsResponse{NextCursor: n.by(), HasMore: true}, nil
}

func (n *fakeNode) CreateStream(_ context.Context, in *streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
	if err := n.served(in.GetRef(), "CreateStream", false); err != nil {
		return nil, err
	}
	return &streamv1.CreateStreamResponse{Created: true, Info: &streamv1.StreamInfo{ContentType: n.by()}}, nil
}

func (n *fakeNode) Append(_ context.Context, in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
	if err := n.served(in.GetRef(), "Append", false); err != nil {
		return nil, err
	}
	return &streamv1.AppendResponse{NextOffset: n.by()}, nil
}

// AppendStream answers each append as Append does, concurrently.
func (n *fakeNode) AppendStream(call grpc.BidiStreamingServer[streamv1.AppendStreamRequest, streamv1.AppendStreamResponse]) error {
	n.mu.Lock()
	n.calls["AppendStream"]++
	old := n.noAppendStream
	n.mu.Unlock()
	if old {
		return status.Error(codes.Unimplemented, "unknown method AppendStream")
	}
	var sendMu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := call.Recv()
		if err != nil {
			return nil
		}
		wg.Go(func() {
			resp, err := n.Append(call.Context(), req.GetAppend())
			out := &streamv1.AppendStreamResponse{Id: req.GetId(), Append: resp}
			if err != nil {
				out.Error, _ = proto.Marshal(status.Convert(err).Proto())
			}
			sendMu.Lock()
			defer sendMu.Unlock()
			_ = call.Send(out)
		})
	}
}

func (n *fakeNode) Read(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
	if err := n.served(in.GetRef(), "Read", readMode(in) == modeAnyRead); err != nil {
		return nil, err
	}
	return &streamv1.ReadResponse{Data: []byte(n.by())}, nil
}

func (n *fakeNode) Head(_ context.Context, in *streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
	if err := n.served(in.GetRef(), "Head", false); err != nil {
		return nil, err
	}
	return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: n.by()}}, nil
}

func (n *fakeNode) DeleteStream(_ context.Context, in *streamv1.DeleteStreamRequest) (*streamv1.DeleteStreamResponse, error) {
	if err := n.served(in.GetRef(), "DeleteStream", false); err != nil {
		return nil, err
	}
	return &streamv1.DeleteStreamResponse{}, nil
}

func (n *fakeNode) Subscribe(in *streamv1.SubscribeRequest, st grpc.ServerStreamingServer[streamv1.SubscribeResponse]) error {
	if err := n.served(in.GetRef(), "Subscribe", false); err != nil {
		return err
	}
	n.mu.Lock()
	chunks := n.subChunks
	n.mu.Unlock()
	for range chunks {
		if err := st.Send(&streamv1.SubscribeResponse{Chunk: &streamv1.ReadResponse{Data: []byte(n.by())}}); err != nil {
			return err
		}
	}
	return nil
}

func (n *fakeNode) GetClusterInfo(context.Context, *streamv1.GetClusterInfoRequest) (*streamv1.GetClusterInfoResponse, error) {
	if err := n.enter("GetClusterInfo"); err != nil {
		return nil, err
	}
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	resp := &streamv1.GetClusterInfoResponse{ClusterId: c.id, NodeId: n.id, GroupCount: uint32(c.groups)}
	for _, o := range c.nodes {
		if !c.hidden[o.id] {
			resp.Nodes = append(resp.Nodes, &streamv1.NodeInfo{Id: o.id, ClientAddr: o.addr})
		}
	}
	resp.GroupLeaders = append([]uint64(nil), c.leaders...)
	if c.reported != nil {
		resp.GroupLeaders = append([]uint64(nil), c.reported...)
	}
	return resp, nil
}
