package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/internal/freeport"
)

// grpcurlBinary returns bin/grpcurl ($URSULA_BIN_DIR; make test-e2e builds
// it from the version pinned in tests/tools/go.mod) or one on PATH.
func grpcurlBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(os.Getenv(EnvBinDir), "grpcurl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	p, err := exec.LookPath("grpcurl")
	if err != nil {
		t.Fatalf("no grpcurl: build bin/grpcurl (make bin/grpcurl; make test-e2e does) or put one on PATH")
	}
	return p
}

// grpcurl runs the grpcurl binary in an empty directory (so that it can
// only learn the services from the server's reflection) and returns its
// output and exit error.
func grpcurl(ctx context.Context, t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestGRPCurlFreshNode: grpcurl, with no .proto files, against a fresh
// ursula-node on loopback addresses: reflection lists and describes the
// services of both planes, grpc.health.v1 reports SERVING, a stream is
// written and read over StreamService, an error carries its ErrorInfo
// reason, and an admin mutation over gRPC needs the token and the process
// incarnation. These are the examples of docs/grpc.md.
func TestGRPCurlFreshNode(t *testing.T) {
	bin := grpcurlBinary(t)
	nodeBin, err := Binary("ursula-node")
	if err != nil {
		t.Fatal(err)
	}
	flags, err := DefinedFlags(nodeBin, "server.listen", "server.admin_listen", "server.cluster_listen")
	if err != nil {
		t.Fatal(err)
	}
	node := StartServer(t, Options{Binary: nodeBin, ListenFlags: flags, ReadyFlag: "server.listen"})
	client, admin := node.Addrs["server.listen"], node.Addrs["server.admin_listen"]
	ctx := t.Context()

	run := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := grpcurl(ctx, t, bin, args...)
		if err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	// call runs one method with a JSON request and decodes the answer.
	call := func(t *testing.T, addr, method, req string, headers ...string) map[string]any {
		t.Helper()
		args := []string{"-plaintext"}
		for _, h := range headers {
			args = append(args, "-H", h)
		}
		if req != "" {
			args = append(args, "-d", req)
		}
		out := run(t, append(args, addr, method)...)
		var doc map[string]any
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%s answered %q: %v", method, out, err)
		}
		return doc
	}

	t.Run("list", func(t *testing.T) {
		out := run(t, "-plaintext", client, "list")
		for _, svc := range []string{"ursula.stream.v1.StreamService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
			if !strings.Contains(out, svc+"\n") {
				t.Errorf("client plane list lacks %s:\n%s", svc, out)
			}
		}
		if strings.Contains(out, "AdminService") {
			t.Errorf("the client plane lists AdminService:\n%s", out)
		}
		out = run(t, "-plaintext", admin, "list")
		if !strings.Contains(out, "ursula.admin.v1.AdminService\n") {
			t.Errorf("admin plane list lacks AdminService:\n%s", out)
		}
	})
	t.Run("describe", func(t *testing.T) {
		out := run(t, "-plaintext", client, "describe", "ursula.stream.v1.StreamService")
		for _, want := range []string{"rpc Append ( .ursula.stream.v1.AppendRequest ) returns ( .ursula.stream.v1.AppendResponse );", "rpc Subscribe"} {
			if !strings.Contains(out, want) {
				t.Errorf("describe lacks %q:\n%s", want, out)
			}
		}
		out = run(t, "-plaintext", client, "describe", "ursula.stream.v1.AppendRequest")
		if !strings.Contains(out, "bytes body = 3;") {
			t.Errorf("describe AppendRequest:\n%s", out)
		}
	})
	t.Run("health", func(t *testing.T) {
		for _, req := range []string{"", `{"service":"ursula.stream.v1.StreamService"}`} {
			if doc := call(t, client, "grpc.health.v1.Health/Check", req); doc["status"] != "SERVING" {
				t.Errorf("Check %s: %v, want SERVING", req, doc)
			}
		}
	})
	t.Run("write and read a stream", func(t *testing.T) {
		call(t, client, "ursula.stream.v1.StreamService/CreateBucket", `{"bucket":"demo"}`)
		call(t, client, "ursula.stream.v1.StreamService/CreateStream", `{"ref":{"bucket":"demo","stream":"greetings"},"content_type":"text/plain"}`)
		// "aGVsbG8=" is "hello": bytes fields are base64 in JSON.
		app := call(t, client, "ursula.stream.v1.StreamService/Append", `{"ref":{"bucket":"demo","stream":"greetings"},"content_type":"text/plain","body":"aGVsbG8="}`)
		if app["nextOffset"] == nil {
			t.Fatalf("Append answered %v", app)
		}
		rd := call(t, client, "ursula.stream.v1.StreamService/Read", `{"ref":{"bucket":"demo","stream":"greetings"},"offset":"-1"}`)
		if rd["data"] != "aGVsbG8=" || rd["nextOffset"] != app["nextOffset"] || rd["upToDate"] != true {
			t.Fatalf("Read answered %v, want the appended bytes up to %v", rd, app["nextOffset"])
		}
	})
	t.Run("error details", func(t *testing.T) {
		out, err := grpcurl(ctx, t, bin, "-plaintext", "-d", `{"ref":{"bucket":"demo","stream":"none"}}`, client, "ursula.stream.v1.StreamService/Head")
		if err == nil {
			t.Fatalf("Head of a missing stream succeeded:\n%s", out)
		}
		for _, want := range []string{"Code: NotFound", `"reason": "STREAM_NOT_FOUND"`, `"domain": "ursula"`} {
			if !strings.Contains(out, want) {
				t.Errorf("the error lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("admin", func(t *testing.T) {
		ready := call(t, admin, "ursula.admin.v1.AdminService/GetReady", "")
		inc, _ := ready["processIncarnation"].(string)
		if ready["ready"] != true || inc == "" {
			t.Fatalf("GetReady: %v", ready)
		}
		incH := "x-ursula-process-incarnation: " + inc
		out, err := grpcurl(ctx, t, bin, "-plaintext", "-H", incH, admin, "ursula.admin.v1.AdminService/StartMaintenanceDrain")
		if err == nil || !strings.Contains(out, "Code: Unauthenticated") {
			t.Fatalf("a mutation without the token: %v\n%s", err, out)
		}
		auth := "authorization: " + node.AdminAuth(t)
		out, err = grpcurl(ctx, t, bin, "-plaintext", "-H", auth, admin, "ursula.admin.v1.AdminService/StartMaintenanceDrain")
		if err == nil || !strings.Contains(out, `"reason": "INCARNATION_REQUIRED"`) {
			t.Fatalf("a mutation without the incarnation: %v\n%s", err, out)
		}
		if doc := call(t, admin, "ursula.admin.v1.AdminService/StartMaintenanceDrain", "", auth, incH); doc["state"] == "normal" || doc["state"] == nil {
			t.Fatalf("drain: %v", doc)
		}
		if doc := call(t, admin, "ursula.admin.v1.AdminService/StopMaintenanceDrain", "", auth, incH); doc["state"] != "normal" {
			t.Fatalf("undrain: %v", doc)
		}
	})
}

// TestGRPCurlWildcardNode: an ursula-node whose client plane listens on
// every address (its default, ":4437") serves reflection to grpcurl on the
// same machine by default (server.grpc_reflection = "loopback").
func TestGRPCurlWildcardNode(t *testing.T) {
	bin := grpcurlBinary(t)
	nodeBin, err := Binary("ursula-node")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := freeport.Addrs(1)
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	node := StartServer(t, Options{
		Binary:      nodeBin,
		ListenFlags: []string{"server.admin_listen", "server.cluster_listen"},
		Addrs:       map[string]string{"server.listen": net.JoinHostPort("127.0.0.1", port)},
		ReadyFlag:   "server.listen",
		Args:        []string{"-server.listen=:" + port, "-server.allow_anonymous_clients"},
	})
	out, err := grpcurl(t.Context(), t, bin, "-plaintext", node.Addrs["server.listen"], "list")
	if err != nil || !strings.Contains(out, "ursula.stream.v1.StreamService\n") {
		t.Fatalf("grpcurl list over loopback: %v\n%s", err, out)
	}
}
