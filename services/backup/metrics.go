package backup

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula/ursula/services/platform/telemetry"
)

// metrics are the service's counters and its last run. The JSON document
// (GET /__ursula/metrics) and the OpenTelemetry source read the same
// snapshot, so nothing is counted twice.
type metrics struct {
	backups       atomic.Uint64
	failures      atomic.Uint64
	inProgress    atomic.Int64
	prunes        atomic.Uint64
	pruneFailures atomic.Uint64
	pruned        atomic.Uint64

	mu          sync.Mutex
	lastSuccess time.Time
	lastFailure time.Time
	lastError   string
	lastDur     time.Duration
	last        ManifestTotal
	nextRun     time.Time
}

// document describes the metrics document's values as instruments
// (ursula.backup.<name>).
var document = telemetry.Document{Metrics: map[string]telemetry.Metric{
	"backups":                   {Kind: telemetry.Counter, Unit: "{backup}", Help: "Backups completed."},
	"failures":                  {Kind: telemetry.Counter, Unit: "{backup}", Help: "Backups that failed."},
	"in_progress":               {Unit: "{backup}", Help: "Backups running now."},
	"prunes":                    {Kind: telemetry.Counter, Unit: "{prune}", Help: "Prune runs completed."},
	"prune_failures":            {Kind: telemetry.Counter, Unit: "{prune}", Help: "Prune runs that failed."},
	"pruned_backups":            {Kind: telemetry.Counter, Unit: "{backup}", Help: "Backups deleted by pruning."},
	"last_success_unix_seconds": {Unit: "s", Help: "When the last backup succeeded (Unix time; 0: never)."},
	"last_failure_unix_seconds": {Unit: "s", Help: "When the last backup failed (Unix time; 0: never)."},
	"last_duration_seconds":     {Unit: "s", Help: "How long the last backup took."},
	"last_groups":               {Unit: "{group}", Help: "Raft groups in the last backup."},
	"last_objects":              {Unit: "{object}", Help: "Cold objects in the last backup."},
	"last_bytes":                {Unit: "By", Help: "Bytes in the last backup."},
	"last_copied_objects":       {Unit: "{object}", Help: "Objects the last backup copied."},
	"last_copied_bytes":         {Unit: "By", Help: "Bytes the last backup copied."},
	"last_reused_objects":       {Unit: "{object}", Help: "Objects the last backup reused from earlier ones."},
	"last_reused_bytes":         {Unit: "By", Help: "Bytes the last backup reused from earlier ones."},
	"next_run_unix_seconds":     {Unit: "s", Help: "When the next scheduled backup runs (Unix time; 0: none)."},
}}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixMilli()) / 1e3
}

// snapshot is the metrics document: numbers (and last_error, a string the
// telemetry source skips).
func (m *metrics) snapshot() map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[string]any{
		"backups":                   float64(m.backups.Load()),
		"failures":                  float64(m.failures.Load()),
		"in_progress":               float64(m.inProgress.Load()),
		"prunes":                    float64(m.prunes.Load()),
		"prune_failures":            float64(m.pruneFailures.Load()),
		"pruned_backups":            float64(m.pruned.Load()),
		"last_success_unix_seconds": unixSeconds(m.lastSuccess),
		"last_failure_unix_seconds": unixSeconds(m.lastFailure),
		"last_duration_seconds":     m.lastDur.Seconds(),
		"last_groups":               float64(m.last.Groups),
		"last_objects":              float64(m.last.ColdObjects),
		"last_bytes":                float64(m.last.ColdBytes + m.last.GroupBytes),
		"last_copied_objects":       float64(m.last.CopiedObjects),
		"last_copied_bytes":         float64(m.last.CopiedBytes),
		"last_reused_objects":       float64(m.last.ReusedObjects),
		"last_reused_bytes":         float64(m.last.ReusedBytes),
		"next_run_unix_seconds":     unixSeconds(m.nextRun),
		"last_error":                m.lastError,
	}
}

// MetricsSource reads the metrics document as telemetry samples
// (instruments ursula.backup.<key> when registered as "backup").
func (s *Service) MetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) { document.Emit(s.metrics.snapshot(), emit) }
}
