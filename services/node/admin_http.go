package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ursula/ursula/internal/pki"
	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// IncarnationHeader pins the process an admin mutation is meant for.
const IncarnationHeader = "x-ursula-process-incarnation"

// adminGateway is the generated REST surface of AdminService, answering
// with adminJSON and mapping errors with writeAdminError.
func (s *Server) adminGateway(ctx context.Context) (*runtime.ServeMux, error) {
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &adminJSON{}),
		runtime.WithErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
			writeAdminError(w, adminDomainError(err))
		}),
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, status int) {
			switch status {
			case http.StatusNotFound:
				writeAdminError(w, errcode.New(errcode.NotFound, "no admin endpoint at %s", r.URL.Path))
			case http.StatusMethodNotAllowed:
				writeAdminError(w, errcode.New(errcode.MethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
			default:
				writeAdminError(w, errcode.New(errcode.InvalidArgument, "%s", http.StatusText(status)))
			}
		}),
		// Only the documented method and path reach a handler.
		runtime.WithDisableHTTPMethodOverride(),
		runtime.WithDisablePathLengthFallback(),
	)
	if err := adminv1.RegisterAdminServiceHandlerServer(ctx, gw, &adminService{srv: s}); err != nil {
		return nil, fmt.Errorf("register admin REST handlers: %w", err)
	}
	return gw, nil
}

// setUpAdmin loads the admin plane's credentials: the token file (the
// default one in dataDir created on first start), TLS, and the Host
// values it answers.
func (s *Server) setUpAdmin(dataDir string) error {
	s.adminTokenFile = s.cfg.AdminTokenFile
	if s.adminTokenFile == "" {
		s.adminTokenFile = filepath.Join(dataDir, defaultAdminTokenFile)
		created, err := ensureAdminToken(s.adminTokenFile)
		if err != nil {
			return err
		}
		if created {
			s.logger.Info("created the admin token file; ursulactl and curl read the token from it", "path", s.adminTokenFile)
		}
	}
	var err error
	if s.adminToken, err = loadAdminToken(s.adminTokenFile); err != nil {
		return err
	}
	if s.audit, err = openAuditLog(dataDir); err != nil {
		return err
	}
	if !s.cfg.AdminTLS.IsZero() {
		if s.adminTLS, err = pki.Load(s.cfg.AdminTLS, s.logger.With("plane", "admin")); err != nil {
			return fmt.Errorf("server.admin_tls: %w", err)
		}
	}
	host, _, _ := net.SplitHostPort(s.cfg.AdminListen)
	s.adminLoopback = isLoopback(host)
	s.adminHosts = map[string]bool{"localhost": true}
	if host != "" && !net.ParseIP(host).IsUnspecified() {
		s.adminHosts[strings.ToLower(host)] = true
	}
	for _, h := range s.cfg.AdminAllowedHosts {
		s.adminHosts[strings.ToLower(h)] = true
	}
	return nil
}

// adminHostAllowed reports whether a request's Host names this admin
// plane: localhost, a loopback address, the listener's host or an allowed
// one. A page of another site that a DNS rebinding points at the loopback
// address sends its own name, and is refused.
func (s *Server) adminHostAllowed(r *http.Request) bool {
	return s.adminAuthorityAllowed(r.Host)
}

// adminAuthorityAllowed is adminHostAllowed for a Host or :authority
// value.
func (s *Server) adminAuthorityAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	return s.adminHosts[host]
}

// adminAuthenticated reports a request that carries the token or comes
// with a client certificate proving the operator role.
func (s *Server) adminAuthenticated(r *http.Request) bool {
	if s.adminToken != nil && s.adminToken.allows(r) {
		return true
	}
	if r.TLS != nil {
		if id, err := pki.PeerIdentity(*r.TLS); err == nil && id == pki.RoleIdentity(pki.RoleOperator) {
			return true
		}
	}
	return false
}

// adminGuard runs in front of every admin route, before any handler:
//
//   - a Host that does not name this plane answers 403 (DNS rebinding);
//   - a mutation (any method but GET and HEAD) without the token (or an
//     operator certificate) answers 401, and so does every request when
//     the listener is not loopback; read-only requests on a loopback
//     listener (metrics, readiness, usage) need none, so diagnostic
//     runbooks work as written;
//   - a mutation without the process incarnation header answers 428, and
//     with another process's incarnation (the node restarted since it was
//     read) 412.
func (s *Server) adminGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !s.adminHostAllowed(r) {
			writeAdminError(w, errcode.New(errcode.PermissionDenied, "the admin plane does not answer for Host %q (server.admin_allowed_hosts)", r.Host))
			return
		}
		mutation := r.Method != http.MethodGet && r.Method != http.MethodHead
		// Credentials that are presented are checked, even where none are
		// needed: a wrong token is an error, not anonymity.
		presented := r.Header.Get("Authorization") != ""
		if (mutation || !s.adminLoopback || presented) && !s.adminAuthenticated(r) {
			s.adminAuthRefusals.Add(1)
			writeAdminError(w, errcode.New(errcode.Unauthenticated, "admin mutations require an Authorization: Bearer token (the file %s)", s.adminTokenFile))
			return
		}
		if !mutation {
			next.ServeHTTP(w, r)
			return
		}
		// An authenticated mutation is recorded with its outcome, the
		// process-incarnation refusals included, before it is answered.
		s.audited(w, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch got := r.Header.Get(IncarnationHeader); {
			case got == "":
				writeAdminError(w, errcode.New(errcode.IncarnationRequired,
					"%s is required on admin mutations; read process_incarnation from /__ursula/metrics", IncarnationHeader))
				return
			case got != s.incarnation:
				writeAdminError(w, errcode.New(errcode.IncarnationMismatch, "the target process restarted since the incarnation was read").
					With(errcode.KeyProcessIncarnation, s.incarnation))
				return
			}
			next.ServeHTTP(w, r)
		}))
	})
}

// pprofGuard requires the token for profiles even on a loopback listener.
func (s *Server) pprofGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.adminAuthenticated(r) {
			writeAdminError(w, errcode.New(errcode.Unauthenticated, "profiles require the admin token (the file %s)", s.adminTokenFile))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminDomainError recovers the domain error of a failed admin call: the
// service's status (ErrorInfo), or the gateway's own refusal of a path or
// query parameter it cannot parse.
func adminDomainError(err error) *errcode.Error {
	var hs *runtime.HTTPStatusError
	if errors.As(err, &hs) {
		code := errcode.Internal
		if hs.HTTPStatus == http.StatusBadRequest {
			code = errcode.InvalidArgument
		}
		return errcode.New(code, "%v", hs.Err)
	}
	return grpcerr.FromStatus(err)
}

// writeAdminError answers an error as {"code", "message"}, plus leader_id
// (a number) for NOT_LEADER and process_incarnation for a 412; a 503
// carries Retry-After (whole seconds, at least 1) and a 401 a Bearer
// challenge.
func writeAdminError(w http.ResponseWriter, de *errcode.Error) {
	status := errcode.HTTPStatus(de.Code)
	body := map[string]any{"code": errcode.Reason(de.Code), "message": de.Message}
	if de.Code == errcode.NotLeader {
		id, _ := strconv.ParseUint(de.Metadata[errcode.KeyLeaderID], 10, 64)
		body["leader_id"] = id
	}
	if v, ok := de.Metadata[errcode.KeyProcessIncarnation]; ok {
		body[errcode.KeyProcessIncarnation] = v
	}
	switch status {
	case http.StatusServiceUnavailable:
		secs := int64(1)
		if ms, err := strconv.ParseInt(de.Metadata[errcode.KeyRetryAfterMS], 10, 64); err == nil && ms > 1000 {
			secs = (ms + 999) / 1000
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="ursula-admin"`)
	}
	writeJSON(w, status, body)
}

// serveShed answers GET /__ursula/leadership-shed on the cluster plane with
// the admin plane's document.
func (s *Server) serveShed(w http.ResponseWriter, _ *http.Request) {
	b, err := marshalAdminJSON(s.shedAnswer())
	if err != nil {
		writeAdminError(w, errcode.New(errcode.Internal, "%v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b)
}

// adminJSON renders admin answers with protojson, using the proto field
// names and emitting every field, then makes two changes so the documents
// keep the shape tooling reads: 64-bit integers are JSON numbers (protojson
// writes them as strings), and an unset optional field is null (protojson
// leaves it out).
type adminJSON struct {
	runtime.JSONPb
}

// Marshal implements runtime.Marshaler.
func (m *adminJSON) Marshal(v any) ([]byte, error) {
	if msg, ok := v.(proto.Message); ok {
		return marshalAdminJSON(msg)
	}
	return m.JSONPb.Marshal(v)
}

func marshalAdminJSON(msg proto.Message) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(msg)
	if err != nil {
		return nil, err
	}
	md := msg.ProtoReflect().Descriptor()
	if wellKnown(md) {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	adminFields(md, doc)
	return json.Marshal(doc)
}

// adminFields rewrites one decoded message of type md in place.
func adminFields(md protoreflect.MessageDescriptor, doc map[string]any) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		v, ok := doc[name]
		if !ok {
			if fd.HasOptionalKeyword() {
				doc[name] = nil // an unset optional scalar
			}
			continue
		}
		if fd.IsMap() {
			continue
		}
		if fd.IsList() {
			if items, ok := v.([]any); ok {
				for j, item := range items {
					items[j] = adminValue(fd, item)
				}
			}
			continue
		}
		doc[name] = adminValue(fd, v)
	}
}

// adminValue rewrites one value of field fd.
func adminValue(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
	case protoreflect.MessageKind:
		if sub, ok := v.(map[string]any); ok && !wellKnown(fd.Message()) {
			adminFields(fd.Message(), sub)
		}
	}
	return v
}

// wellKnown reports the google.protobuf types, whose JSON form protojson
// defines (a Struct is the metrics document).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile().Package() == "google.protobuf"
}
