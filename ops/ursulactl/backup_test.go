package ursulactl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/services/backup"
)

// TestBackupProgressLines: without a terminal, a backup of many groups
// prints a line per phase and per tenth of the groups, not one per group.
func TestBackupProgressLines(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	p := &backupProgress{out: &out, verb: "backup", bar: &progress{}, now: func() time.Time { return now }}
	started := now
	p.update(backup.Progress{Phase: backup.PhaseInfo, Started: started})
	for done := 0; done <= 640; done++ {
		p.update(backup.Progress{Phase: backup.PhaseGroups, Groups: 640, GroupsDone: done, Bytes: int64(done) << 20, TotalBytes: 640 << 20, Started: started})
	}
	p.update(backup.Progress{Phase: backup.PhaseDone, Groups: 640, GroupsDone: 640, Started: started})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) > 14 || len(lines) < 12 {
		t.Fatalf("%d lines for 640 groups:\n%s", len(lines), out.String())
	}
	// Five seconds without a tenth still print a line.
	now = now.Add(6 * time.Second)
	p.update(backup.Progress{Phase: backup.PhaseDone, Groups: 640, GroupsDone: 640, Started: started})
	if got := strings.Count(out.String(), "\n"); got != len(lines)+1 {
		t.Fatalf("no line after 6 s: %d lines", got)
	}
	if !strings.Contains(lines[5], "groups ") || !strings.Contains(lines[5], "MiB") {
		t.Fatalf("a progress line without its counts: %q", lines[5])
	}
}

func TestDescribeProgressRateAndETA(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	got := describeProgress(backup.Progress{Phase: "copy", Objects: 10, TotalObjects: 40, Bytes: 100 << 20, TotalBytes: 400 << 20, Started: start}, start.Add(10*time.Second))
	for _, want := range []string{"copy", "objects 10/40", "100.0 MiB/400.0 MiB", "10.0 MiB/s", "ETA 30s"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
