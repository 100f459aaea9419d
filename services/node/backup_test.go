package node

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// backupNode is a node with a cold store and its admin plane over
// httptest.
type backupNode struct {
	s   *Server
	eng *engine.Node
	ts  *httptest.Server
}

func startBackupNode(tb testing.TB, store objstore.Store) *backupNode {
	tb.Helper()
	eng := startColdEngine(tb, store)
	s := newServer(tb, eng)
	h, err := s.adminHandler(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	ts := httptest.NewServer(h)
	tb.Cleanup(ts.Close)
	return &backupNode{s: s, eng: eng, ts: ts}
}

// send sends one admin request with a body and returns the answer.
func (n *backupNode) send(tb testing.TB, method, path string, header http.Header, body []byte) (*http.Response, []byte) {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), method, n.ts.URL+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if header != nil {
		req.Header = header.Clone()
	}
	resp, err := n.ts.Client().Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp, raw
}

// sendJSON is send for a JSON answer.
func (n *backupNode) sendJSON(tb testing.TB, method, path string, header http.Header, body []byte) (int, map[string]any) {
	tb.Helper()
	resp, raw := n.send(tb, method, path, header, body)
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		tb.Fatalf("%s %s: %d answer is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, doc
}

func (n *backupNode) mutation(tb testing.TB) http.Header {
	tb.Helper()
	h := authed(n.s, n.s.Incarnation())
	h.Set(ActorHeader, "backup-test")
	h.Set(ReasonHeader, "issue 13")
	return h
}

// exportGroup exports group g over the admin plane.
func (n *backupNode) exportGroup(tb testing.TB, g uint32, minApplied uint64) ([]byte, string) {
	tb.Helper()
	resp, obj := n.send(tb, http.MethodGet, "/__ursula/backup/group/"+strconv.Itoa(int(g))+"/export?min_applied_index="+strconv.FormatUint(minApplied, 10), nil, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/octet-stream" {
		tb.Fatalf("export group %d: %d %s %q", g, resp.StatusCode, resp.Header.Get("Content-Type"), obj)
	}
	digest := resp.Header.Get(BackupBlake3Header)
	applied, _ := strconv.ParseUint(resp.Header.Get(AppliedIndexHeader), 10, 64)
	commit, _ := strconv.ParseUint(resp.Header.Get(CommitIndexHeader), 10, 64)
	if digest != backupfmt.Digest(obj) || applied < minApplied || commit < applied || resp.Header.Get(BackupNodeIDHeader) != "1" {
		tb.Fatalf("export group %d: headers %v", g, resp.Header)
	}
	o, _, err := backupfmt.DecodeGroup(obj)
	if err != nil || o.GetGroup() != g || o.GetAppliedIndex() != applied || o.GetClusterId() != testClusterID || o.GetGroupCount() != 4 {
		tb.Fatalf("export group %d: object %v, %v", g, o, err)
	}
	return obj, digest
}

// reencode decodes a group object, changes it and encodes it again.
func reencode(tb testing.TB, obj []byte, change func(*backupv1.GroupObject)) []byte {
	tb.Helper()
	var o backupv1.GroupObject
	if err := proto.Unmarshal(obj, &o); err != nil {
		tb.Fatal(err)
	}
	change(&o)
	b, err := backupfmt.EncodeGroup(&o)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestBackupAdminRoutes drives a backup and a restore through the admin
// plane: info, a hold, exports, cold checks and imports, with every
// refusal an import answers.
func TestBackupAdminRoutes(t *testing.T) {
	store := objstore.NewMemory()
	src := startBackupNode(t, store)
	content := fill(t, src.eng, "b", "s", 40)
	k := stream.Key{Bucket: "b", Stream: "s"}
	g := src.eng.Engine.GroupOf(k)

	code, info := src.sendJSON(t, http.MethodGet, "/__ursula/backup/info", nil, nil)
	want := map[string]any{"format_version": float64(backupfmt.FormatVersion), "cluster_id": testClusterID, "group_count": float64(4),
		"node_id": float64(1), "cold_store": "memory:", "cold_endpoint": "",
		"max_import_bytes": float64(src.eng.Engine.MaxImportBytes() - importOverhead)}
	if code != http.StatusOK || len(info) != len(want) {
		t.Fatalf("info: %d %v", code, info)
	}
	for k, v := range want {
		if info[k] != v {
			t.Fatalf("info %s = %v, want %v", k, info[k], v)
		}
	}

	holdPath := "/__ursula/backup/group/" + strconv.Itoa(int(g)) + "/hold?holder=backup-1&ttl_ms=600000"
	if code, doc := src.sendJSON(t, http.MethodPost, holdPath, authed(src.s, ""), nil); code != http.StatusPreconditionRequired {
		t.Fatalf("hold without the process incarnation: %d %v", code, doc)
	}
	if code, doc := src.sendJSON(t, http.MethodPost, "/__ursula/backup/group/"+strconv.Itoa(int(g))+"/hold?holder=x&ttl_ms=soon", src.mutation(t), nil); code != http.StatusBadRequest || doc["code"] != "INVALID_ARGUMENT" {
		t.Fatalf("hold with a bad ttl: %d %v", code, doc)
	}
	code, doc := src.sendJSON(t, http.MethodPost, holdPath, src.mutation(t), nil)
	index, _ := doc["index"].(float64)
	if code != http.StatusOK || index == 0 || !src.eng.Engine.GCHeld(g) {
		t.Fatalf("hold: %d %v", code, doc)
	}
	if code, doc := src.sendJSON(t, http.MethodGet, "/__ursula/backup/group/9/export", nil, nil); code != http.StatusNotFound || doc["code"] != "NOT_FOUND" {
		t.Fatalf("export of no group: %d %v", code, doc)
	}
	obj, digest := src.exportGroup(t, g, uint64(index))
	others := map[uint32][]byte{}
	for h := range uint32(4) {
		if h != g {
			others[h], _ = src.exportGroup(t, h, 0)
		}
	}
	coldCheck := func(n *backupNode, group uint32, obj []byte) map[string]any {
		t.Helper()
		code, doc := n.sendJSON(t, http.MethodPost, "/__ursula/backup/group/"+strconv.Itoa(int(group))+"/cold-check", n.mutation(t), obj)
		if code != http.StatusOK {
			t.Fatalf("cold check: %d %v", code, doc)
		}
		return doc
	}
	if doc := coldCheck(src, g, obj); doc["checked"].(float64) < 2 || doc["missing"] != float64(0) || len(doc["first_missing"].([]any)) != 0 {
		t.Fatalf("cold check of a complete backup: %v", doc)
	}
	// The source's group holds data: an import there would be refused,
	// and the cold check says so before any import is tried.
	if doc := coldCheck(src, g, obj); !strings.Contains(doc["import_refusal"].(string), "holds") || doc["imported"] != false {
		t.Fatalf("cold check of a group that holds data: %v", doc)
	}

	dst := startBackupNode(t, store)
	importPath := func(group uint32) string { return "/__ursula/backup/group/" + strconv.Itoa(int(group)) + "/import" }
	withDigest := func(d string) http.Header {
		h := dst.mutation(t)
		if d != "" {
			h.Set(BackupBlake3Header, d)
		}
		return h
	}
	other := (g + 1) % 4
	big := bytes.Repeat([]byte("x"), dst.s.cfg.MaxMessageBytes+1)
	for _, tc := range []struct {
		name   string
		group  uint32
		header http.Header
		body   []byte
		status int
		code   string
		says   []string
	}{
		{"without the digest", g, withDigest(""), obj, http.StatusBadRequest, "INVALID_ARGUMENT", []string{BackupBlake3Header}},
		{"a digest of other bytes", g, withDigest(backupfmt.Digest([]byte("other"))), obj, http.StatusBadRequest, "INVALID_ARGUMENT", []string{"digest"}},
		{"a digest that is no digest", g, withDigest("abc"), obj, http.StatusBadRequest, "INVALID_ARGUMENT", nil},
		{"another format version", g, nil, reencode(t, obj, func(o *backupv1.GroupObject) { o.FormatVersion = 2 }), http.StatusBadRequest, "BACKUP_MISMATCH", []string{"version 2", "reads 1"}},
		{"another cluster", g, nil, reencode(t, obj, func(o *backupv1.GroupObject) { o.ClusterId = "elsewhere" }), http.StatusBadRequest, "BACKUP_MISMATCH", []string{"elsewhere", testClusterID}},
		{"another group count", g, nil, reencode(t, obj, func(o *backupv1.GroupObject) { o.GroupCount = 8 }), http.StatusBadRequest, "BACKUP_MISMATCH", []string{"8 groups"}},
		{"the object of another group", other, nil, obj, http.StatusBadRequest, "INVALID_ARGUMENT", []string{"holds group"}},
		{"bytes that are no group object", g, nil, []byte("garbage"), http.StatusBadRequest, "INVALID_ARGUMENT", nil},
		{"a damaged snapshot", g, nil, reencode(t, obj, func(o *backupv1.GroupObject) { o.Snapshot = o.Snapshot[:len(o.Snapshot)/2] }), http.StatusBadRequest, "INVALID_ARGUMENT", nil},
		{"no body", g, nil, nil, http.StatusBadRequest, "INVALID_ARGUMENT", nil},
		{"above max_message_bytes", g, nil, big, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", nil},
		{"an unknown group", 7, nil, obj, http.StatusNotFound, "NOT_FOUND", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.header
			if h == nil {
				h = withDigest(backupfmt.Digest(tc.body))
			}
			code, doc := dst.sendJSON(t, http.MethodPost, importPath(tc.group), h, tc.body)
			if code != tc.status || doc["code"] != tc.code {
				t.Fatalf("import: %d %v, want %d %s", code, doc, tc.status, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(doc["message"].(string), s) {
					t.Fatalf("message %q does not say %q", doc["message"], s)
				}
			}
			if _, ok := dst.eng.Engine.Imported(g); ok {
				t.Fatal("a refused import was applied")
			}
		})
	}

	code, doc = dst.sendJSON(t, http.MethodPost, importPath(g), withDigest(digest), obj)
	if code != http.StatusOK || doc["already"] != false || doc["index"].(float64) == 0 || doc["streams"] != float64(1) {
		t.Fatalf("import: %d %v", code, doc)
	}
	first := doc["index"]
	code, doc = dst.sendJSON(t, http.MethodPost, importPath(g), withDigest(digest), obj)
	if code != http.StatusOK || doc["already"] != true || doc["index"] != first {
		t.Fatalf("repeated import: %d %v, want already at %v", code, doc, first)
	}
	for h, o := range others {
		if code, doc := dst.sendJSON(t, http.MethodPost, importPath(h), withDigest(backupfmt.Digest(o)), o); code != http.StatusOK {
			t.Fatalf("import group %d: %d %v", h, code, doc)
		}
	}
	if got := readWhole(t, dst.eng, "b", "s"); got != content {
		t.Fatalf("the restored stream reads %q, want %q", got, content)
	}
	srcInfo, _ := src.eng.Engine.Head(t.Context(), &streamv1.HeadRequest{Ref: &streamv1.StreamRef{Bucket: "b", Stream: "s"}})
	dstInfo, err := dst.eng.Engine.Head(t.Context(), &streamv1.HeadRequest{Ref: &streamv1.StreamRef{Bucket: "b", Stream: "s"}})
	if err != nil || dstInfo.GetInfo().GetPreviousIncarnation() != srcInfo.GetInfo().GetIncarnation() || dstInfo.GetInfo().GetInheritedOffset() != srcInfo.GetInfo().GetNextOffset() {
		t.Fatalf("HEAD after the restore %v (%v), source %v", dstInfo.GetInfo(), err, srcInfo.GetInfo())
	}
	if doc := coldCheck(dst, g, obj); doc["missing"] != float64(0) {
		t.Fatalf("cold check on the restored node: %v", doc)
	}

	t.Run("an import into a group that is not empty", func(t *testing.T) {
		zero := others[0]
		if g == 0 {
			zero = obj
		}
		code, doc := src.sendJSON(t, http.MethodPost, importPath(0), withDigest(backupfmt.Digest(zero)), zero)
		// The source's group 0 holds the bucket (the request carries the
		// target's token, the source's own is needed).
		if code != http.StatusUnauthorized {
			t.Fatalf("another node's token: %d %v", code, doc)
		}
		h := src.mutation(t)
		h.Set(BackupBlake3Header, backupfmt.Digest(zero))
		code, doc = src.sendJSON(t, http.MethodPost, importPath(0), h, zero)
		if code != http.StatusConflict || doc["code"] != "GROUP_NOT_EMPTY" {
			t.Fatalf("import into the source's group 0: %d %v", code, doc)
		}
	})

	t.Run("a cold check finds missing objects", func(t *testing.T) {
		var chunk string
		for _, key := range listKeys(t, store, "b/") {
			if strings.Contains(key, "/c/") {
				chunk = key
				break
			}
		}
		if err := store.Delete(t.Context(), chunk); err != nil {
			t.Fatal(err)
		}
		doc := coldCheck(src, g, obj)
		if doc["missing"] != float64(1) || len(doc["first_missing"].([]any)) != 1 || doc["first_missing"].([]any)[0] != chunk {
			t.Fatalf("cold check after deleting %s: %v", chunk, doc)
		}
	})

	t.Run("the mutations are audited", func(t *testing.T) {
		_, raw := rawDo(t, dst.ts.Client(), http.MethodGet, dst.ts.URL+"/__ursula/audit?limit=100", nil)
		if !strings.Contains(raw, `"operation":"POST /__ursula/backup/group/`+strconv.Itoa(int(g))+`/import"`) || !strings.Contains(raw, `"actor":"backup-test"`) ||
			!strings.Contains(raw, `"code":"BACKUP_MISMATCH"`) {
			t.Fatalf("audit trail %s", raw)
		}
	})
}

// TestBackupServiceGRPC: the client plane's BackupService answers with
// the contract's codes.
func TestBackupServiceGRPC(t *testing.T) {
	store := objstore.NewMemory()
	src := startBackupNode(t, store)
	fill(t, src.eng, "b", "s", 5)
	client := backupv1.NewBackupServiceClient(src.s.Conn())
	info, err := client.GetBackupInfo(t.Context(), &backupv1.GetBackupInfoRequest{})
	if err != nil || info.GetFormatVersion() != backupfmt.FormatVersion || info.GetGroupCount() != 4 || info.GetColdStore() != "memory:" {
		t.Fatalf("info %v, %v", info, err)
	}
	hold, err := client.HoldColdGC(t.Context(), &backupv1.HoldColdGCRequest{Group: 0, Holder: "h", TtlMs: 1000})
	if err != nil || hold.GetIndex() == 0 {
		t.Fatalf("hold %v, %v", hold, err)
	}
	if _, err := client.HoldColdGC(t.Context(), &backupv1.HoldColdGCRequest{Group: 0, Holder: "h", TtlMs: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("hold with a negative ttl: %v", err)
	}
	ex, err := client.ExportGroup(t.Context(), &backupv1.ExportGroupRequest{Group: 0, MinAppliedIndex: hold.GetIndex()})
	if err != nil || ex.GetBlake3() != backupfmt.Digest(ex.GetObject()) || ex.GetAppliedIndex() < hold.GetIndex() || ex.GetNodeId() != 1 {
		t.Fatalf("export %v, %v", ex, err)
	}
	check, err := client.ColdCheck(t.Context(), &backupv1.ColdCheckRequest{Group: 0, Object: ex.GetObject()})
	if err != nil || check.GetMissing() != 0 {
		t.Fatalf("cold check %v, %v", check, err)
	}
	for _, tc := range []struct {
		name string
		req  *backupv1.ImportGroupRequest
		want codes.Code
	}{
		{"no digest", &backupv1.ImportGroupRequest{Group: 0, Object: ex.GetObject()}, codes.InvalidArgument},
		{"another version", func() *backupv1.ImportGroupRequest {
			o := reencode(t, ex.GetObject(), func(o *backupv1.GroupObject) { o.FormatVersion = 7 })
			return &backupv1.ImportGroupRequest{Group: 0, Object: o, Blake3: backupfmt.Digest(o)}
		}(), codes.FailedPrecondition},
		{"a group that holds buckets", &backupv1.ImportGroupRequest{Group: 0, Object: ex.GetObject(), Blake3: ex.GetBlake3()}, codes.FailedPrecondition},
	} {
		_, err := client.ImportGroup(t.Context(), tc.req)
		if status.Code(err) != tc.want {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestBackupErrorsOnTheAdminPlane: a follower's NOT_LEADER names the
// leader, as on every admin route.
func TestBackupErrorsOnTheAdminPlane(t *testing.T) {
	rec := httptest.NewRecorder()
	adminFail(rec, fault.Errorf(fault.ErrNotLeader, "not the leader").With(fault.DetailLeaderID, "3"))
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != http.StatusConflict || doc["code"] != "NOT_LEADER" || doc["leader_id"] != float64(3) {
		t.Fatalf("NOT_LEADER: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	adminFail(rec, fault.Errorf(fault.ErrGroupNotEmpty, "group 2 holds 1 streams"))
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"GROUP_NOT_EMPTY"`) {
		t.Fatalf("GROUP_NOT_EMPTY: %d %s", rec.Code, rec.Body)
	}
}

// TestHeldColdGCThroughTheNode: while a backup holds a group, the cold-GC
// worker reclaims none of its queue, the orphan sweep deletes nothing and
// a purge keeps the bucket's objects; once released, all of them go on.
func TestHeldColdGCThroughTheNode(t *testing.T) {
	store := objstore.NewMemory()
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	w := newWorker(t, s, store)
	fill(t, eng, "gc", "gone", 30)
	fill(t, eng, "tenant", "one", 30)
	k := stream.Key{Bucket: "gc", Stream: "gone"}
	m, _ := eng.Engine.Lookup(k)
	gonePrefix := coldfmt.StreamPrefix("gc", "gone", m.Incarnation)
	holds := map[uint32]bool{}
	for _, b := range []string{"gc", "tenant"} {
		g := eng.Engine.GroupOf(stream.Key{Bucket: b, Stream: map[string]string{"gc": "gone", "tenant": "one"}[b]})
		if !holds[g] {
			if _, err := s.backup.hold(t.Context(), g, "backup-1", 600000); err != nil {
				t.Fatal(err)
			}
			holds[g] = true
		}
	}
	if _, err := eng.Engine.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: &streamv1.StreamRef{Bucket: "gc", Stream: "gone"}}); err != nil {
		t.Fatal(err)
	}
	if n, err := w.Reclaim(t.Context(), ""); err != nil || n != 0 {
		t.Fatalf("reclaim while held: %d, %v", n, err)
	}
	if n, err := w.Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("sweep while held: %d, %v", n, err)
	}
	if w.Stats().HeldSkips.Load() < 2 || len(listKeys(t, store, gonePrefix)) == 0 {
		t.Fatalf("held skips %d; objects of the deleted stream: %v", w.Stats().HeldSkips.Load(), listKeys(t, store, gonePrefix))
	}
	rep, err := s.purge(t.Context(), "tenant")
	if err != nil || rep.ColdGcError == nil || !strings.Contains(rep.GetColdGcError(), "held by a backup") || len(listKeys(t, store, "tenant/")) == 0 {
		t.Fatalf("purge while held: %+v, %v", rep, err)
	}
	for g := range holds {
		if _, err := s.backup.hold(t.Context(), g, "backup-1", 0); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := w.Reclaim(t.Context(), ""); err != nil || n == 0 {
		t.Fatalf("reclaim after the release: %d, %v", n, err)
	}
	if keys := listKeys(t, store, gonePrefix); len(keys) != 0 {
		t.Fatalf("objects of the deleted stream remain after the release: %v", keys)
	}
	if rep, err := s.purge(t.Context(), "tenant"); err != nil || !rep.GetBucketPrefixAbsent() {
		t.Fatalf("purge after the release: %+v, %v", rep, err)
	}
}
