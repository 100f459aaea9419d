package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/tests/await"
)

// streamDir is where an fs cold store keeps a Durable Streams stream's
// objects, relative to its root (see coldfmt.StreamPrefix).
func streamDir(name string) string {
	h := sha256.Sum256([]byte(name))
	return filepath.Join("__ds", hex.EncodeToString(h[:16]))
}

// coldFiles counts the objects under dir/sub of an fs cold store.
func coldFiles(tb testing.TB, dir, sub string) int {
	tb.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, sub), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.IsDir() && !strings.HasPrefix(d.Name(), ".") {
			n++
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestColdGCWorkerOnCluster runs ursula-coldgc beside a 3-node cluster, as
// a split deployment does: it compacts the small chunks of a live stream
// (which still reads back byte-exact from every replica's point of view
// through the gateway) and deletes every object of a deleted stream.
func TestColdGCWorkerOnCluster(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, Gateway: true, GroupCount: 8, ColdTuning: TinyFlushTOML, RuntimeTuning: TinyFlushRuntimeTOML})
	coldDir := filepath.Join(c.Dir, "cold")
	ctx := t.Context()
	client := c.Client()
	var want strings.Builder
	for _, name := range []string{"gc-kept", "gc-gone"} {
		if resp, err := client.Create(ctx, name, "text/plain", nil); err != nil || resp.Status/100 != 2 {
			t.Fatalf("create %s: %v %v", name, resp, err)
		}
	}
	// Millisecond flushes leave many small chunks per stream. So that
	// there are at least ten however fast the appends go, each batch of
	// twenty records waits until both streams have a new cold object.
	gone, kept := streamDir("gc-gone"), streamDir("gc-kept")
	nGone, nKept := 0, 0
	for i := range 200 {
		body := []byte(fmt.Sprintf("record %04d %s;", i, strings.Repeat("x", i%50)))
		for _, name := range []string{"gc-kept", "gc-gone"} {
			if resp, err := client.Append(ctx, name, "text/plain", body, nil); err != nil || resp.Status/100 != 2 {
				t.Fatalf("append to %s: %v %v", name, resp, err)
			}
		}
		want.Write(body)
		if i%20 == 19 {
			await.True(t, fmt.Sprintf("a cold object of both streams for records up to %d", i), func() bool {
				return coldFiles(t, coldDir, gone) > nGone && coldFiles(t, coldDir, kept) > nKept
			})
			nGone, nKept = coldFiles(t, coldDir, gone), coldFiles(t, coldDir, kept)
		}
	}
	if nGone < 10 || nKept < 10 {
		t.Fatalf("only %d and %d cold objects after the appends", nGone, nKept)
	}
	t.Logf("%d and %d cold objects of gc-gone and gc-kept after the appends", nGone, nKept)

	cmd := c.StartColdGC(t, coldDir, "compact_interval = \"200ms\"\nsmall_chunk_bytes = 4096\nmax_chunk_bytes = 65536")

	if resp, err := client.Do(ctx, "DELETE", "gc-gone", nil, nil, nil); err != nil || resp.Status/100 != 2 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	// The deleted stream's objects go; the live stream keeps reading back
	// byte-exact while the worker compacts its chunks (the replaced ones
	// stay for the GC grace, 5 minutes by default).
	if !await.Until(await.DefaultTimeout, func() bool {
		got, _, err := client.ReadAll(ctx, "gc-kept")
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want.String() {
			t.Fatalf("gc-kept reads %d bytes, want %d", len(got), want.Len())
		}
		return coldFiles(t, coldDir, gone) == 0
	}) {
		t.Fatalf("%d objects of the deleted stream remain", coldFiles(t, coldDir, gone))
	}
	if coldFiles(t, coldDir, kept) == 0 {
		t.Fatal("the live stream's objects were deleted")
	}
	if cmd.ProcessState != nil {
		t.Fatalf("ursula-coldgc exited: %v", cmd.ProcessState)
	}
}

// StartColdGC runs ursula-coldgc beside the cluster on the fs cold store
// in coldDir, passing every 100 ms, with tuning added to its [coldgc]
// section and args to its command line; it is killed when the test ends
// (its log printed on failure).
func (c *Cluster) StartColdGC(t *testing.T, coldDir, tuning string, args ...string) *exec.Cmd {
	t.Helper()
	cfg := filepath.Join(c.Dir, "coldgc.toml")
	toml := fmt.Sprintf("[upstream]\nnodes = [%q]\n"+c.ClientPlaneTOML(pki.RoleColdGC)+"\n[storage.cold]\nbackend = \"fs\"\nroot = %q\n\n[coldgc]\ninterval = \"100ms\"\n%s\n",
		c.Nodes[1].ClientAddr(), coldDir, tuning)
	if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := Binary("ursula-coldgc")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(c.Dir, "coldgc.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-config", cfg}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("ursula-coldgc log:\n%s", out)
		}
	})
	return cmd
}
