package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestCleanShutdownDamagedTailRefused (the issue: a journal whose active
// segment was cut after a clean shutdown was "repaired" at the next start
// by cutting the torn tail, and the acknowledged appends in it vanished
// with the node ready and wal_recovery false). bin/ursula acknowledges
// appends, stops cleanly on SIGTERM, and the active segment holding them
// loses its last bytes; the next start must exit non-zero, its log naming
// the segment file and the byte offset, and leave the data directory
// exactly as it was. With the segment restored, it starts and serves every
// acknowledged append.
func TestCleanShutdownDamagedTailRefused(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	srv := StartServer(t, Options{DataDir: dataDir})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := NewClient(srv.URL())
	const stream = "torn/tail"
	if resp, err := c.Create(ctx, stream, "text/plain", nil); err != nil || resp.Status != 201 {
		t.Fatalf("create: %v %v", resp, err)
	}
	var want []byte
	for i := range 8 {
		body := fmt.Appendf(nil, "acknowledged-append-%02d;", i)
		resp, err := c.Append(ctx, stream, "text/plain", body, nil)
		if err != nil || resp.Status != 204 && resp.Status != 200 {
			t.Fatalf("append %d: %v %v", i, resp, err)
		}
		want = append(want, body...)
	}
	if err := srv.Terminate(termTimeout); err != nil {
		t.Fatal(err)
	}

	// The active segment of the shard that journaled the appends.
	active := ""
	segs, _ := filepath.Glob(filepath.Join(dataDir, "raft-log", "shard-*", "*.wal"))
	byShard := map[string][]string{}
	for _, s := range segs {
		byShard[filepath.Dir(s)] = append(byShard[filepath.Dir(s)], s)
	}
	for _, files := range byShard {
		sort.Strings(files)
		last := files[len(files)-1]
		if b, err := os.ReadFile(last); err == nil && bytes.Contains(b, []byte("acknowledged-append-07;")) {
			active = last
		}
	}
	if active == "" {
		t.Fatalf("no active segment holds the last append (segments: %v)", segs)
	}
	intact, err := os.ReadFile(active)
	if err != nil {
		t.Fatal(err)
	}
	cut := len(intact) - 7
	if err := os.Truncate(active, int64(cut)); err != nil {
		t.Fatal(err)
	}
	before := dataDirState(t, dataDir)

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := srv.wait(60 * time.Second); err != nil {
		t.Fatalf("the start on a damaged journal did not exit: %v", err)
	}
	if srv.ExitErr() == nil {
		t.Fatal("the start on a damaged journal exited with status 0")
	}
	log := srv.LogTail(40)
	if want := fmt.Sprintf("%s at offset %d", active, cut); !strings.Contains(log, want) {
		t.Fatalf("the log does not name %q:\n%s", want, log)
	}
	if after := dataDirState(t, dataDir); after != before {
		t.Fatalf("the refused start changed the data directory:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	if err := os.WriteFile(active, intact, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	got, _, err := c.ReadAll(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q after the restore, want %q", got, want)
	}
	var m Metrics
	if _, err := getJSON(ctx, srv.HTTPClient(3*time.Second), "http://"+srv.Addrs["server.listen"]+"/__ursula/metrics", &m); err != nil {
		t.Fatal(err)
	}
	if m.WALRecovery {
		t.Fatal("wal_recovery after a clean shutdown")
	}
}

// dataDirState lists every file under dir with its size and digest.
func dataDirState(tb testing.TB, dir string) string {
	tb.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %d %x\n", p, len(data), sha256.Sum256(data))
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b.String()
}
