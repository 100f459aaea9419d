package node

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/httpserver"
)

// The admin plane's backup routes (ursulactl backup-create, backup-verify
// and restore): BackupService over REST with raw bodies. Group objects
// travel as application/octet-stream, up to server.max_message_bytes, so
// these routes take larger bodies than the rest of the admin plane (1 MiB),
// read under a budget of their own (server.http_inflight_body_size). The
// admin guard has authenticated mutations, checked their process
// incarnation and records them in the audit trail; export and info are
// reads.
//
//	GET  /__ursula/backup/info                                   BackupInfo (JSON, proto field names)
//	POST /__ursula/backup/group/{group}/hold?holder=H&ttl_ms=N   {"index": N}
//	GET  /__ursula/backup/group/{group}/export?min_applied_index=N
//	                                                             the group object, x-ursula-backup-blake3,
//	                                                             x-ursula-commit-index, x-ursula-applied-index,
//	                                                             x-ursula-node-id
//	POST /__ursula/backup/group/{group}/cold-check (object)      {"checked", "missing", "first_missing", "import_refusal", "imported"}
//	POST /__ursula/backup/group/{group}/import (object)          {"already", "index", "streams"}
//	     with x-ursula-backup-blake3

// Headers of the backup routes.
const (
	BackupBlake3Header   = "x-ursula-backup-blake3"
	CommitIndexHeader    = "x-ursula-commit-index"
	AppliedIndexHeader   = "x-ursula-applied-index"
	BackupNodeIDHeader   = "x-ursula-node-id"
	groupObjectMediaType = "application/octet-stream"
)

// backupRoutes registers the backup routes on the admin mux.
func (s *Server) backupRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /__ursula/backup/info", s.serveBackupInfo)
	mux.HandleFunc("POST /__ursula/backup/group/{group}/hold", s.serveBackupHold)
	mux.HandleFunc("GET /__ursula/backup/group/{group}/export", s.serveBackupExport)
	mux.HandleFunc("POST /__ursula/backup/group/{group}/cold-check", s.serveBackupColdCheck)
	mux.HandleFunc("POST /__ursula/backup/group/{group}/import", s.serveBackupImport)
}

// adminFail answers a storage or domain error in the admin plane's shape.
func adminFail(w http.ResponseWriter, err error) {
	var de *errcode.Error
	if !errors.As(domainError(err), &de) {
		de = errcode.New(errcode.Internal, "%v", err)
	}
	writeAdminError(w, de)
}

// backupGroup parses the {group} of a backup route; an unknown group is
// 404, as on the recovery routes.
func (s *Server) backupGroup(w http.ResponseWriter, r *http.Request) (uint32, bool) {
	g, err := strconv.ParseUint(r.PathValue("group"), 10, 32)
	if err != nil || int(g) >= s.n.Engine.GroupCount() {
		writeAdminError(w, errcode.New(errcode.NotFound, "no raft group %q on this node", r.PathValue("group")))
		return 0, false
	}
	return uint32(g), true
}

// backupBody reads a group object, at most max_message_bytes, under the
// backup routes' budget.
func (s *Server) backupBody(w http.ResponseWriter, r *http.Request) (*httpserver.Body, bool) {
	body, err := httpserver.ReadBody(r, int64(s.cfg.MaxMessageBytes), s.backupBudget)
	var tooLarge *httpserver.BodyTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		writeAdminError(w, errcode.New(errcode.PayloadTooLarge, "a group object is at most %d bytes (max_message_bytes)", tooLarge.Limit))
	case errors.Is(err, httpserver.ErrBudgetExhausted):
		writeAdminError(w, errcode.New(errcode.Overloaded, "the backup routes hold as many request bodies as they may: retry").With(errcode.KeyRetryAfterMS, "1000"))
	case err != nil:
		writeAdminError(w, errcode.New(errcode.InvalidArgument, "read the body: %v", err))
	case len(body.Bytes()) == 0:
		writeAdminError(w, errcode.New(errcode.InvalidArgument, "the body is the group object; it is empty"))
	default:
		return body, true
	}
	return nil, false
}

func (s *Server) serveBackupInfo(w http.ResponseWriter, _ *http.Request) {
	b, err := marshalAdminJSON(s.backup.info())
	if err != nil {
		adminFail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) serveBackupHold(w http.ResponseWriter, r *http.Request) {
	g, ok := s.backupGroup(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	ttl, err := strconv.ParseInt(q.Get("ttl_ms"), 10, 64)
	if err != nil {
		writeAdminError(w, errcode.New(errcode.InvalidArgument, "ttl_ms is a number of milliseconds (0 releases the hold), not %q", q.Get("ttl_ms")))
		return
	}
	index, err := s.backup.hold(r.Context(), g, q.Get("holder"), ttl)
	if err != nil {
		adminFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"index": index})
}

func (s *Server) serveBackupExport(w http.ResponseWriter, r *http.Request) {
	g, ok := s.backupGroup(w, r)
	if !ok {
		return
	}
	var minApplied uint64
	if v := r.URL.Query().Get("min_applied_index"); v != "" {
		var err error
		if minApplied, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeAdminError(w, errcode.New(errcode.InvalidArgument, "min_applied_index is a log index, not %q", v))
			return
		}
	}
	out, err := s.backup.export(r.Context(), g, minApplied)
	if err != nil {
		adminFail(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", groupObjectMediaType)
	h.Set("Content-Length", strconv.Itoa(len(out.GetObject())))
	h.Set(BackupBlake3Header, out.GetBlake3())
	h.Set(CommitIndexHeader, strconv.FormatUint(out.GetCommitIndex(), 10))
	h.Set(AppliedIndexHeader, strconv.FormatUint(out.GetAppliedIndex(), 10))
	h.Set(BackupNodeIDHeader, strconv.FormatUint(out.GetNodeId(), 10))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out.GetObject())
}

func (s *Server) serveBackupColdCheck(w http.ResponseWriter, r *http.Request) {
	g, ok := s.backupGroup(w, r)
	if !ok {
		return
	}
	body, ok := s.backupBody(w, r)
	if !ok {
		return
	}
	defer body.Release()
	out, err := s.backup.coldCheck(r.Context(), g, body.Bytes())
	if err != nil {
		adminFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"checked": out.GetChecked(), "missing": out.GetMissing(), "first_missing": out.GetFirstMissing(),
		"import_refusal": out.GetImportRefusal(), "imported": out.GetImported()})
}

func (s *Server) serveBackupImport(w http.ResponseWriter, r *http.Request) {
	g, ok := s.backupGroup(w, r)
	if !ok {
		return
	}
	digest := r.Header.Get(BackupBlake3Header)
	if digest == "" {
		writeAdminError(w, errcode.New(errcode.InvalidArgument, "%s is required: the BLAKE3 digest of the group object", BackupBlake3Header))
		return
	}
	body, ok := s.backupBody(w, r)
	if !ok {
		return
	}
	defer body.Release()
	out, err := s.backup.importGroup(r.Context(), g, body.Bytes(), digest)
	if err != nil {
		adminFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"already": out.GetAlready(), "index": out.GetIndex(), "streams": out.GetStreams()})
}
