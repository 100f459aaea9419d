package node

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/stream"
)

var updateUsage = flag.Bool("update-usage", false, "rewrite services/node/testdata/usage.golden.json")

// TestUsageGolden pins the usage document's wire format.
func TestUsageGolden(t *testing.T) {
	tests := []struct {
		name   string
		golden string
		usage  map[string]stream.BucketUsage
		staged []cold.StagedUsage
	}{
		// The internal buckets (__system, any other "__" name but the
		// family's __ds) are left out of both; a led group without parts
		// and one still counting are reported.
		{"two buckets", "usage.golden.json", map[string]stream.BucketUsage{
			"tenant-a": {CommittedAppendBytes: 24576, CommittedRecords: 3, CommittedWriteUnits: 4, RetainedBytes: 24576, StreamCount: 1},
			"tenant-b": {CommittedAppendBytes: 10, CommittedRecords: 1, CommittedWriteUnits: 2},
			"__ds":     {CommittedAppendBytes: 7, CommittedRecords: 1, CommittedWriteUnits: 1, RetainedBytes: 7, StreamCount: 1},
			"__system": {CommittedAppendBytes: 300, CommittedRecords: 3, CommittedWriteUnits: 3, RetainedBytes: 300, StreamCount: 1},
			"__other":  {CommittedAppendBytes: 1, CommittedRecords: 1, CommittedWriteUnits: 1},
		}, []cold.StagedUsage{
			{GroupID: 2, Term: 7, CountingFinished: true, Bytes: map[string]uint64{"tenant-a": 33554432, "__system": 9}},
			{GroupID: 0, Term: 3, CountingFinished: true, Bytes: map[string]uint64{"tenant-a": 5, "tenant-b": 1}},
			{GroupID: 1, Term: 3, CountingFinished: true, Bytes: map[string]uint64{}},
			{GroupID: 3, Term: 4, CountingFinished: false, Bytes: map[string]uint64{"__system": 2}},
		}},
		{"no buckets", "usage_empty.golden.json", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.MarshalIndent(buildUsage(1, 4, tc.usage, tc.staged), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", tc.golden)
			if *updateUsage {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-usage to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("usage document differs from %s:\n%s", path, got)
			}
		})
	}
}

// TestUsageEndpoint serves the usage document from a running engine on the
// client plane, and checks HEAD's cluster id and the sweep metrics.
func TestUsageEndpoint(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	c := streamv1.NewStreamServiceClient(s.Conn())
	ctx := t.Context()
	if _, err := c.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: "tenant"}); err != nil {
		t.Fatal(err)
	}
	ref := &streamv1.StreamRef{Bucket: "tenant", Stream: "s"}
	if _, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref, HasBody: true, Body: []byte("abc")}); err != nil {
		t.Fatal(err)
	}
	// The subscriptions' state lives in the internal __system bucket; the
	// family's __ds holds clients' streams.
	for _, r := range []*streamv1.StreamRef{{Bucket: "__system", Stream: "subscriptions"}, {Bucket: "__ds", Stream: "d"}} {
		if _, err := c.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: r, HasBody: true, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := c.Head(ctx, &streamv1.HeadRequest{Ref: ref})
	if err != nil || h.GetInfo().GetClusterId() != testClusterID {
		t.Fatalf("Head = %v, %v; want cluster id %q", h, err, testClusterID)
	}
	rec := httptest.NewRecorder()
	s.httpHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/__ursula/usage", nil))
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	var doc usageDoc
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := bucketUsage{CommittedAppendBytes: 3, CommittedRecords: 1, CommittedWriteUnits: 1, RetainedBytes: 3, StreamCount: 1}
	if doc.Version != 1 || doc.NodeID != 1 || doc.WriteUnitBytes != 10240 || doc.RaftGroupCount != 8 || doc.Buckets["tenant"] != want {
		t.Fatalf("usage = %+v", doc)
	}
	if _, ok := doc.Buckets["__system"]; ok || len(doc.Buckets) != 2 || doc.Buckets["__ds"].StreamCount != 1 {
		t.Fatalf("usage buckets = %+v, want tenant and __ds, not the internal __system", doc.Buckets)
	}
	m := s.metricsSnapshot()
	for _, k := range []string{"ttl_expiry_sweeps", "ttl_expiry_sweep_due_groups"} {
		if _, ok := m[k].(float64); !ok {
			t.Fatalf("metrics lack %s", k)
		}
	}
}
