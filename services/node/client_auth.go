package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ursula/ursula/internal/pki"
	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// Roles of client-plane callers. A certificate proves one as
// urn:ursula:role:<role> (package pki); a bearer token is bound to one in
// server.client_token_file.
const (
	// roleClient: the stream service on user buckets (names not starting
	// with "__").
	roleClient = "client"
)

// clientRoles are the roles a token may carry.
var clientRoles = []string{pki.RoleGateway, pki.RoleColdGC, pki.RoleBackup, roleClient}

// Fully qualified service names, for the scope check.
var (
	streamServiceName = streamv1.StreamService_ServiceDesc.ServiceName
	coldGCServiceName = coldgcv1.ColdGCService_ServiceDesc.ServiceName
	backupServiceName = backupv1.BackupService_ServiceDesc.ServiceName
)

// clientAuth authenticates and authorizes every call on the client plane's
// gRPC server (not the in-process connection: the roles sharing the node's
// process are the node). Callers prove a role with a client certificate of
// the client CA or a bearer token; the role decides what they reach:
//
//   - gateway: the stream service, reserved ("__") buckets included;
//   - coldgc: the cold-GC service only;
//   - backup: the backup service only (exports, holds on the cold GC,
//     imports: the backup service, ursula-backup);
//   - client: the stream service on user buckets.
//
// A caller that proves nothing is refused (UNAUTHENTICATED) when client
// authentication is configured, and otherwise, or with
// allow_anonymous_clients, is a client.
//
// Two services are not the data's: server reflection
// (server.grpc_reflection) answers any caller with a role, whichever it
// is, and refuses the others as the data services do; grpc.health.v1
// needs no credentials (it says only whether the node is ready, for load
// balancers and kubelet probes, which carry none), but credentials a
// caller presents are checked there too: a bad token is refused, not
// taken for anonymity.
type clientAuth struct {
	tokens *tokenFile // nil without server.client_token_file
	// local is the digest of the token this process's own gateway sends
	// when it calls the node over loopback gRPC (Deps.GatewayToken); zero
	// when there is none.
	local     [sha256.Size]byte
	anonymous bool // callers proving nothing are clients
	logger    *slog.Logger

	refusals          atomic.Uint64
	handshakeRefusals atomic.Uint64
	logMu             sync.Mutex
	logged            map[string]time.Time
}

// newClientAuth builds the client plane's guard from cfg.
func newClientAuth(cfg Config, gatewayToken string, logger *slog.Logger) (*clientAuth, error) {
	a := &clientAuth{logger: logger, logged: map[string]time.Time{}}
	if gatewayToken != "" {
		a.local = sha256.Sum256([]byte(gatewayToken))
	}
	if cfg.ClientTokenFile != "" {
		t, err := loadTokenFile(cfg.ClientTokenFile)
		if err != nil {
			return nil, err
		}
		a.tokens = t
	}
	a.anonymous = cfg.AllowAnonymousClients || (cfg.ClientTLS.IsZero() && a.tokens == nil)
	return a, nil
}

// caller is who made a call: the role it proved, or "" for nobody.
func (a *clientAuth) caller(ctx context.Context) (role, how string) {
	if p, ok := peer.FromContext(ctx); ok {
		if id, ok := pki.FromAuthInfo(p.AuthInfo); ok && !id.IsNode() {
			return id.Role, "certificate"
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) > 0 {
		scheme, cred, ok := strings.Cut(v[0], " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			if got := sha256.Sum256([]byte(cred)); a.local != ([sha256.Size]byte{}) && subtle.ConstantTimeCompare(got[:], a.local[:]) == 1 {
				return pki.RoleGateway, "token"
			}
			if a.tokens != nil {
				if r := a.tokens.role(cred); r != "" {
					return r, "token"
				}
			}
		}
		return "", "bad_token"
	}
	if a.anonymous {
		return roleClient, "anonymous"
	}
	return "", "none"
}

// authorize decides a call to method (its full name) with first request
// req (nil for a stream whose first message is not read yet).
func (a *clientAuth) authorize(ctx context.Context, method string, req any) error {
	service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	role, how := a.caller(ctx)
	if service == healthServiceName && how != "bad_token" {
		return nil
	}
	if role == "" {
		a.refused(ctx, method, how, "")
		if how == "bad_token" {
			return grpcerr.ToStatus(errcode.New(errcode.Unauthenticated, "the bearer token is not valid on this node"))
		}
		return grpcerr.ToStatus(errcode.New(errcode.Unauthenticated, "the client plane requires a client certificate or a bearer token"))
	}
	var allowed bool
	switch {
	case isReflection(service):
		allowed = true
	case service == streamServiceName:
		switch role {
		case pki.RoleGateway:
			allowed = true
		case roleClient:
			if b, ok := reservedBucket(req); ok {
				a.refused(ctx, method, how, role)
				return grpcerr.ToStatus(errcode.New(errcode.PermissionDenied, "bucket %q is reserved to the node's own roles", b))
			}
			allowed = true
		}
	case service == coldGCServiceName:
		allowed = role == pki.RoleColdGC
	case service == backupServiceName:
		allowed = role == pki.RoleBackup
	}
	if !allowed {
		a.refused(ctx, method, how, role)
		return grpcerr.ToStatus(errcode.New(errcode.PermissionDenied, "role %s may not call %s", role, method))
	}
	return nil
}

// handshakeRefused counts a client-plane connection closed in its TLS
// handshake.
func (a *clientAuth) handshakeRefused(remote net.Addr, err error) {
	a.handshakeRefusals.Add(1)
	a.logger.Debug("client-plane TLS handshake failed", "remote_address", remote.String(), "err", err)
}

// refused counts a refusal and logs it once a minute per caller address
// and reason.
func (a *clientAuth) refused(ctx context.Context, method, how, role string) {
	a.refusals.Add(1)
	remote := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
		if i := strings.LastIndexByte(remote, ':'); i > 0 {
			remote = remote[:i]
		}
	}
	key := remote + "|" + how + "|" + role
	now := time.Now()
	a.logMu.Lock()
	last, seen := a.logged[key]
	if !seen || now.Sub(last) > time.Minute {
		if len(a.logged) >= maxRememberedCallers {
			clear(a.logged)
		}
		a.logged[key] = now
	}
	a.logMu.Unlock()
	if !seen || now.Sub(last) > time.Minute {
		a.logger.Warn("refused a client-plane call", "remote_address", remote, "method", method, "credential", how, "role", role)
	}
}

// maxRememberedCallers bounds the refusal-logging state.
const maxRememberedCallers = 1024

// reservedBucket finds a reserved bucket named anywhere in req (a stream
// reference, a fork's source, a bucket request).
func reservedBucket(req any) (string, bool) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", false
	}
	return findReserved(m.ProtoReflect())
}

func findReserved(m protoreflect.Message) (found string, ok bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.StringKind && fd.Name() == "bucket" && !fd.IsList():
			if b := v.String(); strings.HasPrefix(b, "__") {
				found, ok = b, true
			}
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap():
			found, ok = findReserved(v.Message())
		}
		return !ok
	})
	return found, ok
}

// UnaryInterceptor authorizes unary calls.
func (a *clientAuth) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.authorize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// StreamInterceptor authorizes streaming calls: the caller's role before
// the handler runs, and the first request message's buckets when it is
// read.
func (a *clientAuth) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.authorize(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	return handler(srv, &checkedStream{ServerStream: ss, a: a, method: info.FullMethod})
}

// checkedStream authorizes each request message of a stream.
type checkedStream struct {
	grpc.ServerStream
	a      *clientAuth
	method string
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.a.authorize(s.Context(), s.method, m)
}

// tokenFile is server.client_token_file: one "<role> <token>" per line
// (blank lines and lines starting with # are ignored), several tokens per
// role allowed (rotation), each of at least 32 bytes without blanks or
// control characters. Only digests are kept. The file is read again when
// it changes (checked at most once a second); a version that does not
// parse is logged and the previous one stays.
type tokenFile struct {
	path string

	mu      sync.Mutex
	digests map[[sha256.Size]byte]string
	stamp   os.FileInfo
	checked time.Time
	failed  os.FileInfo
}

func loadTokenFile(path string) (*tokenFile, error) {
	t := &tokenFile{path: path}
	d, fi, err := readTokenFile(path)
	if err != nil {
		return nil, fmt.Errorf("server.client_token_file %s: %w", path, err)
	}
	t.digests, t.stamp, t.checked = d, fi, time.Now()
	return t, nil
}

// role is the role of token, or "".
func (t *tokenFile) role(token string) string {
	got := sha256.Sum256([]byte(token))
	t.mu.Lock()
	defer t.mu.Unlock()
	if now := time.Now(); now.Sub(t.checked) >= time.Second {
		t.checked = now
		t.reloadLocked()
	}
	role := ""
	for d, r := range t.digests {
		if subtle.ConstantTimeCompare(got[:], d[:]) == 1 {
			role = r
		}
	}
	return role
}

func (t *tokenFile) reloadLocked() {
	fi, err := os.Lstat(t.path)
	if err != nil || sameStamp(fi, t.stamp) || sameStamp(fi, t.failed) {
		return
	}
	d, fi, err := readTokenFile(t.path)
	if err != nil {
		t.failed = fi
		slog.Default().Error("server.client_token_file changed but does not load: keeping the previous tokens", "path", t.path, "err", err)
		return
	}
	t.digests, t.stamp, t.failed = d, fi, nil
}

func sameStamp(a, b os.FileInfo) bool {
	return a != nil && b != nil && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime()) && os.SameFile(a, b)
}

func readTokenFile(path string) (map[[sha256.Size]byte]string, os.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, err
	}
	b, err := pki.ReadSecretFile(path, pki.MaxSecretFileBytes)
	if err != nil {
		return nil, fi, err
	}
	defer clear(b)
	out := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		role, tok, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			return nil, fi, fmt.Errorf("line %d: want \"<role> <token>\"", n)
		}
		if !validClientRole(string(role)) {
			return nil, fi, fmt.Errorf("line %d: role %q is not one of %s", n, role, strings.Join(clientRoles, ", "))
		}
		tok, err := pki.ParseToken(bytes.TrimSpace(tok))
		if err != nil {
			return nil, fi, fmt.Errorf("line %d: %w", n, err)
		}
		out[sha256.Sum256(tok)] = string(role)
	}
	if err := sc.Err(); err != nil {
		return nil, fi, err
	}
	if len(out) == 0 {
		return nil, fi, errors.New("the file holds no token")
	}
	return out, fi, nil
}

func validClientRole(r string) bool {
	for _, c := range clientRoles {
		if r == c {
			return true
		}
	}
	return false
}
