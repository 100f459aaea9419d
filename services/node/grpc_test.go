//lint:file-ignore SA1019 the tests check that the deprecated v1alpha reflection is still served: grpcurl and older clients ask it first.

package node

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/internal/pki"
	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

// runNode serves a node on free loopback ports (then changed by mutate)
// with cfg's other settings until the test ends.
func runNode(t *testing.T, cfg Config, mutate ...func(*Config)) *Server {
	t.Helper()
	eng := startEngine(t)
	cfg.Listen, cfg.AdminListen = freeAddr(t), freeAddr(t)
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(cfg, eng, Deps{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return s
}

// dial connects to addr over plaintext gRPC with opts.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// listServices asks a server's reflection (v1) for its services.
func listServices(ctx context.Context, conn *grpc.ClientConn) ([]string, error) {
	st, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.CloseSend() }()
	if err := st.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	slices.Sort(names)
	return names, nil
}

// symbolKnown asks a server's reflection (v1alpha) for the file defining
// symbol: nil when it answers with one.
func symbolKnown(ctx context.Context, conn *grpc.ClientConn, symbol string) error {
	st, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = st.CloseSend() }()
	if err := st.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
		return err
	}
	resp, err := st.Recv()
	if err != nil {
		return err
	}
	if e := resp.GetErrorResponse(); e != nil {
		return status.Error(codes.Code(e.GetErrorCode()), e.GetErrorMessage())
	}
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		return errors.New("no file")
	}
	return nil
}

func TestReflectionSetting(t *testing.T) {
	for _, tc := range []struct {
		setting, addr string
		want          reflectionScope
	}{
		{"", "127.0.0.1:4437", reflectionAll},
		{"loopback", "[::1]:4437", reflectionAll},
		{"loopback", "localhost:4437", reflectionAll},
		{"", "0.0.0.0:4437", reflectionLoopbackCallers},
		{"loopback", ":4437", reflectionLoopbackCallers},
		{"loopback", "[::]:4437", reflectionLoopbackCallers},
		{"loopback", "10.0.0.7:4437", reflectionNone},
		{"loopback", "node1.example:4437", reflectionNone},
		{"on", "0.0.0.0:4437", reflectionAll},
		{"on", "10.0.0.7:4437", reflectionAll},
		{"off", "127.0.0.1:4437", reflectionNone},
	} {
		cfg := Config{GRPCReflection: tc.setting}
		if got := cfg.reflection(tc.addr); got != tc.want {
			t.Errorf("server.grpc_reflection=%q on %s: %v, want %v", tc.setting, tc.addr, got, tc.want)
		}
	}
	for _, tc := range []struct {
		addr net.Addr
		want codes.Code
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, codes.OK},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, codes.OK},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}, codes.Unimplemented},
		{&net.UnixAddr{Name: "/tmp/x", Net: "unix"}, codes.Unimplemented},
	} {
		ctx := peer.NewContext(t.Context(), &peer.Peer{Addr: tc.addr})
		if got := status.Code(loopbackCaller(ctx)); got != tc.want {
			t.Errorf("reflection for a caller at %v: %v, want %v", tc.addr, got, tc.want)
		}
	}
	if got := status.Code(loopbackCaller(t.Context())); got != codes.Unimplemented {
		t.Errorf("reflection for a caller of unknown address: %v", got)
	}
	cfg := testConfig("127.0.0.1:0", "127.0.0.1:0")
	cfg.GRPCReflection = "yes"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "server.grpc_reflection") {
		t.Errorf("Validate of an unknown value: %v", err)
	}
}

// TestGRPCReflection: on loopback listeners both planes answer reflection
// by default, for their own services only; "off" turns it off.
func TestGRPCReflection(t *testing.T) {
	t.Run("loopback by default", func(t *testing.T) {
		s := runNode(t, testConfig("", ""))
		client, admin := dial(t, s.cfg.Listen), dial(t, s.cfg.AdminListen)
		var got []string
		await.True(t, "client-plane reflection", func() bool {
			var err error
			got, err = listServices(t.Context(), client)
			return err == nil
		})
		want := []string{"grpc.health.v1.Health", reflectionV1Name, reflectionV1AlphaName,
			"ursula.backup.v1.BackupService", "ursula.coldgc.v1.ColdGCService", "ursula.stream.v1.StreamService"}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("client plane lists %v, want %v", got, want)
		}
		got, err := listServices(t.Context(), admin)
		if err != nil {
			t.Fatalf("admin-plane reflection: %v", err)
		}
		if want := []string{reflectionV1Name, reflectionV1AlphaName, "ursula.admin.v1.AdminService"}; !slices.Equal(got, want) {
			t.Errorf("admin plane lists %v, want %v", got, want)
		}
		for _, tc := range []struct {
			conn   *grpc.ClientConn
			plane  string
			symbol string
			known  bool
		}{
			{client, "client", "ursula.stream.v1.StreamService", true},
			{client, "client", "ursula.stream.v1.AppendRequest", true},
			{client, "client", "ursula.admin.v1.AdminService", false},
			{client, "client", "ursula.raft.v1.RaftService", false},
			{client, "client", "google.rpc.ErrorInfo", true},
			{client, "client", "ursula.errors.v1.Code", true},
			{admin, "admin", "google.rpc.ErrorInfo", true},
			{admin, "admin", "ursula.admin.v1.AdminService", true},
			{admin, "admin", "ursula.stream.v1.StreamService", false},
		} {
			err := symbolKnown(t.Context(), tc.conn, tc.symbol)
			if (err == nil) != tc.known {
				t.Errorf("%s plane describes %s: %v, want known %v", tc.plane, tc.symbol, err, tc.known)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		cfg := testConfig("", "")
		cfg.GRPCReflection = ReflectionOff
		s := runNode(t, cfg)
		for _, addr := range []string{s.cfg.Listen, s.cfg.AdminListen} {
			conn := dial(t, addr)
			var err error
			await.True(t, "an answer", func() bool {
				_, err = listServices(t.Context(), conn)
				return status.Code(err) != codes.Unavailable
			})
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("reflection on %s with server.grpc_reflection=off: %v, want Unimplemented", addr, err)
			}
		}
	})
	t.Run("a listener of every address", func(t *testing.T) {
		// Loopback callers of a wildcard listener get reflection by default
		// (TestReflectionSetting: others get UNIMPLEMENTED).
		cfg := testConfig("", "")
		cfg.AllowAnonymousClients = true
		s := runNode(t, cfg, func(c *Config) {
			_, port, _ := net.SplitHostPort(c.Listen)
			c.Listen = ":" + port
		})
		_, port, _ := net.SplitHostPort(s.cfg.Listen)
		conn := dial(t, net.JoinHostPort("127.0.0.1", port))
		var got []string
		await.True(t, "reflection over loopback", func() bool {
			var err error
			got, err = listServices(t.Context(), conn)
			return err == nil
		})
		if !slices.Contains(got, streamServiceName) {
			t.Errorf("lists %v", got)
		}
	})
	t.Run("behind client authentication", func(t *testing.T) {
		cfg := testConfig("", "")
		cfg.ClientTokenFile = writeClientTokens(t, "client "+clientToken+"\n")
		s := runNode(t, cfg)
		conn := dial(t, s.cfg.Listen)
		var err error
		await.True(t, "an answer", func() bool {
			_, err = listServices(t.Context(), conn)
			return status.Code(err) != codes.Unavailable
		})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("reflection without credentials: %v, want Unauthenticated", err)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+clientToken)
		if got, err := listServices(ctx, conn); err != nil || !slices.Contains(got, streamServiceName) {
			t.Fatalf("reflection with a client token: %v, %v", got, err)
		}
	})
}

// TestGRPCHealth: grpc.health.v1 follows readiness, on Check and Watch,
// without credentials even where the client plane requires them.
func TestGRPCHealth(t *testing.T) {
	cfg := testConfig("", "")
	cfg.ClientTokenFile = writeClientTokens(t, "client "+clientToken+"\n")
	s := runNode(t, cfg)
	h := healthv1.NewHealthClient(dial(t, s.cfg.Listen))
	ctx := t.Context()
	// The listener may not accept yet: wait for it rather than fail.
	watch, err := h.Watch(ctx, &healthv1.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	// next waits for the next status Watch reports.
	next := func(want healthv1.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if resp.GetStatus() == want {
				return
			}
		}
	}
	check := func(service string, want healthv1.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := h.Check(ctx, &healthv1.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != want {
			t.Fatalf("Check(%q) = %v, %v; want %v", service, resp.GetStatus(), err, want)
		}
	}
	next(healthv1.HealthCheckResponse_SERVING)
	check("", healthv1.HealthCheckResponse_SERVING)
	check(streamServiceName, healthv1.HealthCheckResponse_SERVING)

	s.setReady(false) // as before the engine reported ready
	next(healthv1.HealthCheckResponse_NOT_SERVING)
	check(streamServiceName, healthv1.HealthCheckResponse_NOT_SERVING)
	s.setReady(true)
	next(healthv1.HealthCheckResponse_SERVING)

	if _, err := h.Check(ctx, &healthv1.HealthCheckRequest{Service: "ursula.admin.v1.AdminService"}); status.Code(err) != codes.NotFound {
		t.Errorf("Check of a service the plane does not serve: %v, want NotFound", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.Repeat("x", 40))
	if _, err := h.Check(bad, &healthv1.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Check with a wrong token: %v, want Unauthenticated", err)
	}
	// The data service still needs credentials.
	streams := streamv1.NewStreamServiceClient(dial(t, s.cfg.Listen))
	if _, err := streams.GetClusterInfo(ctx, &streamv1.GetClusterInfoRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("StreamService without credentials: %v, want Unauthenticated", err)
	}
}

// TestAdminGRPC: AdminService over gRPC on the admin listener asks for
// what its REST routes ask for, and audits mutations the same way.
func TestAdminGRPC(t *testing.T) {
	cfg := testConfig("", "")
	cfg.AdminTokenFile = writeTokenFile(t, testToken+"\n", 0o600)
	s := runNode(t, cfg)
	admin := adminv1.NewAdminServiceClient(dial(t, s.cfg.AdminListen))
	rebound := adminv1.NewAdminServiceClient(dial(t, s.cfg.AdminListen, grpc.WithAuthority("rebound.example:4438")))
	const wrong = "not-the-token-but-just-as-long-0123456789"
	md := func(kv ...string) context.Context {
		return metadata.NewOutgoingContext(t.Context(), metadata.Pairs(kv...))
	}
	auth := "Bearer " + testToken
	inc := s.Incarnation()
	await.True(t, "admin plane up", func() bool {
		_, err := admin.GetReady(t.Context(), &adminv1.GetReadyRequest{})
		return status.Code(err) != codes.Unavailable
	})
	drain := func(c adminv1.AdminServiceClient) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.StartMaintenanceDrain(ctx, &adminv1.StartMaintenanceDrainRequest{})
			return err
		}
	}
	read := func(ctx context.Context) error {
		_, err := admin.GetReady(ctx, &adminv1.GetReadyRequest{})
		return err
	}
	for _, tc := range []struct {
		name       string
		call       func(context.Context) error
		ctx        context.Context
		wantCode   codes.Code
		wantReason string
	}{
		{"read on loopback without a token", read, t.Context(), codes.OK, ""},
		{"read with another token", read, md("authorization", "Bearer "+wrong), codes.Unauthenticated, "UNAUTHENTICATED"},
		{"read with the token as basic credentials", read, md("authorization", "Basic "+testToken), codes.Unauthenticated, "UNAUTHENTICATED"},
		{"another site's authority", func(ctx context.Context) error {
			_, err := rebound.GetReady(ctx, &adminv1.GetReadyRequest{})
			return err
		}, t.Context(), codes.PermissionDenied, "PERMISSION_DENIED"},
		{"mutation from another site's authority", drain(rebound), md("authorization", auth, IncarnationHeader, inc), codes.PermissionDenied, "PERMISSION_DENIED"},
		{"mutation without a token", drain(admin), md(IncarnationHeader, inc), codes.Unauthenticated, "UNAUTHENTICATED"},
		{"mutation without the incarnation", drain(admin), md("authorization", auth), codes.FailedPrecondition, "INCARNATION_REQUIRED"},
		{"mutation of another incarnation", drain(admin), md("authorization", auth, IncarnationHeader, "old"), codes.FailedPrecondition, "INCARNATION_MISMATCH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(tc.ctx)
			st := status.Convert(err)
			if st.Code() != tc.wantCode {
				t.Fatalf("answer %v, want %v", err, tc.wantCode)
			}
			if strings.Contains(st.Message(), testToken) || strings.Contains(st.Message(), wrong) {
				t.Errorf("answer echoes a token: %v", err)
			}
			if tc.wantReason != "" && errorReason(st) != tc.wantReason {
				t.Errorf("reason %q, want %q (%v)", errorReason(st), tc.wantReason, err)
			}
			if s.n.Cluster.Draining() {
				t.Fatal("a refused call turned the drain on")
			}
		})
	}
	ctx := md("authorization", auth, IncarnationHeader, inc, ActorHeader, "alice", ReasonHeader, "grpc test")
	if st, err := admin.StartMaintenanceDrain(ctx, &adminv1.StartMaintenanceDrainRequest{}); err != nil || !s.n.Cluster.Draining() || st.GetState() == "" {
		t.Fatalf("authorized drain: %v, %v (draining %v)", st, err, s.n.Cluster.Draining())
	}
	if _, err := admin.TakeSnapshot(ctx, &adminv1.TakeSnapshotRequest{GroupId: 99}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a snapshot of a group that does not exist: %v, want InvalidArgument", err)
	}

	// The audit trail holds the authenticated mutations with their
	// outcomes: the two incarnation refusals, the drain, the bad group.
	recs, err := s.audit.tail(100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, raw := range recs {
		var r AuditRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.Operation, grpcOperationPrefix) || r.Auth != "token" || r.PeerAddress == "" || r.ProcessIncarnation != inc {
			t.Errorf("record %+v", r)
		}
		got = append(got, strings.TrimPrefix(r.Operation, grpcOperationPrefix+"/ursula.admin.v1.AdminService/")+" "+r.Code+" "+r.Actor)
	}
	want := []string{"StartMaintenanceDrain INCARNATION_REQUIRED ", "StartMaintenanceDrain INCARNATION_MISMATCH ",
		"StartMaintenanceDrain  alice", "TakeSnapshot INVALID_ARGUMENT alice"}
	if !slices.Equal(got, want) {
		t.Errorf("audit operations %q, want %q", got, want)
	}
	if n := s.adminAuthRefusals.Load(); n != 3 {
		t.Errorf("admin_auth_refusals = %d, want the 3 unauthenticated calls", n)
	}
}

// errorReason is the Ursula ErrorInfo reason of a status, or "".
func errorReason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == "ursula" {
			return info.GetReason()
		}
	}
	return ""
}

// TestAdminGRPCOverTLS: on a TLS admin plane, an operator certificate
// authenticates gRPC calls and HTTP requests alike (the listener
// terminates TLS before it tells them apart), and any other certificate
// authenticates neither.
func TestAdminGRPCOverTLS(t *testing.T) {
	ca, err := pki.NewCA("admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	issue := func(id pki.Identity, name string) pki.Files {
		is, err := ca.Issue(id, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		files, err := is.Save(dir, name, caFile)
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	cfg := testConfig("", "")
	cfg.AdminTLS = issue(pki.NodeIdentity(1), "node1")
	s := runNode(t, cfg)
	tlsFor := func(files pki.Files) *tls.Config {
		src, err := pki.Load(files, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		return src.ClientConfig(nil)
	}
	operator, gateway := tlsFor(issue(pki.RoleIdentity(pki.RoleOperator), "operator")), tlsFor(issue(pki.RoleIdentity(pki.RoleGateway), "gateway"))
	inc := s.Incarnation()
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		want codes.Code
	}{
		{"another role's certificate", gateway, codes.Unauthenticated},
		{"an operator certificate", operator, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(s.cfg.AdminListen, grpc.WithTransportCredentials(credentials.NewTLS(tc.tls)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := metadata.AppendToOutgoingContext(t.Context(), IncarnationHeader, inc)
			var err2 error
			await.True(t, "an answer", func() bool {
				_, err2 = adminv1.NewAdminServiceClient(conn).StopMaintenanceDrain(ctx, &adminv1.StopMaintenanceDrainRequest{})
				return status.Code(err2) != codes.Unavailable
			})
			if status.Code(err2) != tc.want {
				t.Fatalf("gRPC mutation: %v, want %v", err2, tc.want)
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.tls.Clone()}}
			defer hc.CloseIdleConnections()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, "https://"+s.cfg.AdminListen+"/__ursula/leadership-shed/maintenance", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(IncarnationHeader, inc)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if wantHTTP := map[codes.Code]int{codes.OK: http.StatusOK, codes.Unauthenticated: http.StatusUnauthorized}[tc.want]; resp.StatusCode != wantHTTP {
				t.Fatalf("HTTP mutation: %d, want %d", resp.StatusCode, wantHTTP)
			}
		})
	}
}

// TestAdminGRPCMethodsMatchREST: the methods adminReadOnly lets through
// without the mutation rules are exactly those whose REST mapping is a
// GET, and every method has a mapping.
func TestAdminGRPCMethodsMatchREST(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "proto", "ursula", "admin", "v1", "admin_http.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	verbs := map[string]string{} // full method name -> HTTP verb
	selector := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "- selector: "); ok {
			svc, method, _ := strings.Cut(strings.TrimPrefix(v, "ursula.admin.v1."), ".")
			selector = "/ursula.admin.v1." + svc + "/" + method
			continue
		}
		for _, verb := range []string{"get", "post", "put", "patch", "delete"} {
			if strings.HasPrefix(line, verb+":") && selector != "" {
				verbs[selector] = verb
				selector = ""
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range adminv1.AdminService_ServiceDesc.Methods {
		full := "/" + adminv1.AdminService_ServiceDesc.ServiceName + "/" + m.MethodName
		verb, ok := verbs[full]
		if !ok {
			t.Errorf("%s has no REST mapping in admin_http.yaml", full)
			continue
		}
		if (verb == "get") != adminReadOnly[full] {
			t.Errorf("%s: REST %s, read-only over gRPC %v", full, verb, adminReadOnly[full])
		}
	}
	if len(adminv1.AdminService_ServiceDesc.Streams) != 0 {
		t.Errorf("AdminService has streaming methods, which the admin plane does not serve")
	}
}

// fakeWatch is a Watch stream that reports what it is sent.
type fakeWatch struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan healthv1.HealthCheckResponse_ServingStatus
}

func (f *fakeWatch) Context() context.Context { return f.ctx }

func (f *fakeWatch) Send(r *healthv1.HealthCheckResponse) error {
	f.sent <- r.GetStatus()
	return nil
}

// TestHealthWatchBounds: Watch calls are bounded (health takes no
// credentials), and the node's drain ends those open.
func TestHealthWatchBounds(t *testing.T) {
	draining := make(chan struct{})
	h := newNodeHealth(draining, 1)
	watch := func(ctx context.Context) (*fakeWatch, chan error) {
		f := &fakeWatch{ctx: ctx, sent: make(chan healthv1.HealthCheckResponse_ServingStatus, 4)}
		done := make(chan error, 1)
		go func() { done <- h.Watch(&healthv1.HealthCheckRequest{}, f) }()
		return f, done
	}
	ctx, cancel := context.WithCancel(t.Context())
	first, firstDone := watch(ctx)
	if st := <-first.sent; st != healthv1.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("first status %v, want NOT_SERVING", st)
	}
	_, secondDone := watch(t.Context())
	if err := <-secondDone; status.Code(err) != codes.ResourceExhausted || errorReason(status.Convert(err)) != "LIMIT_EXCEEDED" {
		t.Fatalf("a watcher beyond the bound: %v, want LIMIT_EXCEEDED", err)
	}
	h.set(true)
	if st := <-first.sent; st != healthv1.HealthCheckResponse_SERVING {
		t.Fatalf("after set(true): %v, want SERVING", st)
	}
	cancel()
	if err := <-firstDone; status.Code(err) != codes.Canceled {
		t.Fatalf("first Watch after its caller left: %v", err)
	}
	third, thirdDone := watch(t.Context())
	if st := <-third.sent; st != healthv1.HealthCheckResponse_SERVING {
		t.Fatalf("a watcher admitted once the first left: %v", st)
	}
	close(draining)
	if err := <-thirdDone; err == nil {
		t.Fatal("Watch went on after the drain")
	}
}
