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
		{"two buckets", "usage.golden.json", map[string]stream.BucketUsage{
			"tenant-a": {CommittedAppendBytes: 24576, CommittedRecords: 3, CommittedWriteUnits: 4, RetainedBytes: 24576, StreamCount: 1},
			"tenant-b": {CommittedAppendBytes: 10, CommittedRecords: 1, CommittedWriteUnits: 2},
		}, []cold.StagedUsage{
			{GroupID: 2, Term: 7, CountingFinished: true, Bytes: map[string]uint64{"tenant-a": 33554432}},
			{GroupID: 0, Term: 3, CountingFinished: true, Bytes: map[string]uint64{"tenant-a": 5, "tenant-b": 1}},
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
	m := s.metricsSnapshot()
	for _, k := range []string{"ttl_expiry_sweeps", "ttl_expiry_sweep_due_groups"} {
		if _, ok := m[k].(float64); !ok {
			t.Fatalf("metrics lack %s", k)
		}
	}
}
