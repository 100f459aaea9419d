package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/internal/pki"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// forger dials a node's cluster plane as whoever its TLS configuration
// makes it, naming itself node claim of the cluster in the metadata.
type forger struct {
	conn      *grpc.ClientConn
	clusterID string
	claim     uint64
}

func newForger(t *testing.T, addr string, cfg *tls.Config, clusterID string, claim uint64) *forger {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return &forger{conn: cc, clusterID: clusterID, claim: claim}
}

func (f *forger) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "ursula-cluster-id", f.clusterID, "ursula-node-id", strconv.FormatUint(f.claim, 10))
}

func (f *forger) propose(ctx context.Context, req *raftv1.ForwardProposeRequest) (*raftv1.ForwardProposeResponse, error) {
	return raftv1.NewForwardServiceClient(f.conn).Propose(f.ctx(ctx), req)
}

// certConfig is a client TLS configuration presenting a certificate of ca
// for id that trusts any server (a forger need not check who it talks to).
func certConfig(t *testing.T, ca *pki.CA, id pki.Identity) *tls.Config {
	t.Helper()
	is, err := ca.Issue(id, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}
}

// TestTrustBoundaries attacks a 3-node cluster's cluster plane the way the
// findings did (a made-up node, a forwarded Expire and a rebuild request
// for a healthy voter) and with what mutual TLS adds (a certificate of
// another CA, one of another node, a valid peer sending what nodes never
// forward); then the client plane as callers proving no role or the wrong
// one, and the admin plane without the token or for another host name.
// Every attempt is refused, counted, and changes nothing; the nodes stay
// ready and every acknowledged byte reads back.
func TestTrustBoundaries(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Gateway: true})
	ctx := t.Context()
	hc, gw := c.Client().HTTP, c.GatewayURL()
	body := []byte("acknowledged bytes\n")
	if r := mustDo(ctx, t, hc, http.MethodPut, gw+"/v1/stream/victim", http.Header{"Content-Type": {"text/plain"}}, body); r.Status != http.StatusCreated {
		t.Fatalf("create: %v", r)
	}
	readBack := func(when string) {
		t.Helper()
		r := mustDo(ctx, t, hc, http.MethodGet, gw+"/v1/stream/victim?offset=-1", nil, nil)
		if r.Status != http.StatusOK || !bytes.Equal(r.Body, body) {
			t.Fatalf("%s: read back %v", when, r)
		}
	}
	g := stream.GroupOf(DSBucket, "victim", 16)
	leader, err := c.Leader(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	addr := leader.Config.ClusterListen
	other := c.Nodes[0]
	if other == leader {
		other = c.Nodes[1]
	}
	third := c.Nodes[0]
	for _, n := range c.Nodes {
		if n != leader && n != other {
			third = n
		}
	}
	before, err := leader.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expire := &storagev1.Expire{Bucket: DSBucket, Stream: "victim", Incarnation: 1}

	t.Run("a certificate of another CA", func(t *testing.T) {
		foreign, err := pki.NewCA("intruder", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		f := newForger(t, addr, certConfig(t, foreign, pki.NodeIdentity(other.ID)), c.ID, other.ID)
		_, err = f.propose(ctx, &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{Bucket: DSBucket}}})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("a foreign CA's certificate: %v, want the handshake refused", err)
		}
		await.True(t, "the handshake refusal counted", func() bool {
			m, err := leader.Metrics(ctx)
			return err == nil && m.TLSHandshakeRefusals > before.TLSHandshakeRefusals
		})
	})
	t.Run("no certificate", func(t *testing.T) {
		f := newForger(t, addr, &tls.Config{InsecureSkipVerify: true}, c.ID, other.ID)
		if _, err := raftv1.NewRaftServiceClient(f.conn).Probe(f.ctx(ctx), &raftv1.ProbeRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("no client certificate: %v, want the handshake refused", err)
		}
	})
	t.Run("a made-up node", func(t *testing.T) {
		f := newForger(t, addr, certConfig(t, c.CA, pki.NodeIdentity(99)), c.ID, 99)
		if _, err := f.propose(ctx, &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{Bucket: DSBucket}}}); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node 99: %v, want PermissionDenied", err)
		}
	})
	t.Run("the certificate of another node", func(t *testing.T) {
		f := newForger(t, addr, certConfig(t, c.CA, pki.NodeIdentity(third.ID)), c.ID, other.ID)
		_, err := raftv1.NewForwardServiceClient(f.conn).RequestRebuild(f.ctx(ctx), &raftv1.RequestRebuildRequest{GroupId: g, NodeId: other.ID})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node %d as node %d: %v, want PermissionDenied", third.ID, other.ID, err)
		}
		if m, err := leader.Metrics(ctx); err != nil || m.UnauthenticatedPeerRefusals <= before.UnauthenticatedPeerRefusals {
			t.Fatalf("unauthenticated refusals not counted: %v %+v", err, m)
		}
	})
	// From here on the forger holds a valid certificate of the node it
	// names: a compromised or buggy peer.
	peer := newForger(t, addr, certConfig(t, c.CA, pki.NodeIdentity(other.ID)), c.ID, other.ID)
	t.Run("a rebuild of a healthy voter", func(t *testing.T) {
		resp, err := raftv1.NewForwardServiceClient(peer.conn).RequestRebuild(peer.ctx(ctx), &raftv1.RequestRebuildRequest{GroupId: g, NodeId: third.ID})
		if err != nil || resp.GetError().GetKind() != "PERMISSION_DENIED" || resp.GetDone() {
			t.Fatalf("rebuild of node %d asked by node %d: %v %v, want PERMISSION_DENIED", third.ID, other.ID, resp, err)
		}
	})
	t.Run("a forwarded command as bytes", func(t *testing.T) {
		// The old wire form: field 2 carried an encoded Command (here an
		// Expire of the stream). The leader no longer reads it.
		cmd, err := proto.Marshal(&storagev1.Command{Op: &storagev1.Command_Expire{Expire: expire}})
		if err != nil {
			t.Fatal(err)
		}
		raw := protowire.AppendTag(nil, 1, protowire.VarintType)
		raw = protowire.AppendVarint(raw, uint64(g))
		raw = protowire.AppendTag(raw, 2, protowire.BytesType)
		raw = protowire.AppendBytes(raw, cmd)
		var resp raftv1.ForwardProposeResponse
		if err := peer.conn.Invoke(peer.ctx(ctx), "/ursula.raft.v1.ForwardService/Propose", rawMessage(raw), &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
			t.Fatal(err)
		}
		if resp.GetError().GetKind() != "INVALID_ARGUMENT" {
			t.Fatalf("a command as bytes: %v, want INVALID_ARGUMENT", &resp)
		}
	})
	t.Run("a key of another group", func(t *testing.T) {
		wrong := (g + 1) % 16
		resp, err := peer.propose(ctx, &raftv1.ForwardProposeRequest{GroupId: wrong, Op: &raftv1.ForwardProposeRequest_ReleaseForkRef{
			ReleaseForkRef: &storagev1.ReleaseForkRef{Bucket: DSBucket, Stream: "victim", Incarnation: 1}}})
		if err == nil && resp.GetError().GetKind() != "INVALID_ARGUMENT" && resp.GetError().GetKind() != "NOT_LEADER" {
			t.Fatalf("a key of group %d in group %d: %v, want a refusal", g, wrong, resp)
		}
	})
	t.Run("a compaction pointing at another stream's object", func(t *testing.T) {
		resp, err := peer.propose(ctx, &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_ColdSwap{ColdSwap: &storagev1.ColdSwap{
			Bucket: DSBucket, Stream: "victim", Incarnation: 1,
			Replaced: []*storagev1.ColdRef{{Key: "a"}, {Key: "b"}},
			Chunk:    &storagev1.ColdRef{Key: "other-bucket/other/1/chunk"},
		}}})
		if err != nil || resp.GetError().GetKind() != "INVALID_ARGUMENT" {
			t.Fatalf("a swap to another prefix: %v %v, want INVALID_ARGUMENT", resp, err)
		}
	})
	readBack("after the forged calls")
	voters := func() []uint64 {
		m, err := leader.Metrics(ctx)
		if err != nil || m.Group(g) == nil {
			return nil
		}
		return slices.Sorted(slices.Values(m.Group(g).Voters))
	}
	if got := voters(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("voters of group %d after the forged rebuild: %v", g, got)
	}
	for _, n := range c.Nodes {
		r, err := n.Readiness(ctx)
		if err != nil || !r.Ready {
			t.Fatalf("node %d after the forged calls: %+v %v", n.ID, r, err)
		}
	}

	t.Run("client plane", func(t *testing.T) { clientPlaneProbes(t, c, leader) })
	t.Run("admin plane", func(t *testing.T) {
		url := "http://" + leader.Config.AdminListen + "/__ursula/leadership-shed/maintenance"
		m, _ := leader.Metrics(ctx)
		inc := http.Header{"X-Ursula-Process-Incarnation": {m.ProcessIncarnation}}
		if r := mustDo(ctx, t, hc, http.MethodPost, url, inc, nil); r.Status != http.StatusUnauthorized {
			t.Fatalf("a drain without the admin token: %v, want 401", r)
		}
		if r := mustDo(ctx, t, hc, http.MethodGet, "http://"+leader.Config.AdminListen+"/__ursula/metrics", http.Header{"Host": {"rebound.example"}}, nil); r.Status != http.StatusForbidden {
			t.Fatalf("a read for another host name: %v, want 403", r)
		}
		if r := mustDo(ctx, t, hc, http.MethodGet, "http://"+leader.Config.AdminListen+"/__ursula/metrics", nil, nil); r.Status != http.StatusOK {
			t.Fatalf("a loopback read without the token: %v, want 200", r)
		}
	})

	readBack("after every probe")
}

// clientPlaneProbes calls a node's client plane as callers that prove
// nothing, or the wrong role.
func clientPlaneProbes(t *testing.T, c *Cluster, n *Node) {
	ctx := t.Context()
	caOnly, err := pki.Load(pki.Files{CAFile: c.ClientPlane(pki.RoleGateway).TLS.CAFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(cfg *tls.Config) *grpc.ClientConn {
		cc, err := grpc.NewClient(n.ClientAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	anon := dial(caOnly.ClientConfig(pki.ExpectAnyNode))
	coldgc := dial(certConfig(t, c.CA, pki.RoleIdentity(pki.RoleColdGC)))
	gateway := dial(certConfig(t, c.CA, pki.RoleIdentity(pki.RoleGateway)))
	sys := &streamv1.StreamRef{Bucket: "__system", Stream: "probe"}
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"anonymous create in a reserved bucket", func() error {
			_, err := streamv1.NewStreamServiceClient(anon).CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: sys})
			return err
		}, codes.Unauthenticated},
		{"anonymous read", func() error {
			_, err := streamv1.NewStreamServiceClient(anon).Read(ctx, &streamv1.ReadRequest{Ref: &streamv1.StreamRef{Bucket: DSBucket, Stream: "victim"}})
			return err
		}, codes.Unauthenticated},
		{"anonymous cold-GC acknowledgement", func() error {
			_, err := coldgcv1.NewColdGCServiceClient(anon).AckGC(ctx, &coldgcv1.AckGCRequest{Seqs: []uint64{1}})
			return err
		}, codes.Unauthenticated},
		{"the cold-GC worker on the stream service", func() error {
			_, err := streamv1.NewStreamServiceClient(coldgc).CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: sys})
			return err
		}, codes.PermissionDenied},
		{"the gateway on the cold-GC service", func() error {
			_, err := coldgcv1.NewColdGCServiceClient(gateway).CommitCompaction(ctx, &coldgcv1.CommitCompactionRequest{})
			return err
		}, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	ln, err := c.Leader(ctx, stream.GroupOf(sys.Bucket, sys.Stream, 16))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ln.StreamClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Head(ctx, &streamv1.HeadRequest{Ref: sys}); status.Code(err) != codes.NotFound {
		t.Fatalf("a HEAD of the stream the refused calls named: %v, want NotFound", err)
	}
	m, err := n.Metrics(ctx)
	if err != nil || m.ClientAuthRefusals < 5 {
		t.Fatalf("client_auth_refusals %+v %v, want at least 5", m, err)
	}
}

// rawMessage is a request sent as the bytes it holds (rawCodec).
type rawMessage []byte

// rawCodec sends a rawMessage as it is and decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("rawCodec: %T", v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }
