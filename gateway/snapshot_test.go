package gateway

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

var updateBootstrap = flag.Bool("update-bootstrap", false, "rewrite gateway/testdata/bootstrap_*.golden")

func domainErr(c errcode.Code) error { return grpcerr.ToStatus(errcode.New(c, "test %s", c)) }

// headWithSnapshot answers Head with a stream whose latest snapshot is at
// offset ("" for none).
func headWithSnapshot(offset string) func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
	return func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
		in := &streamv1.StreamInfo{ContentType: "text/plain", NextOffset: "0_15"}
		if offset != "" {
			in.SnapshotOffset, in.SnapshotDigest = offset, "d1"
		}
		return &streamv1.HeadResponse{Info: in}, nil
	}
}

func TestSnapshotRoutes(t *testing.T) {
	putOK := func(in *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
		return &streamv1.PutSnapshotResponse{Offset: in.GetOffset(), Digest: "d-" + string(in.GetBody()), Created: true}, nil
	}
	putErr := func(c errcode.Code) func(*streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
		return func(*streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) { return nil, domainErr(c) }
	}
	getOK := func(in *streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
		if in.GetOffset() != "0_4" {
			return nil, domainErr(errcode.SnapshotNotFound)
		}
		return &streamv1.GetSnapshotResponse{Offset: "0_4", Digest: "d1", ContentType: "application/x-state", Body: []byte("STATE"),
			NextOffset: "0_15", Closed: true}, nil
	}
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		hdr    map[string]string
		fake   fakeClient
		status int
		want   map[string]string // response headers ("" = absent)
		// wantBody, when set, is the exact response body.
		wantBody string
	}{
		{name: "publish", method: "PUT", path: "/bk/s/snapshot/0_4", body: "S1", hdr: map[string]string{"Content-Type": "application/x-state", "Stream-Snapshot-Match": "d0"},
			fake: fakeClient{putSnapshot: func(in *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
				if in.GetRef().GetBucket() != "bk" || in.GetRef().GetStream() != "s" || in.GetOffset() != "0_4" ||
					in.GetContentType() != "application/x-state" || string(in.GetBody()) != "S1" || in.GetMatch() != "d0" {
					return nil, domainErr(errcode.Internal)
				}
				return putOK(in)
			}},
			status: 204, want: map[string]string{"Stream-Snapshot-Offset": "0_4", "Stream-Snapshot-Digest": "d-S1"}},
		{name: "publish again", method: "PUT", path: "/bk/s/snapshot/0_4", body: "S1",
			fake: fakeClient{putSnapshot: func(in *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
				return &streamv1.PutSnapshotResponse{Offset: in.GetOffset(), Digest: "d-S1"}, nil
			}},
			status: 204, want: map[string]string{"Stream-Snapshot-Digest": "d-S1"}},
		{name: "publish conflict", method: "PUT", path: "/bk/s/snapshot/0_4", body: "S2", fake: fakeClient{putSnapshot: putErr(errcode.SnapshotConflict)}, status: 409},
		{name: "publish below retention", method: "PUT", path: "/bk/s/snapshot/0_0", body: "S", fake: fakeClient{putSnapshot: putErr(errcode.OffsetTrimmed)}, status: 410},
		{name: "publish mid-record", method: "PUT", path: "/bk/s/snapshot/0_3", body: "S", fake: fakeClient{putSnapshot: putErr(errcode.InvalidArgument)}, status: 400},
		{name: "publish no stream", method: "PUT", path: "/bk/s/snapshot/0_3", body: "S", fake: fakeClient{putSnapshot: putErr(errcode.StreamNotFound)}, status: 404},
		{name: "publish -1", method: "PUT", path: "/bk/s/snapshot/-1", body: "S", status: 400},
		{name: "publish bad offset", method: "PUT", path: "/bk/s/snapshot/abc", body: "S", status: 400},
		{name: "publish too large", method: "PUT", path: "/bk/s/snapshot/0_4", body: "S", hdr: map[string]string{"X-Test-Content-Length": "33554433"}, status: 413},
		{name: "post on snapshot", method: "POST", path: "/bk/s/snapshot/0_4", status: 405},
		{name: "latest redirects", method: "GET", path: "/bk/s/snapshot", fake: fakeClient{head: headWithSnapshot("0_4")},
			status: 307, want: map[string]string{"Location": "/bk/s/snapshot/0_4"}},
		{name: "latest none", method: "GET", path: "/bk/s/snapshot", fake: fakeClient{head: headWithSnapshot("")}, status: 404},
		{name: "latest no stream", method: "GET", path: "/bk/s/snapshot", fake: fakeClient{head: func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
			return nil, domainErr(errcode.StreamNotFound)
		}}, status: 404},
		{name: "put on latest", method: "PUT", path: "/bk/s/snapshot", status: 405},
		{name: "read", method: "GET", path: "/bk/s/snapshot/0_4", fake: fakeClient{getSnapshot: getOK}, status: 200,
			want: map[string]string{"Content-Type": "application/x-state", "Stream-Snapshot-Offset": "0_4", "Stream-Snapshot-Digest": "d1",
				"Stream-Next-Offset": "0_15", "Stream-Up-To-Date": "", "Stream-Closed": "true"},
			wantBody: "STATE"},
		{name: "read other offset", method: "GET", path: "/bk/s/snapshot/0_8", fake: fakeClient{getSnapshot: getOK}, status: 404},
		{name: "delete latest", method: "DELETE", path: "/bk/s/snapshot/0_4", fake: fakeClient{head: headWithSnapshot("0_4")}, status: 409},
		{name: "delete other", method: "DELETE", path: "/bk/s/snapshot/0_8", fake: fakeClient{head: headWithSnapshot("0_4")}, status: 404},
		{name: "delete none", method: "DELETE", path: "/bk/s/snapshot/0_8", fake: fakeClient{head: headWithSnapshot("")}, status: 404},
		{name: "head shows the snapshot", method: "HEAD", path: "/bk/s", fake: fakeClient{head: headWithSnapshot("0_4")}, status: 200,
			want: map[string]string{"Stream-Snapshot-Offset": "0_4", "Stream-Snapshot-Digest": "d1"}},
		{name: "head without snapshot", method: "HEAD", path: "/bk/s", fake: fakeClient{head: headWithSnapshot("")}, status: 200,
			want: map[string]string{"Stream-Snapshot-Offset": "", "Stream-Snapshot-Digest": ""}},
		{name: "bootstrap live", method: "GET", path: "/bk/s/bootstrap?live=sse", status: 400},
		{name: "bootstrap post", method: "POST", path: "/bk/s/bootstrap", status: 405},
		{name: "bootstrap no stream", method: "GET", path: "/bk/s/bootstrap", fake: fakeClient{
			getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
				return nil, domainErr(errcode.StreamNotFound)
			},
		}, status: 404},
		{name: "bootstrap below retention", method: "GET", path: "/bk/s/bootstrap", fake: fakeClient{
			getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
				return getOK(&streamv1.GetSnapshotRequest{Offset: "0_4"})
			},
			read: func(context.Context, *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
				return nil, domainErr(errcode.OffsetTrimmed)
			},
		}, status: 410},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake
			g := newTestGateway(t, &f, nil)
			var rd io.Reader
			if tt.body != "" {
				rd = strings.NewReader(tt.body)
			}
			req := httptest.NewRequest(tt.method, "http://example.com"+tt.path, rd)
			for k, v := range tt.hdr {
				req.Header.Set(k, v)
			}
			if v := req.Header.Get("X-Test-Content-Length"); v != "" {
				req.ContentLength = 32<<20 + 1 // declared, never sent: refused before the body is read
			}
			rec := httptest.NewRecorder()
			g.Handler().ServeHTTP(rec, req)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			for k, v := range tt.want {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if tt.wantBody != "" && rec.Body.String() != tt.wantBody {
				t.Errorf("body %q, want %q", rec.Body, tt.wantBody)
			}
		})
	}
}

// chunkReader serves reads of a byte stream from data in chunks of at most
// chunk bytes (stored form; positions are byte indexes).
func chunkReader(data, ct string, chunk int) func(context.Context, *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
	return func(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
		from := 0
		if in.GetOffset() != "-1" {
			from = int(offsetPos(in.GetOffset()))
		}
		end := min(from+chunk, len(data))
		return &streamv1.ReadResponse{Data: []byte(data[from:end]), StartOffset: offsetToken(from), NextOffset: offsetToken(end),
			UpToDate: end == len(data), ContentType: ct}, nil
	}
}

func offsetToken(pos int) string { return fmt.Sprintf("%016d_%016d", 0, pos) }

func TestBootstrap(t *testing.T) {
	old := newBoundary
	newBoundary = func() string { return "ursula-bootstrap-test" }
	t.Cleanup(func() { newBoundary = old })
	tests := []struct {
		name    string
		golden  string
		fake    fakeClient
		headers map[string]string
		parts   int
	}{
		{
			name: "snapshot and updates", golden: "bootstrap_snapshot.golden",
			fake: fakeClient{
				getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
					return &streamv1.GetSnapshotResponse{Offset: offsetToken(4), Digest: "d1", ContentType: "application/x-state",
						Body: []byte("STATE@4"), NextOffset: offsetToken(16)}, nil
				},
				// The stream grew to 20 bytes since the snapshot read: the
				// body stops at the 16 announced.
				read: chunkReader("aaaabbbbccccddddeeee", "text/plain", 5),
			},
			headers: map[string]string{"Stream-Snapshot-Offset": offsetToken(4), "Stream-Next-Offset": offsetToken(16), "Stream-Up-To-Date": "true", "Stream-Closed": ""},
			parts:   4,
		},
		{
			name: "no snapshot, json", golden: "bootstrap_json.golden",
			fake: fakeClient{
				getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
					return nil, domainErr(errcode.SnapshotNotFound)
				},
				head: func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
					return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: "application/json", NextOffset: offsetToken(12), Closed: true}}, nil
				},
				read: chunkReader("{\"a\":1}\n[2]\n", "application/json", 64),
			},
			headers: map[string]string{"Stream-Snapshot-Offset": "-1", "Stream-Next-Offset": offsetToken(12), "Stream-Closed": "true"},
			parts:   2,
		},
		{
			name: "snapshot at the tail", golden: "bootstrap_tail.golden",
			fake: fakeClient{
				getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
					return &streamv1.GetSnapshotResponse{Offset: offsetToken(8), Digest: "d", ContentType: "text/plain",
						Body: []byte("all"), NextOffset: offsetToken(8), UpToDate: true}, nil
				},
			},
			headers: map[string]string{"Stream-Snapshot-Offset": offsetToken(8), "Stream-Next-Offset": offsetToken(8)},
			parts:   1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake
			g := newTestGateway(t, &f, nil)
			rec := do(t, g, "GET", "http://example.com/bk/s/bootstrap", "", nil)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			for k, v := range tt.headers {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			mt, params, err := mime.ParseMediaType(rec.Header().Get("Content-Type"))
			if err != nil || mt != "multipart/mixed" || params["boundary"] != "ursula-bootstrap-test" {
				t.Fatalf("Content-Type %q: %v", rec.Header().Get("Content-Type"), err)
			}
			mr := multipart.NewReader(bytes.NewReader(rec.Body.Bytes()), params["boundary"])
			n := 0
			for {
				_, err := mr.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("part %d: %v", n, err)
				}
				n++
			}
			if n != tt.parts {
				t.Fatalf("%d parts, want %d", n, tt.parts)
			}
			path := filepath.Join("testdata", tt.golden)
			if *updateBootstrap {
				if err := os.WriteFile(path, rec.Body.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-bootstrap to create it)", err)
			}
			if !bytes.Equal(rec.Body.Bytes(), want) {
				t.Fatalf("body differs from %s:\n%s\nwant:\n%s", path, rec.Body, want)
			}
		})
	}
}

func TestBootstrapCutShortOnReadError(t *testing.T) {
	calls := 0
	f := &fakeClient{
		getSnapshot: func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
			return &streamv1.GetSnapshotResponse{Offset: offsetToken(0), ContentType: "text/plain", Body: []byte("S"), NextOffset: offsetToken(10)}, nil
		},
		read: func(ctx context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
			calls++
			if calls > 1 {
				return nil, domainErr(errcode.ColdStoreFailed)
			}
			return chunkReader("0123456789", "text/plain", 4)(ctx, in)
		},
	}
	g := newTestGateway(t, f, nil)
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", p)
			}
		}()
		g.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://example.com/bk/s/bootstrap", nil))
	}()
	if rec.Code != 200 || strings.HasSuffix(rec.Body.String(), "--\r\n") {
		t.Fatalf("status %d, body %q: want a 200 cut short (no closing boundary)", rec.Code, rec.Body)
	}
}

// TestRecordForms covers PUT …/snapshot?record=N and
// PUT …/retention?record=N: the record reaches the node instead of an
// offset, the answers carry what the node resolved, and malformed or
// mixed forms are 400.
func TestRecordForms(t *testing.T) {
	var snapReq *streamv1.PutSnapshotRequest
	var retReq *streamv1.SetRetentionRequest
	f := &fakeClient{
		putSnapshot: func(in *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
			snapReq = in
			return &streamv1.PutSnapshotResponse{Offset: "0000000000000000_0000000000000040", Digest: "d", Created: true}, nil
		},
		setRetention: func(in *streamv1.SetRetentionRequest) (*streamv1.SetRetentionResponse, error) {
			retReq = in
			if in.GetRecord() == 99 {
				return nil, grpcerr.ToStatus(errcode.New(errcode.SnapshotConflict, "beyond the visible snapshot"))
			}
			return &streamv1.SetRetentionResponse{RetainedOffset: "0000000000000000_0000000000000040", RecordFirst: 6, Json: true}, nil
		},
	}
	g := newTestGateway(t, f, nil)
	tests := []struct {
		name, method, path string
		status             int
		check              func(t *testing.T, rec *httptest.ResponseRecorder)
	}{
		{"snapshot at a record", "PUT", "/bk/s/snapshot?record=6", 204, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if snapReq.Record == nil || snapReq.GetRecord() != 6 || snapReq.GetOffset() != "" || rec.Header().Get("Stream-Snapshot-Offset") != "0000000000000000_0000000000000040" {
				t.Fatalf("node saw %v; headers %v", snapReq, rec.Header())
			}
		}},
		{"retention at a record", "PUT", "/bk/s/retention?record=6", 204, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if retReq.Record == nil || retReq.GetRecord() != 6 || retReq.GetOffset() != "" {
				t.Fatalf("node saw %v", retReq)
			}
			if rec.Header().Get("Stream-Retained-Offset") != "0000000000000000_0000000000000040" || rec.Header().Get("Stream-Record-First") != "6" {
				t.Fatalf("headers %v", rec.Header())
			}
		}},
		{"retention beyond the snapshot", "PUT", "/bk/s/retention?record=99", 409, nil},
		{"snapshot record not a number", "PUT", "/bk/s/snapshot?record=x", 400, nil},
		{"snapshot record now", "PUT", "/bk/s/snapshot?record=now", 400, nil},
		{"retention record twice", "PUT", "/bk/s/retention?record=1&record=2", 400, nil},
		{"retention offset and record", "PUT", "/bk/s/retention/0000000000000000_0000000000000040?record=6", 400, nil},
		{"snapshot offset and record", "PUT", "/bk/s/snapshot/0000000000000000_0000000000000040?record=6", 400, nil},
		{"retention without offset or record", "PUT", "/bk/s/retention", 404, nil},
		{"snapshot record by POST", "POST", "/bk/s/snapshot?record=6", 405, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(t, g, tt.method, tt.path, "state", map[string]string{"Content-Type": "application/x"})
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			if tt.check != nil {
				tt.check(t, rec)
			}
		})
	}
}
