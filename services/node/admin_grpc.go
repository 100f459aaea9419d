package node

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ursula/ursula/internal/pki"
	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// The admin plane serves AdminService over gRPC on the admin listener,
// beside its REST mapping (the listener tells the two apart by the HTTP/2
// preface, package listenmux). Both go through the same rules (adminGuard
// for HTTP, adminGRPCGuard here): the :authority must name this plane;
// a mutation needs the admin token (authorization: Bearer <token>) or an
// operator certificate, and so does every call on a non-loopback
// listener; a mutation needs x-ursula-process-incarnation naming this
// process; an authenticated mutation is recorded in the audit trail with
// its outcome before it is answered.

// adminReadOnly are the AdminService methods that change nothing (their
// REST mappings are GETs; TestAdminGRPCMethodsMatchREST checks it). Every
// other method is a mutation.
var adminReadOnly = map[string]bool{
	adminv1.AdminService_GetMetrics_FullMethodName:        true,
	adminv1.AdminService_GetReady_FullMethodName:          true,
	adminv1.AdminService_GetLeadershipShed_FullMethodName: true,
}

// grpcOperationPrefix marks a gRPC call in an audit record's operation
// ("gRPC /ursula.admin.v1.AdminService/TakeSnapshot"; HTTP requests are
// "POST /__ursula/raft/0/snapshot").
const grpcOperationPrefix = "gRPC "

// newAdminGRPC builds the admin plane's gRPC server: AdminService, and
// reflection when server.grpc_reflection allows it on the admin listener.
func (s *Server) newAdminGRPC() *grpc.Server {
	opts := append(serverLimits(),
		grpc.MaxRecvMsgSize(maxHTTPBodyBytes),
		grpc.StatsHandler(serverStatsHandler()),
		grpc.ChainUnaryInterceptor(s.adminGRPCUnary),
		grpc.ChainStreamInterceptor(s.adminGRPCStream),
	)
	if s.adminTLS != nil {
		opts = append(opts, grpc.Creds(pki.Terminated()))
	}
	srv := grpc.NewServer(opts...)
	adminv1.RegisterAdminServiceServer(srv, &adminService{srv: s})
	registerReflection(srv, s.cfg.reflection(s.cfg.AdminListen))
	return srv
}

// adminGRPCUnary guards a unary admin call.
func (s *Server) adminGRPCUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	mutation, err := s.adminGRPCGuard(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if !mutation {
		return handler(ctx, req)
	}
	return s.auditedGRPC(ctx, info.FullMethod, func() (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		switch got := firstMD(md, IncarnationHeader); {
		case got == "":
			return nil, grpcerr.ToStatus(errcode.New(errcode.IncarnationRequired,
				"%s metadata is required on admin mutations; read process_incarnation from GetReady or GetMetrics", IncarnationHeader))
		case got != s.incarnation:
			return nil, grpcerr.ToStatus(errcode.New(errcode.IncarnationMismatch, "the target process restarted since the incarnation was read").
				With(errcode.KeyProcessIncarnation, s.incarnation))
		}
		return handler(ctx, req)
	})
}

// adminGRPCStream guards a streaming call on the admin plane (reflection;
// AdminService has none). A streaming mutation is not served: it could
// not be audited as one call.
func (s *Server) adminGRPCStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	mutation, err := s.adminGRPCGuard(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	if mutation {
		return grpcerr.ToStatus(errcode.New(errcode.Unimplemented, "%s is not served on the admin plane", info.FullMethod))
	}
	return handler(srv, ss)
}

// adminGRPCGuard applies adminGuard's rules to a gRPC call, before any
// handler runs, and reports whether the call is a mutation.
func (s *Server) adminGRPCGuard(ctx context.Context, method string) (mutation bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if authority := firstMD(md, ":authority"); !s.adminAuthorityAllowed(authority) {
		return false, grpcerr.ToStatus(errcode.New(errcode.PermissionDenied, "the admin plane does not answer for :authority %q (server.admin_allowed_hosts)", authority))
	}
	service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	mutation = !adminReadOnly[method] && !isReflection(service)
	presented := len(md.Get("authorization")) > 0
	if (mutation || !s.adminLoopback || presented) && s.adminGRPCAuth(ctx) == "" {
		s.adminAuthRefusals.Add(1)
		return mutation, grpcerr.ToStatus(errcode.New(errcode.Unauthenticated,
			"admin mutations require authorization: Bearer <token> metadata (the file %s)", s.adminTokenFile))
	}
	return mutation, nil
}

// adminGRPCAuth names how a gRPC call authenticated on the admin plane
// ("token", "certificate urn:ursula:role:operator"), or "" when it did
// not.
func (s *Server) adminGRPCAuth(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && s.adminToken != nil && s.adminToken.allowsCredential(v[0]) {
		return "token"
	}
	if p, ok := peer.FromContext(ctx); ok {
		if id, ok := pki.FromAuthInfo(p.AuthInfo); ok && id == pki.RoleIdentity(pki.RoleOperator) {
			return "certificate " + id.String()
		}
	}
	return ""
}

// auditedGRPC runs an authenticated admin mutation, records it with its
// outcome (Status is the HTTP status of the answer's code, as for the
// REST routes), and only then answers.
func (s *Server) auditedGRPC(ctx context.Context, method string, call func() (any, error)) (any, error) {
	resp, err := call()
	md, _ := metadata.FromIncomingContext(ctx)
	rec := AuditRecord{
		Time:               time.Now().UTC(),
		NodeID:             s.n.Config().NodeID,
		ProcessIncarnation: s.incarnation,
		Operation:          grpcOperationPrefix + method,
		Proof:              clip(firstMD(md, ProofHeader)),
		Actor:              clip(firstMD(md, ActorHeader)),
		Auth:               s.adminGRPCAuth(ctx),
		Reason:             clip(firstMD(md, ReasonHeader)),
		Status:             http.StatusOK,
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		rec.PeerAddress = p.Addr.String()
	}
	if err != nil {
		de := grpcerr.FromStatus(err)
		rec.Status, rec.Code = errcode.HTTPStatus(de.Code), errcode.Reason(de.Code)
	}
	if aerr := s.audit.append(rec); aerr != nil {
		s.logger.Error("admin mutation not recorded in the audit trail: answering INTERNAL", "operation", rec.Operation, "status", rec.Status, "err", aerr)
		return nil, grpcerr.ToStatus(errcode.New(errcode.Internal, "the audit trail could not record the operation; its outcome was %d", rec.Status))
	}
	return resp, err
}

// firstMD is the first value of a metadata key, or "".
func firstMD(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// tlsConnKey carries an admin connection's *tls.Conn in its requests'
// contexts (withAdminTLS).
type tlsConnKey struct{}

// adminConnContext keeps a connection's TLS state for its requests: the
// admin plane's HTTP server receives connections whose TLS the listener
// terminated (listenmux), so net/http does not fill Request.TLS itself.
func adminConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc := pki.TLSConn(c); tc != nil {
		return context.WithValue(ctx, tlsConnKey{}, tc)
	}
	return ctx
}

// withAdminTLS fills Request.TLS from the connection adminConnContext
// kept, so that operator certificates authenticate HTTP requests.
func withAdminTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tc, ok := r.Context().Value(tlsConnKey{}).(*tls.Conn); ok && r.TLS == nil {
			st := tc.ConnectionState()
			r.TLS = &st
		}
		next.ServeHTTP(w, r)
	})
}

// adminHandshakeRefused logs an admin-plane connection closed in its TLS
// handshake.
func (s *Server) adminHandshakeRefused(remote net.Addr, err error) {
	s.logger.Debug("admin-plane TLS handshake failed", "remote_address", remote.String(), "err", err)
}
