package node

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/internal/pki"
	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

const (
	gatewayToken = "gateway-token-0123456789abcdefghijklmnop"
	clientToken  = "client-token-0123456789abcdefghijklmnopq"
	coldgcToken  = "coldgc-token-0123456789abcdefghijklmnopq"
	backupToken  = "backup-token-0123456789abcdefghijklmnopq"
)

func writeClientTokens(tb testing.TB, content string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "client.tokens")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestClientAuthorization(t *testing.T) {
	cfg := testConfig("127.0.0.1:0", "")
	cfg.ClientTokenFile = writeClientTokens(t, "# roles\ngateway "+gatewayToken+"\nclient "+clientToken+"\n\ncoldgc "+coldgcToken+"\nbackup "+backupToken+"\n")
	a, err := newClientAuth(cfg, "", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	withToken := func(tok string) context.Context {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}})
		if tok == "" {
			return ctx
		}
		return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
	}
	create := "/" + streamServiceName + "/CreateStream"
	ack := "/" + coldGCServiceName + "/AckGC"
	importGroup := "/" + backupServiceName + "/ImportGroup"
	export := "/" + backupServiceName + "/ExportGroup"
	reflect := "/" + reflectionV1Name + "/ServerReflectionInfo"
	reflectAlpha := "/" + reflectionV1AlphaName + "/ServerReflectionInfo"
	healthCheck := "/" + healthServiceName + "/Check"
	user := &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "tenant", Stream: "s"}}
	reserved := &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "__system", Stream: "s"}}
	forkOfReserved := &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "tenant", Stream: "f"},
		Fork: &streamv1.ForkSpec{Source: &streamv1.StreamRef{Bucket: "__ds", Stream: "s"}}}
	for _, tc := range []struct {
		name   string
		token  string
		method string
		req    any
		want   codes.Code
	}{
		{"no credentials", "", create, user, codes.Unauthenticated},
		{"a wrong token", strings.Repeat("x", 40), create, user, codes.Unauthenticated},
		{"gateway, reserved bucket", gatewayToken, create, reserved, codes.OK},
		{"gateway, cold-GC service", gatewayToken, ack, &coldgcv1.AckGCRequest{}, codes.PermissionDenied},
		{"client, user bucket", clientToken, create, user, codes.OK},
		{"client, reserved bucket", clientToken, create, reserved, codes.PermissionDenied},
		{"client, fork of a reserved stream", clientToken, create, forkOfReserved, codes.PermissionDenied},
		{"client, cold-GC service", clientToken, ack, &coldgcv1.AckGCRequest{}, codes.PermissionDenied},
		{"coldgc, cold-GC service", coldgcToken, ack, &coldgcv1.AckGCRequest{}, codes.OK},
		{"coldgc, stream service", coldgcToken, create, user, codes.PermissionDenied},
		{"backup, backup service", backupToken, importGroup, &backupv1.ImportGroupRequest{}, codes.OK},
		{"backup, an export", backupToken, export, &backupv1.ExportGroupRequest{}, codes.OK},
		{"backup, stream service", backupToken, create, user, codes.PermissionDenied},
		{"backup, cold-GC service", backupToken, ack, &coldgcv1.AckGCRequest{}, codes.PermissionDenied},
		{"gateway, backup service", gatewayToken, importGroup, &backupv1.ImportGroupRequest{}, codes.PermissionDenied},
		{"client, backup service", clientToken, export, &backupv1.ExportGroupRequest{}, codes.PermissionDenied},
		{"coldgc, backup service", coldgcToken, export, &backupv1.ExportGroupRequest{}, codes.PermissionDenied},
		{"nobody, backup service", "", export, &backupv1.ExportGroupRequest{}, codes.Unauthenticated},
		{"the admin service", gatewayToken, "/ursula.admin.v1.AdminService/GetReady", nil, codes.PermissionDenied},
		{"an unknown service", gatewayToken, "/no.such.Service/Call", nil, codes.PermissionDenied},
		// Reflection asks for what the plane asks for: some role.
		{"reflection without credentials", "", reflect, nil, codes.Unauthenticated},
		{"reflection with a wrong token", strings.Repeat("x", 40), reflect, nil, codes.Unauthenticated},
		{"reflection, client", clientToken, reflect, nil, codes.OK},
		{"reflection v1alpha, coldgc", coldgcToken, reflectAlpha, nil, codes.OK},
		// Health needs no credentials, and checks those it is given.
		{"health without credentials", "", healthCheck, nil, codes.OK},
		{"health with a wrong token", strings.Repeat("x", 40), healthCheck, nil, codes.Unauthenticated},
		{"health, backup", backupToken, healthCheck, nil, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(a.authorize(withToken(tc.token), tc.method, tc.req)); got != tc.want {
				t.Fatalf("authorize = %v, want %v", got, tc.want)
			}
		})
	}
	if a.refusals.Load() == 0 {
		t.Error("refusals not counted")
	}

	t.Run("the in-process gateway's token", func(t *testing.T) {
		const local = "in-process-gateway-token-0123456789abcdef"
		b, err := newClientAuth(testConfig("127.0.0.1:0", ""), local, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := status.Code(b.authorize(withToken(local), create, reserved)); got != codes.OK {
			t.Errorf("the process's gateway on a reserved bucket: %v", got)
		}
		if got := status.Code(b.authorize(withToken(gatewayToken), create, user)); got != codes.Unauthenticated {
			t.Errorf("another token: %v, want Unauthenticated", got)
		}
	})
	t.Run("anonymous clients", func(t *testing.T) {
		b, err := newClientAuth(testConfig("127.0.0.1:0", ""), "", testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := status.Code(b.authorize(withToken(""), create, user)); got != codes.OK {
			t.Errorf("anonymous on a user bucket: %v", got)
		}
		if got := status.Code(b.authorize(withToken(""), create, reserved)); got != codes.PermissionDenied {
			t.Errorf("anonymous on a reserved bucket: %v", got)
		}
	})
	t.Run("a certificate proves a role", func(t *testing.T) {
		// The certificate path is exercised end to end in the e2e tier;
		// here the identity of a role certificate reaches the same table.
		if r, how := a.caller(withToken(gatewayToken)); r != pki.RoleGateway || how != "token" {
			t.Errorf("caller = %s %s", r, how)
		}
	})
}

func TestClientTokenFileRules(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"unknown role", "admin " + gatewayToken + "\n", "not one of"},
		{"short token", "gateway short\n", "at least 32"},
		{"no token", "gateway\n", "want"},
		{"empty", "# nothing\n", "no token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("127.0.0.1:0", "")
			cfg.ClientTokenFile = writeClientTokens(t, tc.content)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), gatewayToken) {
				t.Fatalf("Validate = %v, want an error about %q without the token", err, tc.want)
			}
		})
	}
	cfg := testConfig("0.0.0.0:4437", "")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "authenticates nobody") {
		t.Errorf("an anonymous non-loopback client plane: %v", err)
	}
	cfg.AllowAnonymousClients = true
	if err := cfg.Validate(); err != nil {
		t.Errorf("allowed explicitly: %v", err)
	}
}
