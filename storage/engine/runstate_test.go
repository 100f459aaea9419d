package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/wal"
)

// activeSegment is the newest segment file of a shard's journal.
func activeSegment(tb testing.TB, dataDir string, shard int) string {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(wal.LogDir(dataDir), fmt.Sprintf("shard-%03d", shard), "*.wal"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("segments of shard %d: %v, %v", shard, files, err)
	}
	sort.Strings(files)
	return files[len(files)-1]
}

// treeState is every file under dir and its bytes.
func treeState(tb testing.TB, dir string) string {
	tb.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %x\n", p, data)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b.String()
}

// TestCleanShutdownHoldsTheJournals: after a clean stop, a start that
// finds an active segment cut short refuses (naming the file and the
// offset), changes nothing on disk, and keeps refusing until the file is
// back; then every acknowledged append reads back. Without the clean
// shutdown record (a crash) the same cut is a torn tail: cut, and
// wal_recovery reported.
func TestCleanShutdownHoldsTheJournals(t *testing.T) {
	e := startEngine(t, nil)
	cfg := e.Config()
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain"})
	for i := range 5 {
		mustAppend(t, e, "s", "text/plain", fmt.Sprintf("append %d;", i))
	}
	shard := int(e.GroupOf(key("s"))) % cfg.ShardCount
	e.stop(t)

	active := activeSegment(t, cfg.DataDir, shard)
	intact, err := os.ReadFile(active)
	if err != nil {
		t.Fatal(err)
	}
	cut := int64(len(intact) - 5)
	if err := os.Truncate(active, cut); err != nil {
		t.Fatal(err)
	}
	before := treeState(t, cfg.DataDir)
	for attempt := range 2 {
		_, err := Open(cfg, Deps{Logger: testLogger(t)})
		if !errors.Is(err, wal.ErrCorrupt) {
			t.Fatalf("start %d after the cut: %v, want wal.ErrCorrupt", attempt, err)
		}
		if want := fmt.Sprintf("%s at offset %d", active, cut); !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
		if after := treeState(t, cfg.DataDir); after != before {
			t.Fatalf("start %d: the refused start changed the data directory", attempt)
		}
	}

	if err := os.WriteFile(active, intact, 0o644); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, cfg, Deps{})
	e.run(t)
	e.waitReady(t)
	if e.node.WALRecovery() {
		t.Fatal("wal_recovery after a clean shutdown")
	}
	if got := readAll(t, e, "s"); got != "append 0;append 1;append 2;append 3;append 4;" {
		t.Fatalf("read %q", got)
	}
	mustAppend(t, e, "s", "text/plain", "append 5;")
	e.stop(t)

	// A crash of the process alone leaves no record either, but the
	// running record of this boot: the page cache lost nothing.
	if err := os.Remove(filepath.Join(wal.LogDir(cfg.DataDir), wal.CleanShutdownFile)); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, cfg, Deps{})
	e.run(t)
	e.waitReady(t)
	if e.node.WALRecovery() && wal.BootID(wal.OSFS{}) != "" {
		t.Fatal("wal_recovery after a crash of the process alone")
	}
	if got := readAll(t, e, "s"); got != "append 0;append 1;append 2;append 3;append 4;append 5;" {
		t.Fatalf("read %q", got)
	}
	e.stop(t)

	// A host crash leaves no record, and the next start runs on another
	// boot (no running record of its own): the same cut is a torn write.
	if err := os.Remove(filepath.Join(wal.LogDir(cfg.DataDir), wal.CleanShutdownFile)); err != nil {
		t.Fatal(err)
	}
	if err := wal.ForgetRunning(wal.OSFS{}, wal.LogDir(cfg.DataDir)); err != nil {
		t.Fatal(err)
	}
	active = activeSegment(t, cfg.DataDir, shard)
	fi, err := os.Stat(active)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(active, fi.Size()-5); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, cfg, Deps{})
	e.run(t)
	e.waitReady(t)
	if !e.node.WALRecovery() {
		t.Fatal("no wal_recovery after a crash")
	}
}
