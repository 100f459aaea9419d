package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// erasureBound is the clusters' raft.deleted_data_max_age in the erasure
// test: short, so that the test proves the bound in seconds.
const erasureBound = 16 * time.Second

// randomContent is incompressible content no other stream holds.
func randomContent(tb testing.TB, n int) []byte {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return b
}

// contentProbes are the slices of content a scan looks for: 32 bytes
// every 512.
func contentProbes(content []byte) [][]byte {
	var out [][]byte
	for at := 0; at+32 <= len(content); at += 512 {
		out = append(out, content[at:at+32])
	}
	return out
}

// filesHoldingAny lists the files under the directories that hold any of
// the probes.
func filesHoldingAny(tb testing.TB, dirs []string, probes [][]byte) []string {
	tb.Helper()
	var hits []string
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil // deleted while walking
				}
				return err
			}
			if d.IsDir() {
				return nil
			}
			data, err := os.ReadFile(path)
			if os.IsNotExist(err) {
				return nil
			}
			if err != nil {
				return err
			}
			for _, p := range probes {
				if bytes.Contains(data, p) {
					hits = append(hits, path)
					break
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatalf("scan %s: %v", dir, err)
		}
	}
	return hits
}

// erasureState is what one node's metrics say of the deleted-data bound.
type erasureState struct {
	groups         int // groups still holding deleted data
	overdue        float64
	oldestAgeMs    float64
	dirtySegments  float64
	rewrittenBytes float64
}

func nodeErasure(tb testing.TB, n *Node) erasureState {
	tb.Helper()
	m := n.NodeMetrics(tb)
	dd, _ := m["deleted_data"].([]any)
	num := func(k string) float64 { v, _ := m[k].(float64); return v }
	return erasureState{groups: len(dd), overdue: num("raft_deleted_data_overdue_groups"), oldestAgeMs: num("raft_deleted_data_oldest_age_ms"),
		dirtySegments: num("wal_dirty_segments"), rewrittenBytes: num("wal_rewritten_bytes")}
}

// TestDeletedDataErasedFromEveryFile writes streams of random content into
// a 3-node cluster with a short raft.deleted_data_max_age, small journal
// segments and its cold tier in a shared directory, then deletes some,
// lets one expire and purges a bucket of others. Within the bound every
// node reports its deleted data erased (never overdue), and a scan of
// every file of every node's data directory and of the cold store finds
// no byte of the removed streams, while the kept streams read back whole
// and are still found on disk.
func TestDeletedDataErasedFromEveryFile(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, Gateway: true, GroupCount: 8, ColdTuning: TinyFlushTOML, RuntimeTuning: TinyFlushRuntimeTOML,
		RaftTuning: fmt.Sprintf("deleted_data_max_age = %q", erasureBound.String()),
		WALTuning:  "segment_size = 65536",
		Extra:      "[storage.snapshot]\ndrive_interval = \"250ms\"\n"})
	coldDir := filepath.Join(c.Dir, "cold")
	c.StartColdGC(t, coldDir, "")
	ctx := t.Context()
	client := c.Client()
	hc := client.HTTP
	gw := c.GatewayURL()
	octet := http.Header{"Content-Type": {"application/octet-stream"}}

	appendRandom := func(url string) []byte {
		var all []byte
		for range 10 {
			body := randomContent(t, 1500)
			if resp := mustDo(ctx, t, hc, http.MethodPost, url, octet, body); resp.Status/100 != 2 {
				t.Fatalf("POST %s: %v", url, resp)
			}
			all = append(all, body...)
		}
		return all
	}
	create := func(url string, h http.Header) {
		if resp := mustDo(ctx, t, hc, http.MethodPut, url, h, nil); resp.Status != http.StatusCreated {
			t.Fatalf("PUT %s: %v", url, resp)
		}
	}
	kept := map[string][]byte{} // URL → content
	for i := range 4 {
		url := client.StreamURL(fmt.Sprintf("keep-%d", i))
		create(url, octet)
		kept[url] = appendRandom(url)
	}
	var removed []byte // every removed stream's content
	var deleted []string
	for i := range 3 {
		url := client.StreamURL(fmt.Sprintf("delete-%d", i))
		create(url, octet)
		removed = append(removed, appendRandom(url)...)
		deleted = append(deleted, url)
	}
	expiring := client.StreamURL("expire")
	create(expiring, http.Header{"Content-Type": {"application/octet-stream"}, "Stream-TTL": {"2"}})
	removed = append(removed, appendRandom(expiring)...)
	create(gw+"/tenant-x", nil)
	for i := range 3 {
		url := fmt.Sprintf("%s/tenant-x/s%d", gw, i)
		create(url, octet)
		removed = append(removed, appendRandom(url)...)
	}
	// The kept streams' later entries share journal segments with the
	// removed ones.
	for url := range kept {
		kept[url] = append(kept[url], appendRandom(url)...)
	}
	dirs := []string{coldDir}
	for _, n := range c.Nodes {
		dirs = append(dirs, n.Config.DataDir)
	}
	gone := contentProbes(removed)
	if hits := filesHoldingAny(t, dirs, gone); len(hits) == 0 {
		t.Fatal("no file holds the removed streams' bytes before the removals: the scan proves nothing")
	}

	start := time.Now()
	for _, url := range deleted {
		if resp := mustDo(ctx, t, hc, http.MethodDelete, url, nil, nil); resp.Status/100 != 2 {
			t.Fatalf("DELETE %s: %v", url, resp)
		}
	}
	n1 := c.Node(1)
	inc, _ := n1.NodeMetrics(t)["process_incarnation"].(string)
	purge := func() *purgeReport {
		t.Helper()
		h := http.Header{"X-Ursula-Process-Incarnation": {inc}, "Authorization": {n1.AdminAuth(t)}}
		resp := mustDo(ctx, t, hc, http.MethodDelete, "http://"+n1.Config.AdminListen+"/__ursula/purge/tenant-x", h, nil)
		if resp.Status != http.StatusOK {
			t.Fatalf("purge tenant-x: %v", resp)
		}
		var rep purgeReport
		if err := json.Unmarshal(resp.Body, &rep); err != nil {
			t.Fatalf("purge report: %v: %s", err, resp.Body)
		}
		t.Logf("purge report: %s", bytes.TrimSpace(resp.Body))
		return &rep
	}
	rep := purge()
	if rep.RemovedStreams != 3 || !rep.BucketPrefixAbsent || rep.RaftDeletedDataMaxAgeMs != uint64(erasureBound.Milliseconds()) ||
		rep.RaftErasureComplete || len(rep.RaftErasurePendingGroups) == 0 || rep.RaftErasureDueBy == nil {
		t.Fatalf("purge report: %+v; want 3 streams removed, the prefix absent, and this node's erasure pending within the bound", rep)
	}
	await.True(t, "the expired stream to be removed", func() bool {
		resp := mustDo(ctx, t, hc, http.MethodHead, expiring, nil, nil)
		return resp.Status == http.StatusNotFound
	})

	// Every node erases within the bound: no group is ever reported
	// overdue, and every node ends with nothing held.
	var last map[uint64]erasureState
	if !await.Until(3*erasureBound, func() bool {
		last = map[uint64]erasureState{}
		done := true
		for _, n := range c.Nodes {
			st := nodeErasure(t, n)
			last[n.ID] = st
			if st.overdue != 0 {
				t.Fatalf("node %d reports %v groups overdue %v after the removals: %+v", n.ID, st.overdue, time.Since(start), st)
			}
			done = done && st.groups == 0
		}
		return done
	}) {
		t.Fatalf("deleted data still held %v after the removals: %+v", time.Since(start), last)
	}
	t.Logf("every node erased the removed streams %v after the removals (bound %v): %+v", time.Since(start).Round(time.Millisecond), erasureBound, last)
	rewritten := 0.0
	for _, st := range last {
		rewritten += st.rewrittenBytes
	}
	if rewritten == 0 {
		t.Error("no node copied a live entry forward: the segments were freed without the rewrite the test is about")
	}

	if hits := filesHoldingAny(t, dirs, gone); len(hits) > 0 {
		t.Fatalf("files still hold removed streams' bytes after the erasure: %s", strings.Join(hits, ", "))
	}
	var keptProbes [][]byte
	for url, content := range kept {
		got, err := readAllURL(ctx, hc, url)
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("kept stream %s reads %d bytes (%v), want its %d", url, len(got), err, len(content))
		}
		keptProbes = append(keptProbes, contentProbes(content)...)
	}
	if hits := filesHoldingAny(t, dirs, keptProbes); len(hits) == 0 {
		t.Fatal("no file holds the kept streams' bytes: the scan cannot see stored data")
	}
	if rep := purge(); !rep.RaftErasureComplete || rep.RaftErasureDueBy != nil {
		t.Errorf("a purge repeated after the erasure: %+v, want this node's erasure complete", rep)
	}
}
