package node

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/services/platform/errcode"
)

// Audit trail of the admin plane: every authenticated admin mutation,
// whatever its outcome, is recorded in <raft.wal.path>/audit/audit.log before
// its answer is sent, one JSON object per line, each written and fsynced
// on its own (a mutation whose record cannot be made durable answers 500).
// The file rotates at maxAuditFileBytes into audit.log.1 (one generation
// kept). Requests refused before authentication are counted
// (admin_auth_refusals), not recorded, so that an unauthenticated caller
// cannot fill the disk.
const (
	auditDir          = "audit"
	auditFile         = "audit.log"
	maxAuditFileBytes = 16 << 20
	// maxAuditAnswer bounds the answer kept to record its outcome code;
	// admin answers are small documents.
	maxAuditAnswer = 1 << 20
	// maxAuditField bounds asserted free text (actor, reason).
	maxAuditField = 512
)

// Headers an operator's tool sends with a mutation, recorded as asserted.
const (
	// ActorHeader names who asserts to act (recorded with
	// actor_verified false: the token proves access, not a person).
	ActorHeader = "x-ursula-actor"
	// ReasonHeader is why.
	ReasonHeader = "x-ursula-reason"
	// ProofHeader is the proof of the plan a mutation applies.
	ProofHeader = "x-ursula-proof"
)

// AuditRecord is one line of the audit trail.
type AuditRecord struct {
	Time               time.Time `json:"time"`
	NodeID             uint64    `json:"node_id"`
	ProcessIncarnation string    `json:"process_incarnation"`
	// Operation is the method and path.
	Operation string `json:"operation"`
	Proof     string `json:"proof,omitempty"`
	Actor     string `json:"actor,omitempty"`
	// ActorVerified is always false: the actor is what the caller says.
	ActorVerified bool   `json:"actor_verified"`
	Auth          string `json:"auth"`
	PeerAddress   string `json:"peer_address"`
	Reason        string `json:"reason,omitempty"`
	// Status and Code are the outcome: the HTTP status (for a gRPC call,
	// "gRPC /ursula.admin.v1.AdminService/<Method>", the HTTP status of
	// its code: 200 when it succeeded), and the error code when the
	// mutation was refused.
	Status int    `json:"status"`
	Code   string `json:"code,omitempty"`
}

// auditLog appends records durably.
type auditLog struct {
	dir string

	mu   sync.Mutex
	f    *os.File
	size int64
}

func openAuditLog(dataDir string) (*auditLog, error) {
	dir := filepath.Join(dataDir, auditDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	a := &auditLog{dir: dir}
	if err := a.open(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *auditLog) open() error {
	f, err := os.OpenFile(filepath.Join(a.dir, auditFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	a.f, a.size = f, fi.Size()
	return nil
}

// append writes one record and syncs it.
func (a *auditLog) append(rec AuditRecord) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.size+int64(len(line)) > maxAuditFileBytes {
		if err := a.rotate(); err != nil {
			return err
		}
	}
	if _, err := a.f.Write(line); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	if err := a.f.Sync(); err != nil {
		return fmt.Errorf("audit: sync: %w", err)
	}
	a.size += int64(len(line))
	return nil
}

func (a *auditLog) rotate() error {
	_ = a.f.Close()
	cur := filepath.Join(a.dir, auditFile)
	if err := os.Rename(cur, cur+".1"); err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	return a.open()
}

// tail returns the newest records, at most limit, oldest first.
func (a *auditLog) tail(limit int) ([]json.RawMessage, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []json.RawMessage
	for _, name := range []string{auditFile + ".1", auditFile} {
		b, err := os.ReadFile(filepath.Join(a.dir, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 && json.Valid(line) {
				out = append(out, json.RawMessage(append([]byte(nil), line...)))
			}
		}
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

func (a *auditLog) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f != nil {
		_ = a.f.Close()
		a.f = nil
	}
}

// auditWriter holds a mutation's answer until its record is durable.
type auditWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *auditWriter) Header() http.Header { return w.header }

func (w *auditWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *auditWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.body.Len()+len(p) > maxAuditAnswer {
		return 0, fmt.Errorf("admin answer larger than %d bytes", maxAuditAnswer)
	}
	return w.body.Write(p)
}

// audited runs an authenticated admin mutation, records it with its
// outcome, and only then sends the answer.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, next http.Handler) {
	aw := &auditWriter{header: http.Header{}}
	next.ServeHTTP(aw, r)
	if aw.status == 0 {
		aw.status = http.StatusOK
	}
	rec := AuditRecord{
		Time:               time.Now().UTC(),
		NodeID:             s.n.Config().NodeID,
		ProcessIncarnation: s.incarnation,
		Operation:          r.Method + " " + r.URL.RequestURI(),
		Proof:              clip(r.Header.Get(ProofHeader)),
		Actor:              clip(r.Header.Get(ActorHeader)),
		Auth:               s.adminAuthMethod(r),
		PeerAddress:        r.RemoteAddr,
		Reason:             clip(r.Header.Get(ReasonHeader)),
		Status:             aw.status,
	}
	if aw.status >= 400 {
		var doc struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(aw.body.Bytes(), &doc) == nil {
			rec.Code = doc.Code
		}
	}
	if err := s.audit.append(rec); err != nil {
		s.logger.Error("admin mutation not recorded in the audit trail: answering 500", "operation", rec.Operation, "status", rec.Status, "err", err)
		http.Error(w, `{"code":"INTERNAL","message":"the audit trail could not record the operation; its outcome was `+strconv.Itoa(aw.status)+`"}`, http.StatusInternalServerError)
		return
	}
	for k, v := range aw.header {
		w.Header()[k] = v
	}
	w.WriteHeader(aw.status)
	_, _ = w.Write(aw.body.Bytes())
}

// adminAuthMethod names how an admin request authenticated.
func (s *Server) adminAuthMethod(r *http.Request) string {
	if s.adminToken != nil && s.adminToken.allows(r) {
		return "token"
	}
	if r.TLS != nil {
		if id, err := pki.PeerIdentity(*r.TLS); err == nil {
			return "certificate " + id.String()
		}
	}
	return "none"
}

// clip bounds asserted text and drops control characters.
func clip(s string) string {
	b := make([]rune, 0, len(s))
	for _, c := range s {
		if c >= 0x20 && c != 0x7f {
			b = append(b, c)
		}
		if len(b) >= maxAuditField {
			break
		}
	}
	return string(b)
}

// serveAudit answers GET /__ursula/audit?limit=N: the newest records (at
// most N, default 100, at most 10000), oldest first.
func (s *Server) serveAudit(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeAdminError(w, errcode.New(errcode.InvalidArgument, "limit must be a positive integer"))
			return
		}
		limit = min(n, 10000)
	}
	recs, err := s.audit.tail(limit)
	if err != nil {
		writeAdminError(w, errcode.New(errcode.Internal, "%v", err))
		return
	}
	if recs == nil {
		recs = []json.RawMessage{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
}
