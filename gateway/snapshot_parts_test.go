package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
)

// multiPartSnapshot answers GetSnapshot with a three-part snapshot at 0_4
// ("AAA", "BB", "C"); digest is what parts after the first carry.
func multiPartSnapshot(t testing.TB, digest string) func(*streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
	parts := []string{"AAA", "BB", "C"}
	return func(in *streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
		n := max(in.GetPart(), 1)
		d := "d1"
		if n > 1 {
			d = digest
			if in.GetOffset() != "0_4" {
				t.Errorf("part %d read at %q, want the first answer's offset", n, in.GetOffset())
			}
		}
		return &streamv1.GetSnapshotResponse{Offset: "0_4", Digest: d, ContentType: "application/x-state", Body: []byte(parts[n-1]),
			NextOffset: "0_4", UpToDate: true, Parts: 3, Size: 6}, nil
	}
}

func TestSnapshotPartRoutes(t *testing.T) {
	partOK := func(in *streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
		return &streamv1.PutSnapshotPartResponse{Digest: "p-" + string(in.GetBody())}, nil
	}
	partErr := func(c errcode.Code) func(*streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
		return func(*streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
			return nil, domainErr(c)
		}
	}
	commitErr := func(c errcode.Code) func(*streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
		return func(*streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
			return nil, domainErr(c)
		}
	}
	const commitJSON = `{"parts":[{"part":1,"digest":"a1"},{"part":2,"digest":"b2"}]}`
	tests := []struct {
		name     string
		method   string
		path     string
		body     string
		hdr      map[string]string
		fake     fakeClient
		status   int
		want     map[string]string
		wantBody string
	}{
		{name: "stage a part", method: "PUT", path: "/bk/s/snapshot/0_4/parts/2", body: "P2",
			fake: fakeClient{putPart: func(in *streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
				if in.GetRef().GetBucket() != "bk" || in.GetRef().GetStream() != "s" || in.GetOffset() != "0_4" || in.GetPart() != 2 || string(in.GetBody()) != "P2" {
					return nil, domainErr(errcode.Internal)
				}
				return partOK(in)
			}},
			status: 204, want: map[string]string{"Stream-Snapshot-Part-Digest": "p-P2"}},
		{name: "part zero", method: "PUT", path: "/bk/s/snapshot/0_4/parts/0", body: "P", status: 400},
		{name: "part leading zero", method: "PUT", path: "/bk/s/snapshot/0_4/parts/01", body: "P", status: 400},
		{name: "part above the bound", method: "PUT", path: "/bk/s/snapshot/0_4/parts/10001", body: "P", status: 400},
		{name: "part not a number", method: "PUT", path: "/bk/s/snapshot/0_4/parts/x", body: "P", status: 400},
		{name: "empty part", method: "PUT", path: "/bk/s/snapshot/0_4/parts/1", status: 400},
		{name: "part too large", method: "PUT", path: "/bk/s/snapshot/0_4/parts/1", body: "P", hdr: map[string]string{"X-Test-Content-Length": "1"}, status: 413},
		{name: "part bad offset", method: "PUT", path: "/bk/s/snapshot/now/parts/1", body: "P", status: 400},
		{name: "part without a cold store", method: "PUT", path: "/bk/s/snapshot/0_4/parts/1", body: "P", fake: fakeClient{putPart: partErr(errcode.NoColdStore)}, status: 501},
		{name: "part below retention", method: "PUT", path: "/bk/s/snapshot/0_0/parts/1", body: "P", fake: fakeClient{putPart: partErr(errcode.OffsetTrimmed)}, status: 410},
		{name: "part beyond the tail", method: "PUT", path: "/bk/s/snapshot/0_99/parts/1", body: "P", fake: fakeClient{putPart: partErr(errcode.SnapshotConflict)}, status: 409},
		{name: "get a part", method: "GET", path: "/bk/s/snapshot/0_4/parts/1", status: 405},
		{name: "unknown subresource", method: "GET", path: "/bk/s/snapshot/0_4/other", status: 404},
		{name: "parts nested", method: "PUT", path: "/bk/s/snapshot/0_4/parts/1/x", body: "P", status: 404},
		{name: "commit", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON,
			hdr: map[string]string{"Content-Type": "application/x-state", "Stream-Snapshot-Match": "d0"},
			fake: fakeClient{commit: func(in *streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
				ps := in.GetParts()
				if in.GetOffset() != "0_4" || in.GetContentType() != "application/x-state" || in.GetMatch() != "d0" || len(ps) != 2 ||
					ps[0].GetPart() != 1 || ps[0].GetDigest() != "a1" || ps[1].GetPart() != 2 || ps[1].GetDigest() != "b2" {
					return nil, domainErr(errcode.Internal)
				}
				return &streamv1.CommitSnapshotResponse{Offset: "0_4", Digest: "d2", Created: true}, nil
			}},
			status: 204, want: map[string]string{"Stream-Snapshot-Offset": "0_4", "Stream-Snapshot-Digest": "d2"}},
		{name: "commit not JSON", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: "parts", status: 400},
		{name: "commit without parts", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: `{"parts":[]}`, status: 400},
		{name: "commit digest mismatch", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, fake: fakeClient{commit: commitErr(errcode.SnapshotConflict)}, status: 409},
		{name: "commit missing part", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, fake: fakeClient{commit: commitErr(errcode.InvalidArgument)}, status: 400},
		{name: "commit too large", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, fake: fakeClient{commit: commitErr(errcode.PayloadTooLarge)}, status: 413},
		{name: "commit below retention", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, fake: fakeClient{commit: commitErr(errcode.OffsetTrimmed)}, status: 410},
		{name: "commit without a cold store", method: "POST", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, fake: fakeClient{commit: commitErr(errcode.NoColdStore)}, status: 501},
		{name: "put on commit", method: "PUT", path: "/bk/s/snapshot/0_4/commit", body: commitJSON, status: 405},
		{name: "read a multi-part snapshot", method: "GET", path: "/bk/s/snapshot/0_4", fake: fakeClient{getSnapshot: multiPartSnapshot(t, "d1")},
			status: 200, want: map[string]string{"Content-Length": "6", "Stream-Snapshot-Digest": "d1", "Content-Type": "application/x-state"},
			wantBody: "AAABBC"},
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
			if req.Header.Get("X-Test-Content-Length") != "" {
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

// TestSnapshotPartsChangedMidRead: a snapshot replaced between part reads
// aborts the response (the bytes sent belong to the first snapshot).
func TestSnapshotPartsChangedMidRead(t *testing.T) {
	for _, path := range []string{"/bk/s/snapshot/0_4", "/bk/s/bootstrap"} {
		t.Run(path, func(t *testing.T) {
			f := fakeClient{getSnapshot: multiPartSnapshot(t, "other")}
			g := newTestGateway(t, &f, nil)
			req := httptest.NewRequest("GET", "http://example.com"+path, nil)
			rec := httptest.NewRecorder()
			defer func() {
				if r := recover(); r != http.ErrAbortHandler {
					t.Fatalf("recovered %v, want http.ErrAbortHandler", r)
				}
				if strings.Contains(rec.Body.String(), "BB") {
					t.Fatalf("body %q holds a part of the other snapshot", rec.Body)
				}
			}()
			g.Handler().ServeHTTP(rec, req)
		})
	}
}

// TestBootstrapMultiPartSnapshot: the snapshot part of a bootstrap holds
// every part of a multi-part snapshot, in order.
func TestBootstrapMultiPartSnapshot(t *testing.T) {
	f := fakeClient{
		getSnapshot: multiPartSnapshot(t, "d1"),
		read: func(context.Context, *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
			t.Error("unexpected read: the snapshot is at the tail")
			return nil, io.ErrUnexpectedEOF
		},
	}
	g := newTestGateway(t, &f, nil)
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://example.com/bk/s/bootstrap", nil))
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if !strings.Contains(rec.Body.String(), "\r\n\r\nAAABBC\r\n--") {
		t.Fatalf("body %q lacks the whole snapshot part", rec.Body)
	}
}
