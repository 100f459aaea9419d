package transport

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/tests/await"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logRecorder is a slog.Handler that keeps every record's level and message
// (and forwards warnings and errors to stderr when TRANSPORT_DEBUG is set).
type logRecorder struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []slog.Attr
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: &sync.Mutex{}, records: &[]logRecord{}}
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	lr := logRecord{level: rec.Level, msg: rec.Message, attrs: map[string]string{}}
	for _, a := range r.attrs {
		lr.attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		lr.attrs[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	*r.records = append(*r.records, lr)
	r.mu.Unlock()
	if os.Getenv("TRANSPORT_DEBUG") != "" {
		_ = slog.NewTextHandler(os.Stderr, nil).WithAttrs(r.attrs).Handle(context.Background(), rec)
	}
	return nil
}

func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{mu: r.mu, records: r.records, attrs: append(append([]slog.Attr{}, r.attrs...), as...)}
}

func (r *logRecorder) WithGroup(string) slog.Handler { return r }

// count returns the records at level whose message contains substr.
func (r *logRecorder) count(level slog.Level, substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range *r.records {
		if rec.level == level && strings.Contains(rec.msg, substr) {
			n++
		}
	}
	return n
}

// fakeHost records what the transport hands it.
type fakeHost struct {
	mu          sync.Mutex
	steps       []stepped
	unreachable map[uint64]int
	snapReports []snapReport
}

type stepped struct {
	group uint32
	m     *pb.Message
}

type snapReport struct {
	group  uint32
	to     uint64
	failed bool
}

func newFakeHost() *fakeHost { return &fakeHost{unreachable: map[uint64]int{}} }

func (f *fakeHost) Step(group uint32, m *pb.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, stepped{group, m})
	return nil
}

func (f *fakeHost) ReportUnreachable(_ uint32, to uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unreachable[to]++
	return nil
}

func (f *fakeHost) ReportSnapshot(group uint32, to uint64, failed bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapReports = append(f.snapReports, snapReport{group, to, failed})
	return nil
}

func (f *fakeHost) stepped() []stepped {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]stepped(nil), f.steps...)
}

func (f *fakeHost) unreachableCount(to uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unreachable[to]
}

func (f *fakeHost) snapshotReports() []snapReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]snapReport(nil), f.snapReports...)
}

// listen reserves a loopback port.
func listen(tb testing.TB, addr string) net.Listener {
	tb.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var (
		lis net.Listener
		err error
	)
	// A restarted node re-listens on its old port, which the kernel may
	// still hold for a moment.
	await.True(tb, "listening on "+addr, func() bool {
		lis, err = net.Listen("tcp", addr)
		return err == nil
	})
	return lis
}

// served is a transport with its gRPC server and Run goroutines.
type served struct {
	t       *Transport
	srv     *grpc.Server
	lis     net.Listener
	cancel  context.CancelFunc
	runDone chan error
	srvDone chan error
	stopped bool
}

// serve starts tr on lis: a gRPC server with tr's options and service,
// and tr.Run. The returned value is stopped at the end of the test.
func serve(tb testing.TB, tr *Transport, lis net.Listener) *served {
	tb.Helper()
	s := &served{t: tr, lis: lis, runDone: make(chan error, 1), srvDone: make(chan error, 1)}
	s.srv = grpc.NewServer(tr.ServerOptions()...)
	tr.Register(s.srv)
	go func() { s.srvDone <- s.srv.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.runDone <- tr.Run(ctx) }()
	tb.Cleanup(func() { s.stop(tb) })
	return s
}

func (s *served) stop(tb testing.TB) {
	tb.Helper()
	if s.stopped {
		return
	}
	s.stopped = true
	s.t.Close()
	s.cancel()
	if err := <-s.runDone; err != nil && !errors.Is(err, ErrClosed) {
		tb.Errorf("Run: %v", err)
	}
	// Close ended every inbound stream, so a graceful stop completes.
	s.srv.GracefulStop()
	<-s.srvDone
}

func msg(typ pb.MessageType, from, to uint64) *pb.Message {
	return &pb.Message{Type: typ.Enum(), From: &from, To: &to}
}

func metadataContext(ctx context.Context, clusterID string, nodeID uint64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, MetadataClusterID, clusterID, MetadataNodeID, strconv.FormatUint(nodeID, 10))
}

func marshal(m *pb.Message) ([]byte, error) { return proto.Marshal(m) }
