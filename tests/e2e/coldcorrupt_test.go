package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// TestColdObjectCorrupt (the issue: cold chunks and external payloads
// carried no checksum, so a flipped byte in the cold store was served as
// data). bin/ursula keeps its cold tier in a local directory (the fs
// object store) and flushes at once into small chunks; one byte of a real
// chunk object, and one of an external payload, is flipped on disk. A
// read of the damaged bytes answers 502 COLD_OBJECT_CORRUPT and none of
// them, again on a retry; the node's cold_corrupt_reads counter moves in
// /__ursula/metrics and in Prometheus, and the log names the object; the
// undamaged parts of the stream and another stream still read back
// exactly.
func TestColdObjectCorrupt(t *testing.T) {
	coldDir := filepath.Join(t.TempDir(), "cold")
	srv := StartServer(t, Options{
		DataDir: filepath.Join(t.TempDir(), "data"),
		Args:    append([]string{"-storage.cold.backend=fs", "-storage.cold.root=" + coldDir}, TinyFlushArgs...),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := NewClient(srv.URL())

	// victim: many small appends (several chunks); bystander: another
	// stream; big: one append stored as an external payload.
	write := func(stream string, bodies ...[]byte) []byte {
		t.Helper()
		if resp, err := c.Create(ctx, stream, "text/plain", nil); err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("create %s: %v %v", stream, resp, err)
		}
		var all []byte
		for _, b := range bodies {
			resp, err := c.Append(ctx, stream, "text/plain", b, nil)
			if err != nil || resp.Status/100 != 2 {
				t.Fatalf("append to %s: %v %v", stream, resp, err)
			}
			all = append(all, b...)
		}
		return all
	}
	var victimBodies, bystanderBodies [][]byte
	for i := range 60 {
		victimBodies = append(victimBodies, fmt.Appendf(nil, "victim-%03d:%s;", i, strings.Repeat("v", 200)))
		bystanderBodies = append(bystanderBodies, fmt.Appendf(nil, "bystander-%03d:%s;", i, strings.Repeat("b", 200)))
	}
	victim := write("corrupt/victim", victimBodies...)
	bystander := write("corrupt/bystander", bystanderBodies...)
	write("corrupt/big", append([]byte("big-payload:"), bytes.Repeat([]byte("g"), 40<<10)...))
	await.True(t, "every hot byte flushed to the cold store", func() bool {
		hot, _ := srv.NodeMetrics(t)["hot_bytes_awaiting_flush"].(float64)
		return hot == 0
	})

	// The chunk holding victim-030, and the external payload.
	chunk := findObject(t, coldDir, "/c/", []byte("victim-030:"))
	ext := findObject(t, coldDir, "/x/", []byte("big-payload:"))
	chunkStart := chunkStartOf(t, chunk)
	flipAt(t, chunk, []byte("victim-030:"), 3)
	flipAt(t, ext, []byte("big-payload:"), 40<<10)

	before := srv.NodeMetrics(t)["cold_corrupt_reads"].(float64)
	for attempt := range 2 {
		for _, read := range []struct{ stream, offset, secret string }{
			{"corrupt/victim", OffsetAt(chunkStart), "victim-030"},
			{"corrupt/big", "-1", "big-payload"},
		} {
			resp, err := c.Read(ctx, read.stream, read.offset)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(resp.Body, &body)
			if resp.Status != http.StatusBadGateway || body.Code != "COLD_OBJECT_CORRUPT" {
				t.Fatalf("attempt %d: read of %s at %s answered %d %s, want 502 COLD_OBJECT_CORRUPT", attempt, read.stream, read.offset, resp.Status, resp.Body)
			}
			if bytes.Contains(resp.Body, []byte(read.secret)) {
				t.Fatalf("the 502 carries the damaged bytes: %s", resp.Body)
			}
		}
	}
	after := srv.NodeMetrics(t)["cold_corrupt_reads"].(float64)
	if after < before+4 {
		t.Fatalf("cold_corrupt_reads went from %v to %v, want at least 4 more", before, after)
	}
	if prom := prometheus(t, srv); !promValueAtLeast(prom, "ursula_node_cold_corrupt_reads_total", after) {
		t.Fatalf("Prometheus lacks ursula_node_cold_corrupt_reads_total >= %v:\n%s", after, grepLines(prom, "corrupt"))
	}
	if log := srv.LogTail(400); !strings.Contains(log, "cold object failed its checksum") || !strings.Contains(log, filepath.Base(chunk)) {
		t.Fatalf("the log does not name the damaged chunk %s:\n%s", filepath.Base(chunk), grepLines(log, "checksum"))
	}

	// The bytes before the damaged chunk, and another stream, read fine.
	resp, err := c.Read(ctx, "corrupt/victim", "-1")
	if err != nil || resp.Status != http.StatusOK || !bytes.HasPrefix(victim, resp.Body) || len(resp.Body) == 0 {
		t.Fatalf("read of the victim's first bytes: %v %v", resp, err)
	}
	got, _, err := c.ReadAll(ctx, "corrupt/bystander")
	if err != nil || !bytes.Equal(got, bystander) {
		t.Fatalf("bystander: %d bytes, %v (want %d)", len(got), err, len(bystander))
	}
}

// findObject returns the object file under dir, in a directory named like
// kind (c/ for chunks, x/ for external payloads), that holds marker.
func findObject(t *testing.T, dir, kind string, marker []byte) string {
	t.Helper()
	var found string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || !strings.Contains(filepath.ToSlash(p), kind) {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, marker) {
			found = p
		}
		return err
	})
	if err != nil || found == "" {
		t.Fatalf("no object under %s%s holds %q (%v)", dir, kind, marker, err)
	}
	return found
}

// chunkStartOf is the stream position a chunk object starts at (its key
// is c/{start:020}-{end:020}-{nonce}).
func chunkStartOf(t *testing.T, path string) uint64 {
	t.Helper()
	start, _, _ := strings.Cut(filepath.Base(path), "-")
	n, err := strconv.ParseUint(start, 10, 64)
	if err != nil {
		t.Fatalf("chunk file %s: %v", path, err)
	}
	return n
}

// flipAt flips one bit of the byte at delta past marker in a file.
func flipAt(t *testing.T, path string, marker []byte, delta int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, marker) + delta
	b[i] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func prometheus(t *testing.T, srv *Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL() + "/__ursula/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /__ursula/prometheus: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// promValueAtLeast reports whether a sample of metric has a value >= min.
func promValueAtLeast(text, metric string, min float64) bool {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, metric) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v >= min {
			return true
		}
	}
	return false
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
