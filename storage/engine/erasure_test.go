package engine

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/tests/await"
)

// erasureConfig is a node whose groups never snapshot on their own (only
// the deleted-data bound makes them), with small journal segments and a
// short bound.
func erasureConfig(dir string) Config {
	cfg := testConfig(dir)
	cfg.SnapshotEntries = 1 << 20
	cfg.SnapshotBytes = 1 << 30
	cfg.WAL.SegmentSize = 64 << 10
	cfg.DeletedDataMaxAge = 8 * time.Second
	cfg.ExpirySweepInterval = time.Hour // SweepInterval: a quarter of the bound
	cfg.SnapshotDriveInterval = 250 * time.Millisecond
	return cfg
}

// randomBody is incompressible content no other stream holds.
func randomBody(tb testing.TB, n int) []byte {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return b
}

// probes are slices of content that must (or must not) be found in files:
// 32 bytes every 1 KiB.
func probes(content []byte) [][]byte {
	var out [][]byte
	for at := 0; at+32 <= len(content); at += 1 << 10 {
		out = append(out, content[at:at+32])
	}
	return out
}

// filesHolding lists the files under dir that hold any of the probes.
func filesHolding(tb testing.TB, dir string, probes [][]byte) []string {
	tb.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
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
	return hits
}

// driveStep advances the clock by step (at least the drive interval) and
// waits until every shard's snapshot driver ran after it, so that the
// test's time and the driver's passes advance together.
func driveStep(tb testing.TB, te *testEngine, clock *fakeClock, step time.Duration) multiraft.ErasureStats {
	tb.Helper()
	before := te.node.Cluster.Erasure().DriverPasses
	clock.Advance(step)
	shards := uint64(te.Config().ShardCount)
	var st multiraft.ErasureStats
	await.True(tb, "a driver pass on every shard", func() bool {
		st = te.node.Cluster.Erasure()
		// A shard's driver runs once per step of the clock: each shard
		// has run after this one.
		return st.DriverPasses >= before+shards
	})
	return st
}

// TestDeletedDataLeavesEveryFile deletes and expires streams and proves,
// by scanning every file of the data directory, that no byte of them is
// left within the bound while the other streams stay intact.
func TestDeletedDataLeavesEveryFile(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := erasureConfig(t.TempDir())
	e := startEngineAt(t, cfg, clock)
	ctx := t.Context()

	appendRandom := func(name string) []byte {
		var all []byte
		for range 12 {
			body := randomBody(t, 3<<10)
			if _, err := e.Append(ctx, &streamv1.AppendRequest{Ref: ref(name), ContentType: "application/octet-stream", Body: body}); err != nil {
				t.Fatalf("Append %s: %v", name, err)
			}
			all = append(all, body...)
		}
		return all
	}
	write := func(name string, ttl *uint64) []byte {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "application/octet-stream", TtlSeconds: ttl})
		return appendRandom(name)
	}
	// Enough streams that the journals roll over several segments.
	kept := map[string][]byte{}
	for i := range 6 {
		name := fmt.Sprintf("keep-%d", i)
		kept[name] = write(name, nil)
	}
	deleted := map[string][]byte{}
	for i := range 4 {
		name := fmt.Sprintf("delete-%d", i)
		deleted[name] = write(name, nil)
	}
	expiring := write("expire", ttlSeconds(1))
	// The kept streams' later entries share segments with the removed ones.
	for name := range kept {
		kept[name] = append(kept[name], appendRandom(name)...)
	}
	var gone [][]byte
	for _, c := range deleted {
		gone = append(gone, probes(c)...)
	}
	gone = append(gone, probes(expiring)...)
	if hits := filesHolding(t, cfg.DataDir, gone); len(hits) == 0 {
		t.Fatal("the journals hold none of the streams' bytes before their removal: the scan proves nothing")
	}

	removedAt := clock.Now()
	for name := range deleted {
		if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref(name)}); err != nil {
			t.Fatalf("DeleteStream %s: %v", name, err)
		}
	}
	clock.Advance(2 * time.Second) // the TTL stream expires; the sweep removes it
	await.True(t, "the sweep to remove the expired stream", func() bool { return !exists(e, "expire") })

	bound := cfg.DeletedDataMaxAge
	sawOwed := false
	for {
		st := driveStep(t, e, clock, 250*time.Millisecond)
		if st.OverdueGroups != 0 {
			t.Fatalf("%d groups overdue %v after the removal: %+v", st.OverdueGroups, clock.Now().Sub(removedAt), st.Groups)
		}
		if len(st.Groups) > 0 {
			sawOwed = true
		}
		if sawOwed && len(st.Groups) == 0 {
			break
		}
		if clock.Now().Sub(removedAt) > 2*bound {
			t.Fatalf("deleted data still held %v after the removal: %+v", clock.Now().Sub(removedAt), st.Groups)
		}
	}
	took := clock.Now().Sub(removedAt)
	if took > bound {
		t.Fatalf("erasure took %v, over the bound of %v", took, bound)
	}
	t.Logf("erased %v after the removal (bound %v)", took, bound)
	if hits := filesHolding(t, cfg.DataDir, gone); len(hits) > 0 {
		t.Fatalf("files still hold deleted streams' bytes after the erasure: %v", hits)
	}
	for name, c := range kept {
		if got := readAll(t, e, name); got != string(c) {
			t.Fatalf("stream %s changed: %d bytes, want %d", name, len(got), len(c))
		}
	}
	// A restart replays what is left and reads every kept stream back.
	e = restart(t, e, clock)
	for name, c := range kept {
		if got := readAll(t, e, name); got != string(c) {
			t.Fatalf("after a restart, stream %s changed: %d bytes, want %d", name, len(got), len(c))
		}
	}
	for name := range deleted {
		if exists(e, name) {
			t.Fatalf("after a restart, deleted stream %s is back", name)
		}
	}
}

// TestDeletedDataReplayedIsDueAtOnce: a removal the replica applies again
// while it replays its log at startup may have been applied before the
// restart, so the restart must not extend the bound: it is due at once,
// not a quarter of the bound later.
func TestDeletedDataReplayedIsDueAtOnce(t *testing.T) {
	clock := newFakeClock(ttlEpoch)
	cfg := erasureConfig(t.TempDir())
	e := startEngineAt(t, cfg, clock)
	ctx := t.Context()
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("gone"), ContentType: "application/octet-stream"})
	content := randomBody(t, 8<<10)
	if _, err := e.Append(ctx, &streamv1.AppendRequest{Ref: ref("gone"), ContentType: "application/octet-stream", Body: content}); err != nil {
		t.Fatal(err)
	}
	// A snapshot file holds the stream before its removal: the erasure
	// must replace it.
	g := e.GroupOf(key("gone"))
	before, err := e.node.Cluster.Snapshot(ctx, g, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(cfg.DataDir, "snapshots")
	if hits := filesHolding(t, snapDir, probes(content)); len(hits) == 0 {
		t.Fatal("no snapshot file holds the stream before its removal: the scan proves nothing")
	}
	if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref("gone")}); err != nil {
		t.Fatal(err)
	}
	if st := e.node.Cluster.Erasure(); len(st.Groups) != 1 || st.Groups[0].Group != g || st.Groups[0].State != multiraft.ErasureOwed {
		t.Fatalf("after the delete: %+v, want group %d owed", st.Groups, g)
	}
	e = restart(t, e, clock)
	st := e.node.Cluster.Erasure()
	if len(st.Groups) != 1 || st.Groups[0].State != multiraft.ErasureReplayed {
		t.Fatalf("after the restart: %+v, want group %d replayed", st.Groups, g)
	}
	// One step of the drive interval, far below a quarter of the bound,
	// snapshots the group.
	st = driveStep(t, e, clock, cfg.SnapshotDriveInterval)
	await.True(t, "a snapshot covering the replayed removal", func() bool {
		return e.status(g).SnapshotIndex > before
	})
	for range 8 {
		if st = driveStep(t, e, clock, cfg.SnapshotDriveInterval); len(st.Groups) == 0 || st.Groups[0].State == multiraft.ErasurePurging {
			break
		}
	}
	if len(st.Groups) != 0 && st.Groups[0].State != multiraft.ErasurePurging {
		t.Fatalf("the replayed removal is still owed after several passes: %+v", st.Groups)
	}
	if hits := filesHolding(t, snapDir, probes(content)); len(hits) > 0 {
		t.Fatalf("snapshot files still hold the deleted stream: %v", hits)
	}
}
