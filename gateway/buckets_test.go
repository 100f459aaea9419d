package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// bucketFakes are fakeClient's answers for attrs, buckets and listing.
type bucketFakes struct {
	getAttrs     func(*streamv1.GetAttrsRequest) (*streamv1.GetAttrsResponse, error)
	setAttrs     func(*streamv1.SetAttrsRequest) (*streamv1.SetAttrsResponse, error)
	getBucket    func(*streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error)
	deleteBucket func(*streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error)
	listStreams  func(*streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error)
}

func bucketErr(c errcode.Code) error { return grpcerr.ToStatus(errcode.New(c, "x")) }

func TestBucketRoutes(t *testing.T) {
	var gotList *streamv1.ListStreamsRequest
	okFakes := func() *fakeClient {
		return &fakeClient{
			createBucket: func(*streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error) {
				return &streamv1.CreateBucketResponse{Created: true}, nil
			},
			bucketFakes: bucketFakes{
				getBucket: func(in *streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error) {
					return &streamv1.GetBucketResponse{Bucket: in.GetBucket(), CreatedMs: 42, StreamCount: 3}, nil
				},
				deleteBucket: func(*streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) {
					return &streamv1.DeleteBucketResponse{}, nil
				},
				listStreams: func(in *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
					gotList = in
					return &streamv1.ListStreamsResponse{Streams: []*streamv1.StreamListing{
						{StreamId: "a", Status: "open", ContentType: "text/plain", TailOffset: "0000000000000000_0000000000000002", CreatedAtMs: 1, LastWriteAtMs: 2},
					}, NextCursor: "a", HasMore: true}, nil
				},
			},
		}
	}
	failWith := func(c errcode.Code) *fakeClient {
		return &fakeClient{bucketFakes: bucketFakes{
			getBucket:    func(*streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error) { return nil, bucketErr(c) },
			deleteBucket: func(*streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) { return nil, bucketErr(c) },
			listStreams:  func(*streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) { return nil, bucketErr(c) },
		}}
	}
	tests := []struct {
		name, method, target string
		f                    *fakeClient
		wantStatus           int
		wantBody             string // JSON, compared after decoding; "" skips
		wantList             *streamv1.ListStreamsRequest
	}{
		{"create", "PUT", "/tenant", okFakes(), 201, "", nil},
		{"create reserved snapshots", "PUT", "/snapshots", &fakeClient{}, 400, "", nil},
		{"create reserved __", "PUT", "/__x", &fakeClient{}, 400, "", nil},
		{"get", "GET", "/tenant", okFakes(), 200, `{"bucket_id":"tenant","created_at_ms":42,"stream_count":3}`, nil},
		{"get missing", "GET", "/tenant", failWith(errcode.BucketNotFound), 404, "", nil},
		{"delete", "DELETE", "/tenant", okFakes(), 204, "", nil},
		{"delete not empty", "DELETE", "/tenant", failWith(errcode.BucketExists), 409, "", nil},
		{"delete missing", "DELETE", "/tenant", failWith(errcode.BucketNotFound), 404, "", nil},
		{"bucket post", "POST", "/tenant", &fakeClient{}, 405, "", nil},
		{"list", "GET", "/tenant/streams?prefix=a&after=0&limit=10", okFakes(), 200,
			`{"streams":[{"stream_id":"a","status":"open","content_type":"text/plain","tail_offset":"0000000000000000_0000000000000002","created_at_ms":1,"last_write_at_ms":2}],"next_cursor":"a","has_more":true}`,
			&streamv1.ListStreamsRequest{Bucket: "tenant", Prefix: "a", After: "0", Limit: 10}},
		{"list defaults", "GET", "/tenant/streams", okFakes(), 200, "", &streamv1.ListStreamsRequest{Bucket: "tenant"}},
		{"list limit 1000", "GET", "/tenant/streams?limit=1000", okFakes(), 200, "", &streamv1.ListStreamsRequest{Bucket: "tenant", Limit: 1000}},
		{"list limit 0", "GET", "/tenant/streams?limit=0", &fakeClient{}, 400, "", nil},
		{"list limit 1001", "GET", "/tenant/streams?limit=1001", &fakeClient{}, 400, "", nil},
		{"list limit not a number", "GET", "/tenant/streams?limit=x", &fakeClient{}, 400, "", nil},
		{"list missing bucket", "GET", "/tenant/streams", failWith(errcode.BucketNotFound), 404, "", nil},
		{"create the reserved stream id", "PUT", "/tenant/streams", &fakeClient{}, 400, "", nil},
		{"post to streams", "POST", "/tenant/streams", &fakeClient{}, 405, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gotList = nil
			g := newTestGateway(t, tc.f, nil)
			rec := do(t, g, tc.method, "http://example.com"+tc.target, "", nil)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
			if tc.wantBody != "" {
				if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
					t.Fatalf("Content-Type %q", ct)
				}
				var got, want any
				if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
					t.Fatal(err)
				}
				_ = json.Unmarshal([]byte(tc.wantBody), &want)
				gb, _ := json.Marshal(got)
				wb, _ := json.Marshal(want)
				if string(gb) != string(wb) {
					t.Fatalf("body %s, want %s", gb, wb)
				}
			}
			if tc.wantList != nil && (gotList.GetBucket() != tc.wantList.GetBucket() || gotList.GetPrefix() != tc.wantList.GetPrefix() ||
				gotList.GetAfter() != tc.wantList.GetAfter() || gotList.GetLimit() != tc.wantList.GetLimit()) {
				t.Fatalf("list request %v, want %v", gotList, tc.wantList)
			}
		})
	}
}

func TestListLastPageHasNullCursor(t *testing.T) {
	f := &fakeClient{bucketFakes: bucketFakes{listStreams: func(*streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
		return &streamv1.ListStreamsResponse{}, nil
	}}}
	rec := do(t, newTestGateway(t, f, nil), "GET", "/tenant/streams", "", nil)
	if got := strings.TrimSpace(rec.Body.String()); got != `{"streams":[],"next_cursor":null,"has_more":false}` {
		t.Fatalf("body %s", got)
	}
}

func TestAttrsRoutes(t *testing.T) {
	var set *streamv1.SetAttrsRequest
	fakes := func(attrs *streamv1.StreamAttrs, err error) *fakeClient {
		return &fakeClient{bucketFakes: bucketFakes{
			getAttrs: func(*streamv1.GetAttrsRequest) (*streamv1.GetAttrsResponse, error) {
				return &streamv1.GetAttrsResponse{Attrs: attrs}, err
			},
			setAttrs: func(in *streamv1.SetAttrsRequest) (*streamv1.SetAttrsResponse, error) {
				set = in
				return &streamv1.SetAttrsResponse{}, err
			},
		}}
	}
	tests := []struct {
		name, method, body string
		f                  *fakeClient
		wantStatus         int
		wantBody           string
		wantSet            *streamv1.StreamAttrs
	}{
		{"get unset", "GET", "", fakes(nil, nil), 200, `{}`, nil},
		{"get", "GET", "", fakes(&streamv1.StreamAttrs{Title: "t", Metadata: []byte(`{"a":1}`)}, nil), 200, `{"title":"t","metadata":{"a":1}}`, nil},
		{"get missing", "GET", "", fakes(nil, bucketErr(errcode.StreamNotFound)), 404, "", nil},
		{"put", "PUT", `{"title":"t","metadata":{ "a" : 1 },"other":true}`, fakes(nil, nil), 204, "", &streamv1.StreamAttrs{Title: "t", Metadata: []byte(`{"a":1}`)}},
		{"put empty clears", "PUT", `{}`, fakes(nil, nil), 204, "", &streamv1.StreamAttrs{}},
		{"put nulls", "PUT", `{"title":null,"metadata":null}`, fakes(nil, nil), 204, "", &streamv1.StreamAttrs{}},
		{"put not an object", "PUT", `[1]`, &fakeClient{}, 400, "", nil},
		{"put bad json", "PUT", `{`, &fakeClient{}, 400, "", nil},
		{"put metadata not an object", "PUT", `{"metadata":"x"}`, &fakeClient{}, 400, "", nil},
		{"put title not a string", "PUT", `{"title":1}`, &fakeClient{}, 400, "", nil},
		{"put too large", "PUT", `{"title":"` + strings.Repeat("x", 16<<10) + `"}`, &fakeClient{}, 400, "", nil},
		{"put missing stream", "PUT", `{}`, fakes(nil, bucketErr(errcode.StreamNotFound)), 404, "", nil},
		{"post", "POST", "", &fakeClient{}, 405, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set = nil
			rec := do(t, newTestGateway(t, tc.f, nil), tc.method, "/tenant/s/attrs", tc.body, nil)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantBody != "" && strings.TrimSpace(rec.Body.String()) != tc.wantBody {
				t.Fatalf("body %s, want %s", rec.Body, tc.wantBody)
			}
			if tc.wantSet != nil {
				a := set.GetAttrs()
				if set.GetRef().GetBucket() != "tenant" || set.GetRef().GetStream() != "s" || a.GetTitle() != tc.wantSet.GetTitle() || string(a.GetMetadata()) != string(tc.wantSet.GetMetadata()) {
					t.Fatalf("SetAttrs %v, want %v", set, tc.wantSet)
				}
			}
		})
	}
}

func TestStreamIncarnationHeaders(t *testing.T) {
	mismatch := grpcerr.ToStatus(errcode.New(errcode.IncarnationMismatch, "recreated").With(errcode.KeyIncarnation, "9"))
	var sent uint64
	f := &fakeClient{
		createStream: func(*streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
			return &streamv1.CreateStreamResponse{Created: true, Info: &streamv1.StreamInfo{NextOffset: "0_0", Incarnation: 7}}, nil
		},
		appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
			if sent = in.GetIncarnation(); sent != 0 && sent != 7 {
				return nil, mismatch
			}
			return &streamv1.AppendResponse{NextOffset: "0_1", Incarnation: 7}, nil
		},
		read: func(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
			if sent = in.GetIncarnation(); sent != 0 && sent != 7 {
				return nil, mismatch
			}
			return &streamv1.ReadResponse{NextOffset: "0_1", Incarnation: 7, UpToDate: true}, nil
		},
		head: func(in *streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
			if sent = in.GetIncarnation(); sent != 0 && sent != 7 {
				return nil, mismatch
			}
			return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{NextOffset: "0_1", Incarnation: 7, ClusterId: "c1"}}, nil
		},
	}
	tests := []struct {
		name, method, token string
		wantStatus          int
		wantToken           string
		wantSent            uint64
		wantCluster         string
	}{
		{"create", "PUT", "", 201, "7", 0, ""},
		{"append", "POST", "", 204, "7", 0, ""},
		{"append current", "POST", "7", 204, "7", 7, ""},
		{"append stale", "POST", "3", 412, "9", 3, ""},
		{"read", "GET", "", 200, "7", 0, ""},
		{"read stale", "GET", "3", 412, "9", 3, ""},
		{"head", "HEAD", "", 200, "7", 0, "c1"},
		{"head current", "HEAD", "7", 200, "7", 7, "c1"},
		{"head stale", "HEAD", "3", 412, "9", 3, ""},
		{"malformed token", "GET", "07", 400, "", 0, ""},
		{"zero token", "HEAD", "0", 400, "", 0, ""},
	}
	g := newTestGateway(t, f, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sent = 0
			hdr := map[string]string{}
			body := ""
			if tc.method == "POST" {
				hdr["Content-Type"], body = "text/plain", "x"
			}
			if tc.token != "" {
				hdr["Stream-Incarnation"] = tc.token
			}
			rec := do(t, g, tc.method, "/tenant/s", body, hdr)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if got := rec.Header().Get("Stream-Incarnation"); got != tc.wantToken {
				t.Fatalf("Stream-Incarnation %q, want %q", got, tc.wantToken)
			}
			if sent != tc.wantSent {
				t.Fatalf("sent incarnation %d, want %d", sent, tc.wantSent)
			}
			if got := rec.Header().Get("Ursula-Cluster-Id"); got != tc.wantCluster {
				t.Fatalf("Ursula-Cluster-Id %q, want %q", got, tc.wantCluster)
			}
		})
	}
}

// TestListOneUpstreamCallPerPage: a listing page is one call to the node
// tier, whatever the number of groups (the node that answers gathers
// every group's streams); the gateway passes the cursor through and never
// merges or re-pages.
func TestListOneUpstreamCallPerPage(t *testing.T) {
	all := []string{"a", "b", "c", "d", "e"}
	tests := []struct {
		name  string
		query string // without after
		pages [][]string
	}{
		{"one page", "", [][]string{all}},
		{"pages of two", "limit=2", [][]string{{"a", "b"}, {"c", "d"}, {"e"}}},
		{"pages of one with a prefix", "limit=1&prefix=d", [][]string{{"d"}}},
		{"a page as large as the bucket", "limit=5", [][]string{all}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			f := &fakeClient{t: t, bucketFakes: bucketFakes{listStreams: func(in *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
				calls++
				limit := int(in.GetLimit())
				if limit == 0 {
					limit = 100
				}
				resp := &streamv1.ListStreamsResponse{}
				for _, s := range all {
					if s > in.GetAfter() && strings.HasPrefix(s, in.GetPrefix()) {
						if len(resp.Streams) == limit {
							resp.HasMore = true
							break
						}
						resp.Streams = append(resp.Streams, &streamv1.StreamListing{StreamId: s, Status: "open"})
					}
				}
				if resp.HasMore {
					resp.NextCursor = resp.Streams[len(resp.Streams)-1].GetStreamId()
				}
				return resp, nil
			}}}
			g := newTestGateway(t, f, nil)
			after := ""
			for i, want := range tc.pages {
				target := "/tenant/streams?" + tc.query
				if after != "" {
					target += "&after=" + after
				}
				rec := do(t, g, "GET", target, "", nil)
				if rec.Code != 200 {
					t.Fatalf("page %d: status %d: %s", i, rec.Code, rec.Body)
				}
				if calls != i+1 {
					t.Fatalf("page %d took %d upstream calls in all, want %d", i, calls, i+1)
				}
				var page streamList
				if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, s := range page.Streams {
					ids = append(ids, s.StreamID)
				}
				if strings.Join(ids, ",") != strings.Join(want, ",") {
					t.Fatalf("page %d = %v, want %v", i, ids, want)
				}
				last := i == len(tc.pages)-1
				if page.HasMore == last || (page.NextCursor == nil) != last {
					t.Fatalf("page %d: has_more %v, cursor %v; last page %v", i, page.HasMore, page.NextCursor, last)
				}
				if !last {
					after = *page.NextCursor
				}
			}
		})
	}
}
