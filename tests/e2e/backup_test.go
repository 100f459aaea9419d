package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/ops/ursulactl"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/objstore/objstoretest"
	"github.com/ursula/ursula/tests/await"
)

// backupColdTOML is a [storage.cold] section on the test S3 server: small chunks
// and pages flushed quickly (so that most bytes are cold, behind several
// index levels), while streams written in small pieces keep their bytes
// hot (below flush_bytes, and flush_age is long).
func backupColdTOML(s3 *objstoretest.S3Server, prefix string) string {
	return fmt.Sprintf(`backend = "s3"
root = %q
flush_bytes = 4096
flush_age = "1h"
group_flush_bytes = 65536
max_chunk_bytes = 4096
flush_interval = "10ms"
block_bytes = 1024
s3 = { bucket = "cold", endpoint = %q, region = "us-east-1", path_style = true, access_key = %q, secret_key = %q }`,
		prefix, s3.Endpoint, s3.AccessKey, s3.SecretKey)
}

// drillState is what the source cluster acknowledged, and what the
// restored one must answer.
type drillState struct {
	mu sync.Mutex
	// want holds every stream's bytes (DS family name → bytes).
	want map[string][]byte
	// json holds the messages of JSON streams, in order.
	json map[string][]string
	// incarnation is each stream's token before the backup.
	incarnation map[string]string
}

func (s *drillState) add(stream string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want[stream] = append(s.want[stream], b...)
}

// TestBackupRestoreDrillPreservesStreamsAndAllowsContinuedAppends is the
// seed's recovery drill, on self-contained backups: a 3-node cluster with
// its cold tier on S3 is written (plain and JSON streams, a fork, a
// published snapshot and a retention floor, a closed stream, a TTL,
// producers; bytes both hot and cold), backed up to S3 while a writer
// keeps appending, verified, destroyed with its cold store, and restored
// into a new cluster under the same cluster id (a first restore is
// interrupted halfway and run again). Every acknowledged byte, offset and
// message boundary of the backup is read back under new incarnations,
// producer epochs are closed, and the streams take appends again. A
// corrupted byte in the backup fails verify and restore with the object
// named, and a second backup into one location copies only new objects.
func TestBackupRestoreDrillPreservesStreamsAndAllowsContinuedAppends(t *testing.T) {
	s3 := objstoretest.NewS3Server(t)
	s3.CreateBucket(t, "cold")
	s3.CreateBucket(t, "backups")
	// The in-process ursulactl reaches the S3 server through the SDK's
	// default chain and endpoint variables, as an operator's would.
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ENDPOINT_URL", s3.Endpoint)

	const groups = 8
	src := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: groups, Gateway: true, Cold: backupColdTOML(s3, "src")})
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	client := src.Client()
	st := &drillState{want: map[string][]byte{}, json: map[string][]string{}, incarnation: map[string]string{}}

	// Plain streams: three flushed cold (large appends; the first one long
	// enough to seal index pages), three kept hot.
	for i := range 6 {
		name := fmt.Sprintf("drill/plain-%d", i)
		mustStatus(t, "create "+name, 201)(client.Create(ctx, name, "text/plain", nil))
		n := 24
		if i == 0 {
			n = 400
		}
		for j := range n {
			body := fmt.Appendf(nil, "%s-%03d;", name, j)
			if i < 3 {
				body = append(body, bytes.Repeat([]byte{'a' + byte(i)}, 700)...)
			}
			mustAppend(ctx, t, client, name, "text/plain", body, nil)
			st.add(name, body)
		}
	}
	// A JSON stream: message boundaries must survive.
	for j := range 60 {
		msg := fmt.Sprintf(`{"n":%d,"pad":%q}`, j, strings.Repeat("j", 50+j%7))
		if j == 0 {
			mustStatus(t, "create drill/json", 201)(client.Create(ctx, "drill/json", "application/json", nil))
		}
		mustAppend(ctx, t, client, "drill/json", "application/json", []byte(msg), nil)
		st.json["drill/json"] = append(st.json["drill/json"], msg)
	}
	// A fork of a cold stream, diverging in its middle.
	forkAt := len(st.want["drill/plain-0"]) / 2
	forkOff := fmt.Sprintf("%016d_%016d", 0, forkAt)
	h := http.Header{"Content-Type": {"text/plain"}, "Stream-Forked-From": {StreamRoot + "drill/plain-0"}, "Stream-Fork-Offset": {forkOff}}
	mustStatus(t, "fork", 201)(client.Do(ctx, http.MethodPut, "drill/fork", nil, h, nil))
	st.add("drill/fork", st.want["drill/plain-0"][:forkAt])
	for j := range 5 {
		body := fmt.Appendf(nil, "fork-%d;", j)
		mustAppend(ctx, t, client, "drill/fork", "text/plain", body, nil)
		st.add("drill/fork", body)
	}
	// A producer: its dedup state and its epoch must come back.
	prod := &Producer{ID: "drill-producer", Epoch: 3}
	mustStatus(t, "create drill/producer", 201)(client.Create(ctx, "drill/producer", "text/plain", nil))
	for j := range 20 {
		prod.Seq = uint64(j)
		body := fmt.Appendf(nil, "p%02d;", j)
		mustAppend(ctx, t, client, "drill/producer", "text/plain", body, prod)
		st.add("drill/producer", body)
	}
	// A closed stream and a stream with a TTL.
	mustStatus(t, "create drill/closed", 201)(client.Create(ctx, "drill/closed", "text/plain", nil))
	mustAppend(ctx, t, client, "drill/closed", "text/plain", []byte("last words"), nil)
	st.add("drill/closed", []byte("last words"))
	mustStatus(t, "close drill/closed", 204, 200)(client.Do(ctx, http.MethodPost, "drill/closed", nil, http.Header{"Stream-Closed": {"true"}}, nil))
	mustStatus(t, "create drill/ttl-3600", 201)(client.Do(ctx, http.MethodPut, "drill/ttl-3600", nil,
		http.Header{"Content-Type": {"text/plain"}, "Stream-TTL": {"3600"}}, nil))
	mustAppend(ctx, t, client, "drill/ttl-3600", "text/plain", []byte("ephemeral"), nil)
	st.add("drill/ttl-3600", []byte("ephemeral"))
	// Ursula's family: a bucket, a published snapshot and a retention floor.
	ub := urlsulaClient{base: src.GatewayURL(), http: client.HTTP}
	mustStatus(t, "create bucket", 201, 200, 204)(ub.do(ctx, http.MethodPut, "/drillb", nil, nil))
	mustStatus(t, "create drillb/snap", 201)(ub.do(ctx, http.MethodPut, "/drillb/snap", http.Header{"Content-Type": {"text/plain"}}, nil))
	var snapBody []byte
	for j := range 30 {
		body := fmt.Appendf(nil, "u%03d;", j)
		mustStatus(t, "append drillb/snap", 200, 204)(ub.do(ctx, http.MethodPost, "/drillb/snap", http.Header{"Content-Type": {"text/plain"}}, body))
		snapBody = append(snapBody, body...)
	}
	snapAt := fmt.Sprintf("%016d_%016d", 0, 5*20)
	mustStatus(t, "publish snapshot", 204, 200)(ub.do(ctx, http.MethodPut, "/drillb/snap/snapshot/"+snapAt, http.Header{"Content-Type": {"application/octet-stream"}}, []byte("SNAPSHOT-AT-20")))
	retainAt := fmt.Sprintf("%016d_%016d", 0, 5*10)
	mustStatus(t, "retention", 204, 200)(ub.do(ctx, http.MethodPut, "/drillb/snap/retention/"+retainAt, nil, nil))

	// The incarnations before the backup, and the cold tier holding bytes.
	for name := range st.want {
		resp := mustStatus(t, "HEAD "+name, 200)(client.Do(ctx, http.MethodHead, name, nil, nil, nil))
		st.incarnation[name] = resp.Header.Get("Stream-Incarnation")
	}
	st.incarnation["drill/json"] = mustStatus(t, "HEAD drill/json", 200)(client.Do(ctx, http.MethodHead, "drill/json", nil, nil, nil)).Header.Get("Stream-Incarnation")
	waitColdObjects(ctx, t, s3, "src", 80)

	// Back up while a writer keeps appending.
	manifest := writeCtlManifest(t, src)
	live := startLiveWriter(ctx, t, client, "drill/live")
	live.waitAcked(ctx, t, 20)
	before := live.acked()
	create := runCtl(t, manifest, ursulactl.Env{}, "--actor", "e2e", "--reason", "drill", "backup-create", "--location", "s3://backups/drill", "--json")
	create.want(t, 0, "")
	during := live.stop(t)
	var m1 struct {
		ID          string `json:"id"`
		GroupCount  int    `json:"group_count"`
		ColdObjects []struct {
			Key    string `json:"key"`
			Object string `json:"object"`
		} `json:"cold_objects"`
	}
	if err := json.Unmarshal([]byte(create.stdout), &m1); err != nil {
		t.Fatalf("backup-create --json: %v\n%s", err, create.stdout)
	}
	if m1.GroupCount != groups || len(m1.ColdObjects) < 10 {
		t.Fatalf("backup %s holds %d groups and %d cold objects", m1.ID, m1.GroupCount, len(m1.ColdObjects))
	}
	runCtl(t, manifest, ursulactl.Env{}, "backup-verify", "--location", "s3://backups/drill", "--depth", "deep").want(t, 0, "")

	// Destroy the cluster: every process, data directory and cold object.
	src.Gateway.Close()
	for _, n := range src.Nodes {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := n.Wipe(); err != nil {
			t.Fatal(err)
		}
	}
	coldStore := openS3(ctx, t, s3, "cold", "")
	deleteAll(ctx, t, coldStore, "src/")

	// Restore into a new cluster under the same id; the first attempt is
	// interrupted once two groups are imported.
	dst := StartCluster(t, ClusterOptions{ClusterID: src.ID, Nodes: 3, GroupCount: groups, Gateway: true, Cold: backupColdTOML(s3, "dst")})
	dmanifest := writeCtlManifest(t, dst)
	// The plan first (read-only), then a restore bound to its proof: a
	// stale proof writes nothing.
	plan := runCtl(t, dmanifest, ursulactl.Env{}, "restore", "--location", "s3://backups/drill", "--plan")
	plan.want(t, 0, "")
	proof := planProof(t, plan.stdout)
	if !strings.HasPrefix(plan.stdout, "consequences:") || !strings.Contains(plan.stdout, "new Stream-Incarnation") {
		t.Errorf("the restore plan does not start with its consequences:\n%s", plan.stdout)
	}
	runCtl(t, dmanifest, ursulactl.Env{}, "restore", "--location", "s3://backups/drill", "--expect-proof", strings.Repeat("0", 64)).
		want(t, ursulactl.ExitProofMismatch, "nothing was written")
	interrupted := runCtlUntil(t, dmanifest, regexp.MustCompile(`import.*groups [2-7]/8`), "--actor", "e2e", "--reason", "drill",
		"restore", "--yes", "--location", "s3://backups/drill", "--expect-proof", proof)
	if interrupted.code == 0 {
		t.Fatalf("the interrupted restore completed:\n%s", interrupted.stdout)
	}
	again := runCtl(t, dmanifest, ursulactl.Env{}, "--actor", "e2e", "--reason", "drill", "restore", "--yes", "--location", "s3://backups/drill",
		"--expect-proof", proof, "--json")
	again.want(t, 0, "")
	audited := false
	for _, n := range dst.Nodes {
		r := runCtlLog(t, dmanifest, ursulactl.Env{}, false, "audit", "--node", fmt.Sprint(n.ID))
		audited = audited || strings.Contains(r.stdout, "/__ursula/backup/group/") && strings.Contains(r.stdout, proof) && strings.Contains(r.stdout, `"actor":"e2e"`)
	}
	if !audited {
		t.Error("no node's audit trail records an import with the plan's proof and its actor")
	}
	var rep struct {
		Imported int `json:"imported"`
		Already  int `json:"already"`
	}
	if err := json.Unmarshal([]byte(again.stdout), &rep); err != nil {
		t.Fatalf("restore --json: %v\n%s", err, again.stdout)
	}
	if rep.Already < 2 || rep.Imported+rep.Already != groups {
		t.Errorf("the second restore imported %d groups and found %d already imported, want at least 2 already and %d in all", rep.Imported, rep.Already, groups)
	}
	dclient := dst.Client()

	// Every acknowledged byte up to the backup, under a new incarnation.
	for name, want := range st.want {
		checkRestored(ctx, t, dclient, name, want, st.incarnation[name])
	}
	got, _, err := dclient.ReadAll(ctx, "drill/live")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(during, got) || len(got) < len(before) {
		t.Errorf("drill/live: restored %d bytes; %d were acknowledged before the backup started, %d by its end, and the restored bytes must be a prefix of those", len(got), len(before), len(during))
	}
	checkJSONMessages(ctx, t, dclient, "drill/json", st.json["drill/json"])
	// The closed stream stays closed, the TTL stays, the producer's epoch
	// is closed with the seq the backup kept, and its dedup state holds.
	if resp := mustStatus(t, "HEAD drill/closed", 200)(dclient.Do(ctx, http.MethodHead, "drill/closed", nil, nil, nil)); resp.Header.Get("Stream-Closed") != "true" {
		t.Errorf("drill/closed is open after the restore")
	}
	mustStatus(t, "append to the closed stream", 409)(dclient.Append(ctx, "drill/closed", "text/plain", []byte("x"), nil))
	if resp := mustStatus(t, "HEAD drill/ttl-3600", 200)(dclient.Do(ctx, http.MethodHead, "drill/ttl-3600", nil, nil, nil)); resp.Header.Get("Stream-TTL") != "3600" {
		t.Errorf("drill/ttl-3600: Stream-TTL %q after the restore", resp.Header.Get("Stream-TTL"))
	}
	dup := *prod
	mustStatus(t, "a retry of the producer's last write", 204, 200)(dclient.Append(ctx, "drill/producer", "text/plain", []byte("p19;"), &dup))
	next := *prod
	next.Seq++
	resp := mustStatus(t, "a new write in the closed epoch", 403)(dclient.Append(ctx, "drill/producer", "text/plain", []byte("p20;"), &next))
	if o := resp.Header.Get("Producer-Outcome"); !strings.Contains(o, "epoch-closed") || !strings.Contains(o, "by=history") {
		t.Errorf("Producer-Outcome %q, want epoch-closed;by=history", o)
	}
	if s := resp.Header.Get("Producer-Seq"); s != "" && s != "19" {
		t.Errorf("Producer-Seq %q on the closed epoch, want the last seq the backup kept (19)", s)
	}
	claimed := Producer{ID: prod.ID, Epoch: prod.Epoch + 1}
	mustAppend(ctx, t, dclient, "drill/producer", "text/plain", []byte("new epoch;"), &claimed)
	// The snapshot and the retention floor.
	dub := urlsulaClient{base: dst.GatewayURL(), http: dclient.HTTP}
	if r := mustStatus(t, "read the snapshot", 200)(dub.do(ctx, http.MethodGet, "/drillb/snap/snapshot/"+snapAt, nil, nil)); string(r.Body) != "SNAPSHOT-AT-20" {
		t.Errorf("snapshot body %q after the restore", r.Body)
	}
	mustStatus(t, "read below the retention floor", 410)(dub.do(ctx, http.MethodGet, "/drillb/snap?offset="+fmt.Sprintf("%016d_%016d", 0, 0), nil, nil))
	if r := mustStatus(t, "read from the retention floor", 200)(dub.do(ctx, http.MethodGet, "/drillb/snap?offset="+retainAt, nil, nil)); !bytes.HasPrefix(snapBody[50:], r.Body) || len(r.Body) == 0 {
		t.Errorf("read from the retention floor: %q", r.Body)
	}
	// Every stream takes appends again.
	for name := range st.want {
		if name == "drill/closed" {
			continue
		}
		mustAppend(ctx, t, dclient, name, "text/plain", []byte("after the restore;"), nil)
		got, _, err := dclient.ReadAll(ctx, name)
		if err != nil || !bytes.HasSuffix(got, []byte("after the restore;")) || !bytes.HasPrefix(got, st.want[name]) {
			t.Errorf("%s after an append on the restored cluster: %v", name, err)
		}
	}

	// A corrupted byte in a group object fails verify and restore, naming
	// the object.
	backups := openS3(ctx, t, s3, "backups", "drill")
	obj := fmt.Sprintf("backups/%s/groups/%05d.bin", m1.ID, 3)
	flipByte(ctx, t, backups, obj)
	bad := runCtl(t, manifest, ursulactl.Env{}, "backup-verify", "--location", "s3://backups/drill", "--depth", "objects")
	bad.want(t, ursulactl.ExitError, obj)
	runCtl(t, dmanifest, ursulactl.Env{}, "restore", "--yes", "--location", "s3://backups/drill").want(t, ursulactl.ExitError, obj)
	flipByte(ctx, t, backups, obj) // back as it was
	// So does one in a cold object the backup copied.
	cobj := m1.ColdObjects[len(m1.ColdObjects)/2].Object
	flipByte(ctx, t, backups, cobj)
	runCtl(t, manifest, ursulactl.Env{}, "backup-verify", "--location", "s3://backups/drill", "--depth", "objects").want(t, ursulactl.ExitError, cobj)
	flipByte(ctx, t, backups, cobj)

	// An incremental backup copies only the objects the location lacks.
	for j := range 30 {
		mustAppend(ctx, t, dclient, "drill/plain-1", "text/plain", append(fmt.Appendf(nil, "more-%d;", j), bytes.Repeat([]byte{'m'}, 700)...), nil)
	}
	waitColdObjects(ctx, t, s3, "dst", 90)
	second := runCtl(t, dmanifest, ursulactl.Env{}, "backup-create", "--location", "s3://backups/drill", "--json")
	second.want(t, 0, "")
	var m2 struct {
		ID          string `json:"id"`
		ColdObjects []struct {
			Key string `json:"key"`
		} `json:"cold_objects"`
		Totals struct {
			CopiedObjects int `json:"copied_objects"`
			ReusedObjects int `json:"reused_objects"`
		} `json:"totals"`
	}
	if err := json.Unmarshal([]byte(second.stdout), &m2); err != nil {
		t.Fatalf("backup-create --json: %v", err)
	}
	first := map[string]bool{}
	for _, o := range m1.ColdObjects {
		first[o.Key] = true
	}
	newObjects := 0
	for _, o := range m2.ColdObjects {
		if !first[o.Key] {
			newObjects++
		}
	}
	if newObjects == 0 || m2.Totals.CopiedObjects != newObjects || m2.Totals.ReusedObjects != len(m2.ColdObjects)-newObjects {
		t.Errorf("the second backup copied %d objects and reused %d; %d of its %d objects are new", m2.Totals.CopiedObjects, m2.Totals.ReusedObjects, newObjects, len(m2.ColdObjects))
	}
	runCtl(t, dmanifest, ursulactl.Env{}, "backup-verify", "--location", "s3://backups/drill", "--depth", "deep").want(t, 0, "")
	// Another backup into a cluster that holds data is refused before
	// anything is imported.
	runCtl(t, dmanifest, ursulactl.Env{}, "restore", "--yes", "--location", "s3://backups/drill", "--backup", m2.ID).want(t, ursulactl.ExitAborted, "nothing was imported")
}

// checkRestored reads a restored stream whole and checks its bytes and
// offsets, its new incarnation, and the history headers naming the old
// one.
func checkRestored(ctx context.Context, t *testing.T, c *Client, name string, want []byte, oldInc string) {
	t.Helper()
	got, tail, err := c.ReadAll(ctx, name)
	if err != nil {
		t.Errorf("read %s after the restore: %v", name, err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes after the restore, want %d (first difference at %d)", name, len(got), len(want), firstDiff(got, want))
	}
	if off, err := ParseOffset(tail); err != nil || off.Pos != uint64(len(want)) {
		t.Errorf("%s: tail offset %q, want byte %d", name, tail, len(want))
	}
	resp, err := c.Do(ctx, http.MethodHead, name, nil, nil, nil)
	if err != nil || resp.Status != 200 {
		t.Errorf("HEAD %s: %v %v", name, resp, err)
		return
	}
	inc := resp.Header.Get("Stream-Incarnation")
	if inc == "" || inc == oldInc {
		t.Errorf("%s: Stream-Incarnation %q after the restore, the backup's was %q", name, inc, oldInc)
	}
	if prev := resp.Header.Get("Stream-Previous-Incarnation"); prev != oldInc {
		t.Errorf("%s: Stream-Previous-Incarnation %q, want %q", name, prev, oldInc)
	}
	if inh, err := ParseOffset(resp.Header.Get("Stream-Inherited-Offset")); err != nil || inh.Pos != uint64(len(want)) {
		t.Errorf("%s: Stream-Inherited-Offset %q, want byte %d", name, resp.Header.Get("Stream-Inherited-Offset"), len(want))
	}
	// A client holding the old token is told about the new one.
	stale := mustStatus(t, "read "+name+" with the old token", 412)(c.Do(ctx, http.MethodGet, name, url.Values{"offset": {"-1"}}, http.Header{"Stream-Incarnation": {oldInc}}, nil))
	if stale.Header.Get("Stream-Incarnation") != inc {
		t.Errorf("%s: 412 names incarnation %q, want %q", name, stale.Header.Get("Stream-Incarnation"), inc)
	}
}

func checkJSONMessages(ctx context.Context, t *testing.T, c *Client, name string, want []string) {
	t.Helper()
	var got []json.RawMessage
	offset := "-1"
	for {
		resp := mustStatus(t, "read "+name, 200)(c.Read(ctx, name, offset))
		var page []json.RawMessage
		if err := json.Unmarshal(resp.Body, &page); err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		got = append(got, page...)
		if resp.UpToDate() {
			break
		}
		offset = resp.NextOffset()
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages after the restore, want %d", name, len(got), len(want))
	}
	for i := range want {
		var a, b any
		_ = json.Unmarshal(got[i], &a)
		_ = json.Unmarshal([]byte(want[i]), &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s: message %d is %s, want %s", name, i, got[i], want[i])
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// mustStatus checks a response's status against the accepted ones and
// returns it.
func mustStatus(t *testing.T, what string, codes ...int) func(*Response, error) *Response {
	return func(r *Response, err error) *Response {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !slices.Contains(codes, r.Status) {
			t.Fatalf("%s: %v, want %v", what, r, codes)
		}
		return r
	}
}

func mustAppend(ctx context.Context, t *testing.T, c *Client, stream, ct string, body []byte, p *Producer) {
	t.Helper()
	mustStatus(t, "append to "+stream, 200, 204)(c.Append(ctx, stream, ct, body, p))
}

// urlsulaClient sends requests to Ursula's /{bucket}/{stream} family.
type urlsulaClient struct {
	base string
	http *http.Client
}

func (u urlsulaClient) do(ctx context.Context, method, path string, h http.Header, body []byte) (*Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.base+path, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := u.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

// liveWriter appends to one stream until stopped, keeping what was
// acknowledged in order.
type liveWriter struct {
	mu    sync.Mutex
	bytes []byte
	n     int
	stopc chan struct{}
	done  chan error
}

func startLiveWriter(ctx context.Context, t *testing.T, c *Client, stream string) *liveWriter {
	t.Helper()
	mustStatus(t, "create "+stream, 201)(c.Create(ctx, stream, "text/plain", nil))
	w := &liveWriter{stopc: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		for i := 0; ; i++ {
			select {
			case <-w.stopc:
				w.done <- nil
				return
			default:
			}
			body := fmt.Appendf(nil, "live-%05d;", i)
			resp, err := c.Append(ctx, stream, "text/plain", body, nil)
			if err != nil || resp.Status != 200 && resp.Status != 204 {
				w.done <- fmt.Errorf("live append %d: %v %v", i, resp, err)
				return
			}
			w.mu.Lock()
			w.bytes = append(w.bytes, body...)
			w.n++
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *liveWriter) acked() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bytes)
}

func (w *liveWriter) waitAcked(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	for {
		w.mu.Lock()
		got := w.n
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case err := <-w.done:
			t.Fatalf("the live writer stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("the live writer acknowledged %d appends, want %d", got, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (w *liveWriter) stop(t *testing.T) []byte {
	t.Helper()
	close(w.stopc)
	if err := <-w.done; err != nil {
		t.Fatal(err)
	}
	return w.acked()
}

// runCtlUntil runs ursulactl and cancels it once its output matches re,
// as an operator's Ctrl-C or a lost session would.
func runCtlUntil(t *testing.T, manifest string, re *regexp.Regexp, args ...string) ctlResult {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Results go to stdout, progress to stderr: either may match.
	out := &matchWriter{re: re, hit: cancel}
	errb := &matchWriter{re: re, hit: cancel}
	full := append([]string{"--manifest", manifest, "--timeout", ctlWait.String()}, args...)
	code := ursulactl.Run(ctx, full, ursulactl.Env{Stdout: out, Stderr: errb})
	t.Logf("ursulactl %s (cancelled at %q): exit %d\n%s%s", strings.Join(args, " "), re, code, out.String(), errb.String())
	return ctlResult{code: code, stdout: out.String(), stderr: errb.String()}
}

type matchWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	re  *regexp.Regexp
	hit func()
}

func (w *matchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.re.Match(w.buf.Bytes()) {
		w.hit()
	}
	return len(p), nil
}

func (w *matchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func openS3(ctx context.Context, t *testing.T, s3 *objstoretest.S3Server, bucket, prefix string) objstore.Store {
	t.Helper()
	st, err := objstore.Open(ctx, objstore.Config{Backend: objstore.BackendS3, S3: objstore.S3Config{
		Bucket: bucket, Prefix: prefix, Endpoint: s3.Endpoint, Region: "us-east-1", PathStyle: true,
		AccessKey: s3.AccessKey, SecretKey: s3.SecretKey,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func deleteAll(ctx context.Context, t *testing.T, st objstore.Store, prefix string) {
	t.Helper()
	var keys []string
	if err := st.List(ctx, prefix, func(in objstore.Info) error { keys = append(keys, in.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, keys...); err != nil {
		t.Fatal(err)
	}
}

// waitColdObjects waits until the cold store under prefix of the cold
// bucket holds at least n objects.
func waitColdObjects(ctx context.Context, t *testing.T, s3 *objstoretest.S3Server, prefix string, n int) {
	t.Helper()
	st := openS3(ctx, t, s3, "cold", prefix)
	for {
		count := 0
		_ = st.List(ctx, "", func(objstore.Info) error { count++; return nil })
		if count >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the cold store holds %d objects under %s, want %d", count, prefix, n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func flipByte(ctx context.Context, t *testing.T, st objstore.Store, key string) {
	t.Helper()
	b, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x5a
	if err := st.Put(ctx, key, b); err != nil {
		t.Fatal(err)
	}
}

// TestBackupServiceBacksUpOnScheduleAndPrunes runs ursula-backup beside a
// 3-node cluster, as a deployment does: it proves the backup role with
// its certificate, backs the cluster up every second into an S3 location
// (the SDK's credential chain and AWS_ENDPOINT_URL, from its environment)
// while a writer appends, keeps the last two backups, reports readiness
// and metrics, and stops cleanly on SIGTERM, leaving no lock behind.
func TestBackupServiceBacksUpOnScheduleAndPrunes(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true, ColdTuning: TinyFlushTOML, RuntimeTuning: TinyFlushRuntimeTOML})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := c.Client()
	for i := range 4 {
		name := fmt.Sprintf("svc/s%d", i)
		mustStatus(t, "create "+name, 201)(client.Create(ctx, name, "text/plain", nil))
		for j := range 30 {
			mustAppend(ctx, t, client, name, "text/plain", append(fmt.Appendf(nil, "%d;", j), bytes.Repeat([]byte{'b'}, 300)...), nil)
		}
	}
	live := startLiveWriter(ctx, t, client, "svc/live")
	defer live.stop(t)

	addrs, err := freeport.Addrs(1)
	if err != nil {
		t.Fatal(err)
	}
	s3 := objstoretest.NewS3Server(t)
	s3.CreateBucket(t, "svc-backups")
	s3env := []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey, "AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=" + s3.Endpoint}
	for _, kv := range s3env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v) // for ursulactl, in process
	}
	loc := "s3://svc-backups/cluster"
	var nodes []string
	for _, n := range c.Nodes {
		nodes = append(nodes, strconv.Quote(n.ClientAddr()))
	}
	cfg := filepath.Join(c.Dir, "backup.toml")
	toml := fmt.Sprintf("[upstream]\nnodes = [%s]\n%s\n[backup]\nlocation = %q\ninterval = \"1s\"\nkeep_last = 2\nlisten = %q\n",
		strings.Join(nodes, ", "), c.ClientPlaneTOML(pki.RoleBackup), loc, addrs[0])
	if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := Binary("ursula-backup")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(c.Dir, "backup.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Env = append(os.Environ(), s3env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("ursula-backup log:\n%s", out)
		}
	}()

	get := func(path string) (int, map[string]any) {
		resp, err := http.Get("http://" + addrs[0] + path)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		var doc map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&doc)
		return resp.StatusCode, doc
	}
	if !await.Until(await.DefaultTimeout, func() bool { code, _ := get("/__ursula/ready"); return code == 200 }) {
		code, doc := get("/__ursula/ready")
		t.Fatalf("ursula-backup not ready: %d %v", code, doc)
	}
	var metrics map[string]any
	if !await.Until(2*time.Minute, func() bool {
		_, metrics = get("/__ursula/metrics")
		backups, _ := metrics["backups"].(float64)
		pruned, _ := metrics["pruned_backups"].(float64)
		return backups >= 4 && pruned >= 1
	}) {
		t.Fatalf("metrics: %v", metrics)
	}
	lintScrape(t, "ursula-backup", "http://"+addrs[0]+"/__ursula/prometheus")
	if f, _ := metrics["failures"].(float64); f != 0 {
		t.Errorf("%v backups failed: %v", f, metrics["last_error"])
	}
	if s, _ := metrics["last_success_unix_seconds"].(float64); s < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last_success_unix_seconds %v", metrics["last_success_unix_seconds"])
	}
	for _, k := range []string{"last_duration_seconds", "last_bytes", "last_objects"} {
		if v, ok := metrics[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v after a backup", k, metrics[k])
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("ursula-backup after SIGTERM: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("ursula-backup did not stop after SIGTERM")
	}
	if _, err := openS3(ctx, t, s3, "svc-backups", "cluster").Head(ctx, "lock"); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("the location's lock is still there after a clean stop: %v", err)
	}
	manifest := writeCtlManifest(t, c)
	list := runCtl(t, manifest, ursulactl.Env{}, "backup-list", "--location", loc, "--json")
	list.want(t, 0, "")
	var ms []json.RawMessage
	if err := json.Unmarshal([]byte(list.stdout), &ms); err != nil || len(ms) < 2 || len(ms) > 3 {
		t.Errorf("%d backups in the location after keep_last = 2 (one more may have completed after the last prune): %v", len(ms), err)
	}
	runCtl(t, manifest, ursulactl.Env{}, "backup-verify", "--location", loc, "--depth", "deep").want(t, 0, "")
}
