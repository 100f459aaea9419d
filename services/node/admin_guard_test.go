package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/internal/pki"
	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

const testToken = "s3cr3t-admin-token-0123456789-abcdefghij"

// writeTokenFile writes content to a file of the given mode and returns its
// path.
func writeTokenFile(tb testing.TB, content string, mode os.FileMode) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "admin.token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestAdminTokenFile(t *testing.T) {
	long := strings.Repeat("k", 40)
	tests := []struct {
		name    string
		path    func(t *testing.T) string
		wantErr string // "" accepts the file
	}{
		{"token with a trailing newline", func(t *testing.T) string { return writeTokenFile(t, testToken+"\n", 0o600) }, ""},
		{"read-only token without newline", func(t *testing.T) string { return writeTokenFile(t, testToken, 0o400) }, ""},
		{"exactly 32 bytes", func(t *testing.T) string { return writeTokenFile(t, strings.Repeat("x", 32), 0o600) }, ""},
		{"missing file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, "no such file"},
		{"symlink to a good file", func(t *testing.T) string {
			target := writeTokenFile(t, testToken, 0o600)
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			return link
		}, "symlink"},
		{"directory", func(t *testing.T) string { return t.TempDir() }, "not a regular file"},
		{"group readable", func(t *testing.T) string { return writeTokenFile(t, testToken, 0o640) }, "group or others"},
		{"group writable", func(t *testing.T) string { return writeTokenFile(t, testToken, 0o620) }, "group or others"},
		{"others readable", func(t *testing.T) string { return writeTokenFile(t, testToken, 0o604) }, "group or others"},
		{"world readable", func(t *testing.T) string { return writeTokenFile(t, testToken, 0o644) }, "group or others"},
		{"short token", func(t *testing.T) string { return writeTokenFile(t, strings.Repeat("x", 31)+"\n", 0o600) }, "at least 32"},
		{"empty file", func(t *testing.T) string { return writeTokenFile(t, "", 0o600) }, "at least 32"},
		{"carriage return", func(t *testing.T) string { return writeTokenFile(t, testToken+"\r\n", 0o600) }, "carriage return"},
		{"NUL byte", func(t *testing.T) string { return writeTokenFile(t, testToken[:10]+"\x00"+testToken[10:], 0o600) }, "NUL"},
		{"inner newline", func(t *testing.T) string { return writeTokenFile(t, testToken+"\n"+long+"\n", 0o600) }, "more than one line"},
		{"two trailing newlines", func(t *testing.T) string { return writeTokenFile(t, testToken+"\n\n", 0o600) }, "more than one line"},
		{"other control character", func(t *testing.T) string { return writeTokenFile(t, testToken+"\t"+long, 0o600) }, "control character"},
		{"surrounding blank", func(t *testing.T) string { return writeTokenFile(t, " "+testToken, 0o600) }, "blank"},
		{"too large", func(t *testing.T) string { return writeTokenFile(t, strings.Repeat("x", 5000), 0o600) }, "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			tok, err := loadAdminToken(path)
			cfg := testConfig("127.0.0.1:0", "127.0.0.1:0")
			cfg.AdminTokenFile = path
			verr := cfg.Validate()
			if tc.wantErr == "" {
				if err != nil || tok == nil || verr != nil {
					t.Fatalf("refused: %v (Validate: %v)", err, verr)
				}
				return
			}
			if err == nil || verr == nil {
				t.Fatalf("accepted (Validate: %v), want an error about %q", verr, tc.wantErr)
			}
			for _, e := range []error{err, verr} {
				msg := e.Error()
				if !strings.Contains(msg, tc.wantErr) || !strings.Contains(msg, "server.admin_token_file") {
					t.Errorf("error %q does not name the setting and %q", msg, tc.wantErr)
				}
				if strings.Contains(msg, testToken[:12]) || strings.Contains(msg, long) {
					t.Errorf("error %q contains the token", msg)
				}
			}
		})
	}
	if tok, err := loadAdminToken(""); tok != nil || err != nil {
		t.Errorf("no token file: %v, %v; want no token", tok, err)
	}
}

// rawDo sends one request and returns the answer with its whole body.
func rawDo(tb testing.TB, client *http.Client, method, url string, header http.Header) (*http.Response, string) {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header = header
	if h := header.Get("Host"); h != "" {
		req.Host = h // net/http sends req.Host, not the header
	}
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp, string(b)
}

// TestAdminGuard checks the middleware in front of the admin gateway: the
// token on every request, then the process incarnation on mutations, both
// answered before anything changes.
func TestAdminGuard(t *testing.T) {
	eng := startEngine(t)
	cfg := testConfig("127.0.0.1:0", "127.0.0.1:0")
	cfg.AdminTokenFile = writeTokenFile(t, testToken+"\n", 0o600)
	s, err := New(cfg, eng, Deps{}, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h, err := s.adminHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	const wrong = "not-the-token-but-just-as-long-0123456789"
	bearer := "Bearer " + testToken
	tests := []struct {
		name     string
		method   string
		path     string
		header   http.Header
		wantCode int
		wantErr  string
	}{
		{"read on loopback without a token", http.MethodGet, "/__ursula/metrics", nil, http.StatusOK, ""},
		{"read with another token", http.MethodGet, "/__ursula/metrics", hdr("Authorization", "Bearer "+wrong), http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"read with the token as basic credentials", http.MethodGet, "/__ursula/metrics", hdr("Authorization", "Basic "+testToken), http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"read with the bare token", http.MethodGet, "/__ursula/metrics", hdr("Authorization", testToken), http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"profiles are off", http.MethodGet, "/debug/pprof/", hdr("Authorization", bearer), http.StatusNotFound, "NOT_FOUND"},
		{"unknown path without a token", http.MethodGet, "/__ursula/nothing", nil, http.StatusNotFound, "NOT_FOUND"},
		{"another site's host name", http.MethodGet, "/__ursula/metrics", hdr("Host", "rebound.example:4438"), http.StatusForbidden, "PERMISSION_DENIED"},
		{"mutation from another site's host name", http.MethodPost, "/__ursula/leadership-shed/maintenance", hdr("Host", "rebound.example", "Authorization", bearer, IncarnationHeader, s.Incarnation()), http.StatusForbidden, "PERMISSION_DENIED"},
		{"localhost", http.MethodGet, "/__ursula/metrics", hdr("Host", "localhost:4438"), http.StatusOK, ""},
		{"mutation without a token", http.MethodPost, "/__ursula/leadership-shed/maintenance", hdr(IncarnationHeader, s.Incarnation()), http.StatusUnauthorized, "UNAUTHENTICATED"},
		{"mutation without the incarnation", http.MethodPost, "/__ursula/leadership-shed/maintenance", hdr("Authorization", bearer), http.StatusPreconditionRequired, "INCARNATION_REQUIRED"},
		{"mutation of another incarnation", http.MethodPost, "/__ursula/leadership-shed/maintenance", hdr("Authorization", bearer, IncarnationHeader, "old"), http.StatusPreconditionFailed, "INCARNATION_MISMATCH"},
		{"snapshot without the incarnation", http.MethodPost, "/__ursula/raft/0/snapshot", hdr("Authorization", bearer), http.StatusPreconditionRequired, "INCARNATION_REQUIRED"},
		{"read with the token", http.MethodGet, "/__ursula/leadership-shed", hdr("Authorization", bearer), http.StatusOK, ""},
		{"scheme in lower case", http.MethodGet, "/__ursula/metrics", hdr("Authorization", "bearer "+testToken), http.StatusOK, ""},
	}
	snapIndex := eng.Cluster.Status(0).SnapshotIndex
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawDo(t, ts.Client(), tc.method, ts.URL+tc.path, tc.header)
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("answer %d %s, want %d", resp.StatusCode, body, tc.wantCode)
			}
			if strings.Contains(body, testToken) || strings.Contains(body, wrong) {
				t.Errorf("answer echoes a token: %s", body)
			}
			if tc.wantErr == "" {
				return
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(body), &doc); err != nil || doc["code"] != tc.wantErr {
				t.Fatalf("body %s, want JSON with code %s", body, tc.wantErr)
			}
			if tc.wantCode == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a Bearer challenge: %q", resp.Header.Get("WWW-Authenticate"))
			}
			if eng.Cluster.Draining() {
				t.Error("a refused request turned the drain on")
			}
			if got := eng.Cluster.Status(0).SnapshotIndex; got != snapIndex {
				t.Errorf("a refused request took a snapshot: index %d, was %d", got, snapIndex)
			}
		})
	}
	resp, body := rawDo(t, ts.Client(), http.MethodPost, ts.URL+"/__ursula/leadership-shed/maintenance",
		hdr("Authorization", bearer, IncarnationHeader, s.Incarnation()))
	if resp.StatusCode != http.StatusOK || !eng.Cluster.Draining() {
		t.Fatalf("authorized drain: %d %s, draining %v", resp.StatusCode, body, eng.Cluster.Draining())
	}
}

// TestAdminTokenCreated checks the token file a node creates in its data
// directory when none is configured: mode 600, a 64-digit hex token, kept
// across restarts; and the refusals of a token file others could replace.
func TestAdminTokenCreated(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	path := filepath.Join(eng.Config().DataDir, "admin.token")
	if s.adminTokenFile != path {
		t.Fatalf("token file %s, want %s", s.adminTokenFile, path)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v; want 0600", err, fi)
	}
	tok, err := pki.ReadTokenFile(path)
	if err != nil || len(tok) != 64 {
		t.Fatalf("token %d bytes, %v; want 64 hex digits", len(tok), err)
	}
	again := newServer(t, eng)
	if tok2, _ := pki.ReadTokenFile(again.adminTokenFile); string(tok2) != string(tok) {
		t.Fatal("a second start replaced the token")
	}

	t.Run("in a directory others may write", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "admin.token")
		if err := os.WriteFile(p, []byte(testToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig("127.0.0.1:0", "127.0.0.1:0")
		cfg.AdminTokenFile = p
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
			t.Fatalf("Validate = %v, want a refusal of the directory", err)
		}
	})
}

// TestAdminProfilesAndRemote checks profiles behind -admin.pprof and the
// token, and a non-loopback admin plane, where every request needs the
// token.
func TestAdminProfilesAndRemote(t *testing.T) {
	eng := startEngine(t)
	ca, err := pki.NewCA("admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue(pki.NodeIdentity(1), nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files, err := is.Save(dir, "node1", filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("127.0.0.1:0", "0.0.0.0:0")
	cfg.AllowNonLoopbackAdmin, cfg.AdminPprof, cfg.AdminTLS = true, true, files
	cfg.AdminTokenFile = writeTokenFile(t, testToken, 0o600)
	s, err := New(cfg, eng, Deps{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	h, err := s.adminHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	bearer := http.Header{"Authorization": {"Bearer " + testToken}}
	for _, tc := range []struct {
		path   string
		header http.Header
		want   int
	}{
		{"/__ursula/metrics", nil, http.StatusUnauthorized},
		{"/__ursula/metrics", bearer, http.StatusOK},
		{"/debug/pprof/", nil, http.StatusUnauthorized},
		{"/debug/pprof/", bearer, http.StatusOK},
	} {
		if resp, body := rawDo(t, ts.Client(), http.MethodGet, ts.URL+tc.path, tc.header); resp.StatusCode != tc.want {
			t.Errorf("GET %s (token %v): %d %.200s, want %d", tc.path, tc.header != nil, resp.StatusCode, body, tc.want)
		}
	}
	bad := testConfig("127.0.0.1:0", "0.0.0.0:0")
	bad.AllowNonLoopbackAdmin = true
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "admin_tls is required") {
		t.Errorf("a non-loopback admin plane without TLS: %v", err)
	}
}

func TestAdminSnapshotAndPurge(t *testing.T) {
	s, eng, ts := adminServer(t)
	inc := authed(s, s.Incarnation())
	ref := &streamv1.StreamRef{Bucket: "snap", Stream: "s"}
	ctx := t.Context()
	if _, err := eng.Engine.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: ref.Bucket}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Engine.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Engine.Append(ctx, &streamv1.AppendRequest{Ref: ref, ContentType: "text/plain", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	g := eng.Engine.GroupOf(stream.Key{Bucket: ref.Bucket, Stream: ref.Stream})
	applied := eng.Cluster.Status(g).Applied
	base := fmt.Sprintf("%s/__ursula/raft/%d", ts.URL, g)

	code, body := do(t, ts.Client(), http.MethodPost, base+"/snapshot", inc)
	if code != http.StatusOK || body["raft_group_id"] != float64(g) || body["snapshot_index"].(float64) < float64(applied) {
		t.Fatalf("snapshot: %d %v, want group %d at index >= %d", code, body, g, applied)
	}
	snap := uint64(body["snapshot_index"].(float64))
	if st := eng.Cluster.Status(g); st.SnapshotIndex != snap {
		t.Fatalf("group status snapshot index %d, answer %d", st.SnapshotIndex, snap)
	}
	tests := []struct {
		name     string
		path     string
		wantCode int
		want     map[string]any
	}{
		{"snapshot again", "/snapshot", http.StatusOK, map[string]any{"snapshot_index": float64(snap)}},
		{"purge below the snapshot", "/purge?upto=1", http.StatusOK, map[string]any{"purged_through": float64(1)}},
		{"purge bounded by the snapshot", "/purge?upto=1000000", http.StatusOK, map[string]any{"purged_through": float64(snap)}},
		{"purge without upto", "/purge", http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT"}},
		{"purge with a bad upto", "/purge?upto=x", http.StatusBadRequest, map[string]any{"code": "INVALID_ARGUMENT"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(t, ts.Client(), http.MethodPost, base+tc.path, inc)
			if code != tc.wantCode {
				t.Fatalf("answer %d %v, want %d", code, body, tc.wantCode)
			}
			for k, v := range tc.want {
				if body[k] != v {
					t.Errorf("%s = %v, want %v (%v)", k, body[k], v, body)
				}
			}
		})
	}
	for _, path := range []string{"/__ursula/raft/8/snapshot", "/__ursula/raft/x/purge?upto=1"} {
		if code, body := do(t, ts.Client(), http.MethodPost, ts.URL+path, inc); code != http.StatusBadRequest || body["code"] != "INVALID_ARGUMENT" {
			t.Errorf("%s: %d %v, want 400 INVALID_ARGUMENT", path, code, body)
		}
	}
	if code, body := do(t, ts.Client(), http.MethodGet, base+"/snapshot", nil); code != http.StatusMethodNotAllowed || body["code"] != "METHOD_NOT_ALLOWED" {
		t.Errorf("GET snapshot: %d %v, want 405", code, body)
	}
	if code, body := do(t, ts.Client(), http.MethodGet, ts.URL+"/__ursula/nothing", nil); code != http.StatusNotFound || body["code"] != "NOT_FOUND" {
		t.Errorf("unknown path: %d %v, want 404", code, body)
	}
}

// TestAdminColdEndpoints checks flush-cold with a stream name holding
// slashes and the purge report's exact fields.
func TestAdminColdEndpoints(t *testing.T) {
	store := objstore.NewMemory()
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	h, err := s.adminHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	inc := authed(s, s.Incarnation())

	fill(t, eng, "tenant-a", "a/b/c", 10)
	code, body := do(t, ts.Client(), http.MethodPost, ts.URL+"/__ursula/flush-cold/tenant-a/a/b/c", inc)
	if code != http.StatusOK || body["bucket"] != "tenant-a" || body["stream"] != "a/b/c" || body["cold_offset"] != body["next_offset"] || body["next_offset"] == "" {
		t.Fatalf("flush-cold: %d %v", code, body)
	}
	if code, body := do(t, ts.Client(), http.MethodPost, ts.URL+"/__ursula/flush-cold/tenant-a/none", inc); code != http.StatusNotFound || body["code"] != "STREAM_NOT_FOUND" {
		t.Errorf("flush-cold of a missing stream: %d %v, want 404", code, body)
	}

	resp, raw := rawDo(t, ts.Client(), http.MethodDelete, ts.URL+"/__ursula/purge/tenant-a", inc)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("purge: %d %s", resp.StatusCode, raw)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bucket": `"tenant-a"`, "removed_streams": `1`, "cold_gc_pending_entries": `0`, "cold_gc_complete": `true`,
		"cold_gc_error": `null`, "bucket_prefix_absent": `true`,
		// The deleted-data bound's part (this node's replicas): the
		// purged stream's group holds its records until the bound's
		// driver erases them, within the (default) bound.
		"raft_deleted_data_max_age_ms": `3600000`, "raft_erasure_complete": `false`, "raft_erasure_pending_groups": `[0]`,
	}
	for k, v := range want {
		if string(doc[k]) != v {
			t.Errorf("%s = %s, want %s (%s)", k, doc[k], v, raw)
		}
	}
	var due string
	if err := json.Unmarshal(doc["raft_erasure_due_by"], &due); err != nil {
		t.Errorf("raft_erasure_due_by = %s: %v", doc["raft_erasure_due_by"], err)
	} else if at, err := time.Parse(time.RFC3339, due); err != nil || at.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("raft_erasure_due_by = %s (%v): want about an hour from now", due, err)
	}
	if len(doc) != 12 || doc["groups_with_streams"] == nil || doc["cold_gc_entries_reclaimed"] == nil {
		t.Errorf("report has %d fields, want the seed's 8 and the 4 of the deleted-data bound: %s", len(doc), raw)
	}
}

func TestAdminJSON(t *testing.T) {
	tests := []struct {
		name string
		msg  proto.Message
		want string
	}{
		{"zero values and null optional", &adminv1.PurgeBucketResponse{Bucket: "b"},
			`{"bucket":"b","bucket_prefix_absent":false,"cold_gc_complete":false,"cold_gc_entries_reclaimed":0,"cold_gc_error":null,"cold_gc_pending_entries":0,"groups_with_streams":[],"raft_deleted_data_max_age_ms":0,"raft_erasure_complete":false,"raft_erasure_due_by":null,"raft_erasure_pending_groups":[],"removed_streams":0}`},
		{"set optional and 64-bit numbers", &adminv1.PurgeBucketResponse{Bucket: "b", RemovedStreams: 1 << 60, GroupsWithStreams: []uint32{3}, ColdGcError: proto.String("boom")},
			`{"bucket":"b","bucket_prefix_absent":false,"cold_gc_complete":false,"cold_gc_entries_reclaimed":0,"cold_gc_error":"boom","cold_gc_pending_entries":0,"groups_with_streams":[3],"raft_deleted_data_max_age_ms":0,"raft_erasure_complete":false,"raft_erasure_due_by":null,"raft_erasure_pending_groups":[],"removed_streams":1152921504606846976}`},
		{"repeated 64-bit numbers", &adminv1.SetMembershipResponse{RaftGroupId: 4, Voters: []uint64{1, 2, 3}, CommittedIndex: 17},
			`{"committed_index":17,"raft_group_id":4,"voters":[1,2,3]}`},
		{"shed state", &adminv1.LeadershipShedState{ClusterId: "c", NodeId: 2, State: "normal", ShouldCampaign: true, ShouldAcceptTransfer: true},
			`{"bits":0,"cluster_id":"c","node_id":2,"should_accept_transfer":true,"should_campaign":true,"should_shed_current_leaders":false,"state":"normal"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := marshalAdminJSON(tc.msg)
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %s, %v\nwant %s", got, err, tc.want)
			}
		})
	}
}

// TestAdminErrorTable checks the admin plane's error answers.
func TestAdminErrorTable(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantCode   int
		wantErr    string
		wantLeader any
		wantRetry  string
	}{
		{"not leader", toStatus(fault.Errorf(fault.ErrNotLeader, "x").With(fault.DetailLeaderID, "3")), http.StatusConflict, "NOT_LEADER", float64(3), ""},
		{"not leader, leader unknown", toStatus(fault.Errorf(fault.ErrNotLeader, "x")), http.StatusConflict, "NOT_LEADER", float64(0), ""},
		{"engine not leader", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "x").With(errcode.KeyLeaderID, "2").With(errcode.KeyRetryAfterMS, "200")), http.StatusConflict, "NOT_LEADER", float64(2), ""},
		{"not a voter", toStatus(fault.Errorf(fault.ErrNotAVoter, "x")), http.StatusBadRequest, "NOT_A_VOTER", nil, ""},
		{"worker busy", toStatus(fault.Errorf(fault.ErrUnavailable, "busy").With(fault.DetailRetryAfterMS, "1000")), http.StatusServiceUnavailable, "UNAVAILABLE", nil, "1"},
		{"cold store failed", toStatus(fault.Errorf(fault.ErrColdStoreFailed, "x")), http.StatusBadGateway, "COLD_STORE_FAILED", nil, ""},
		{"cold object corrupt", toStatus(fault.Errorf(fault.ErrColdObjectCorrupt, "x")), http.StatusBadGateway, "COLD_OBJECT_CORRUPT", nil, ""},
		{"longer retry", grpcerr.ToStatus(errcode.New(errcode.Overloaded, "x").With(errcode.KeyRetryAfterMS, "2500")), http.StatusServiceUnavailable, "OVERLOADED", nil, "3"},
		{"snapshot failed", toStatus(fault.Errorf(fault.ErrInternal, "x")), http.StatusInternalServerError, "INTERNAL", nil, ""},
		{"stream not found", grpcerr.ToStatus(errcode.New(errcode.StreamNotFound, "x")), http.StatusNotFound, "STREAM_NOT_FOUND", nil, ""},
		{"plain error", grpcerr.ToStatus(errors.New("boom")), http.StatusInternalServerError, "INTERNAL", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeAdminError(rec, adminDomainError(tc.err))
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if rec.Code != tc.wantCode || body["code"] != tc.wantErr || body["leader_id"] != tc.wantLeader {
				t.Fatalf("answer %d %v, want %d %s leader_id %v", rec.Code, body, tc.wantCode, tc.wantErr, tc.wantLeader)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.wantRetry {
				t.Errorf("Retry-After %q, want %q", got, tc.wantRetry)
			}
		})
	}
}

// TestAdminNotOnClientPlane checks that the client plane's gRPC server does
// not serve AdminService.
func TestAdminNotOnClientPlane(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	for name := range s.grpcServer.GetServiceInfo() {
		if strings.Contains(name, "admin") {
			t.Errorf("the client plane serves %s", name)
		}
	}
}

// TestAdminAudit checks the audit trail: an authenticated mutation is
// recorded with its asserted actor, reason, proof, how it authenticated
// and its outcome (refusals by the incarnation rule included), before it is
// answered; unauthenticated requests are counted, not recorded; the trail
// reads back at GET /__ursula/audit.
func TestAdminAudit(t *testing.T) {
	s, eng, ts := adminServer(t)
	h := authed(s, s.Incarnation())
	h.Set(ActorHeader, "alice")
	h.Set(ReasonHeader, "maintenance window 42")
	h.Set(ProofHeader, "sha256:abc")
	if code, body := do(t, ts.Client(), http.MethodPost, ts.URL+"/__ursula/leadership-shed/maintenance", h); code != http.StatusOK {
		t.Fatalf("drain: %d %v", code, body)
	}
	if code, _ := do(t, ts.Client(), http.MethodDelete, ts.URL+"/__ursula/leadership-shed/maintenance", authed(s, "")); code != http.StatusPreconditionRequired {
		t.Fatalf("undrain without the incarnation: %d", code)
	}
	if code, _ := do(t, ts.Client(), http.MethodDelete, ts.URL+"/__ursula/leadership-shed/maintenance", incarnation(s.Incarnation())); code != http.StatusUnauthorized {
		t.Fatalf("undrain without the token: %d", code)
	}
	if !eng.Cluster.Draining() {
		t.Fatal("a refused undrain changed the shed state")
	}
	resp, raw := rawDo(t, ts.Client(), http.MethodGet, ts.URL+"/__ursula/audit?limit=10", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET audit: %d %s", resp.StatusCode, raw)
	}
	var doc struct {
		Records []AuditRecord `json:"records"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Records) != 2 {
		t.Fatalf("%d records, want the two authenticated mutations: %s", len(doc.Records), raw)
	}
	first, second := doc.Records[0], doc.Records[1]
	if first.Operation != "POST /__ursula/leadership-shed/maintenance" || first.Actor != "alice" || first.ActorVerified ||
		first.Reason != "maintenance window 42" || first.Proof != "sha256:abc" || first.Auth != "token" || first.Status != http.StatusOK ||
		first.ProcessIncarnation != s.Incarnation() || first.PeerAddress == "" || first.NodeID != 1 {
		t.Errorf("first record %+v", first)
	}
	if second.Status != http.StatusPreconditionRequired || second.Code != "INCARNATION_REQUIRED" {
		t.Errorf("second record %+v, want the 428 refusal", second)
	}
	if got := s.metricsSnapshot()["admin_auth_refusals"]; got != float64(1) {
		t.Errorf("admin_auth_refusals = %v, want 1", got)
	}
	if strings.Contains(raw, testToken) {
		t.Error("the trail holds a token")
	}
}
