package transport

import (
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/internal/pki"
	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	"github.com/ursula/ursula/tests/await"
)

// testCA issues identities into a directory.
type testCA struct {
	ca  *pki.CA
	dir string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca, err := pki.NewCA("cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca, dir: dir}
}

func (c *testCA) source(t *testing.T, name string, id pki.Identity) *pki.Source {
	t.Helper()
	is, err := c.ca.Issue(id, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := is.Save(c.dir, name, filepath.Join(c.dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// forged dials addr as the holder of src, whatever the metadata claims.
func forged(t *testing.T, addr string, src *pki.Source) raftv1.RaftServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig(nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return raftv1.NewRaftServiceClient(cc)
}

func TestMutualTLS(t *testing.T) {
	ca := newTestCA(t)
	lis1, lis2 := listen(t, ""), listen(t, "")
	peers := map[uint64]string{1: lis1.Addr().String(), 2: lis2.Addr().String(), 3: "127.0.0.1:1"}
	start := func(id uint64) (*Transport, *fakeHost) {
		host := newFakeHost()
		tr, err := New(Config{NodeID: id, ClusterID: "c1", Peers: peers, TLS: ca.source(t, fmt.Sprintf("node%d", id), pki.NodeIdentity(id))}, host, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tr, host
	}
	tr1, host1 := start(1)
	tr2, _ := start(2)
	serve(t, tr1, tlsListener(lis1, tr1))
	serve(t, tr2, tlsListener(lis2, tr2))

	tr2.Send(0, []*pb.Message{msg(pb.MessageType_MsgHeartbeat, 2, 1)})
	await.True(t, "a heartbeat over mutual TLS", func() bool { return len(host1.stepped()) == 1 })

	addr := lis1.Addr().String()
	call := func(src *pki.Source, claim uint64) error {
		_, err := forged(t, addr, src).Probe(metadataContext(t.Context(), "c1", claim), &raftv1.ProbeRequest{})
		return err
	}
	t.Run("a certificate of another node id", func(t *testing.T) {
		before := tr1.Stats().UnauthenticatedPeerRefusals
		err := call(ca.source(t, "node3", pki.NodeIdentity(3)), 2)
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node 3 claiming node 2: %v, want PermissionDenied", err)
		}
		if got := tr1.Stats().UnauthenticatedPeerRefusals; got != before+1 {
			t.Fatalf("unauthenticated refusals %d, want %d", got, before+1)
		}
	})
	t.Run("a role certificate", func(t *testing.T) {
		if err := call(ca.source(t, "gateway", pki.RoleIdentity(pki.RoleGateway)), 2); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a gateway claiming node 2: %v, want PermissionDenied", err)
		}
	})
	t.Run("a node outside the configured peers", func(t *testing.T) {
		if err := call(ca.source(t, "node99", pki.NodeIdentity(99)), 99); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node 99: %v, want PermissionDenied", err)
		}
	})
	t.Run("a certificate of another CA", func(t *testing.T) {
		other := newTestCA(t)
		is, err := other.ca.Issue(pki.NodeIdentity(2), nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		// The forger trusts any server; the server must not trust it.
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = raftv1.NewRaftServiceClient(cc).Probe(metadataContext(t.Context(), "c1", 2), &raftv1.ProbeRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("a foreign CA's node 2: %v, want the handshake to fail (Unavailable)", err)
		}
	})
	t.Run("its own certificate", func(t *testing.T) {
		// Authenticated, the call reaches the service (which has no probe
		// function here).
		if err := call(ca.source(t, "node3", pki.NodeIdentity(3)), 3); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "probe is not available") {
			t.Fatalf("node 3 as itself: %v", err)
		}
	})
	t.Run("raft messages in another node's name", func(t *testing.T) {
		before := tr1.Stats().BadMessages
		c := forged(t, addr, ca.source(t, "node3", pki.NodeIdentity(3)))
		s, err := c.Stream(metadataContext(t.Context(), "c1", 3))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		b, _ := marshal(msg(pb.MessageType_MsgVote, 2, 1))
		if err := s.Send(&raftv1.MessageBatch{Messages: []*raftv1.GroupMessage{{GroupId: 0, Message: b}}}); err != nil {
			t.Fatal(err)
		}
		await.True(t, "the forged vote counted as bad", func() bool { return tr1.Stats().BadMessages == before+1 })
		for _, st := range host1.stepped() {
			if st.m.GetType() == pb.MessageType_MsgVote {
				t.Fatal("a vote in node 2's name from node 3 was stepped")
			}
		}
		_ = s.CloseSend()
	})
}

// tlsListener runs the cluster-plane TLS of tr on lis.
func tlsListener(lis net.Listener, tr *Transport) net.Listener {
	return tls.NewListener(lis, tr.ServerTLS())
}
