package backup

import (
	"sync"
	"time"
)

// Phases a Progress reports.
const (
	PhaseInfo      = "info"       // asking the nodes about the cluster
	PhaseGroups    = "groups"     // Create: exporting groups and copying their cold objects
	PhaseManifest  = "manifest"   // Create: writing the manifest; Verify: checking it
	PhaseObjects   = "objects"    // Verify: reading every object
	PhaseDeep      = "deep"       // Verify: decoding every group and walking its references
	PhaseCopy      = "copy"       // Restore: copying cold objects into the target cold store
	PhaseColdCheck = "cold-check" // Restore: asking the cluster for missing cold objects
	PhaseImport    = "import"     // Restore: importing the groups
	PhaseDone      = "done"
)

// Progress is a snapshot of a running operation. Totals of objects and
// bytes grow while Create walks the groups (it learns the objects as it
// goes); Groups is known from the start.
type Progress struct {
	Phase      string `json:"phase"`
	GroupsDone int    `json:"groups_done"`
	Groups     int    `json:"groups"`
	// Objects and Bytes are the cold objects (and, for Verify, group
	// objects) handled so far, of TotalObjects and TotalBytes known.
	Objects      int64 `json:"objects"`
	TotalObjects int64 `json:"total_objects"`
	Bytes        int64 `json:"bytes"`
	TotalBytes   int64 `json:"total_bytes"`
	// CopiedObjects and CopiedBytes were written (into the location by
	// Create, into the target cold store by Restore); ReusedObjects were
	// already there (Restore: skipped).
	CopiedObjects int64     `json:"copied_objects"`
	CopiedBytes   int64     `json:"copied_bytes"`
	ReusedObjects int64     `json:"reused_objects"`
	Started       time.Time `json:"started"`
}

// Rate is the bytes handled per second since Started.
func (p Progress) Rate(now time.Time) float64 {
	s := now.Sub(p.Started).Seconds()
	if s <= 0 {
		return 0
	}
	return float64(p.Bytes) / s
}

// ETA estimates the time left from the rate so far and the bytes known;
// 0 when nothing can be said yet.
func (p Progress) ETA(now time.Time) time.Duration {
	r := p.Rate(now)
	if r <= 0 || p.TotalBytes <= p.Bytes {
		return 0
	}
	return time.Duration(float64(p.TotalBytes-p.Bytes) / r * float64(time.Second))
}

// tracker serializes progress updates and the caller's callback, which is
// therefore called from one goroutine at a time.
type tracker struct {
	mu sync.Mutex
	p  Progress
	fn func(Progress)
}

func newTracker(fn func(Progress), started time.Time) *tracker {
	return &tracker{fn: fn, p: Progress{Started: started}}
}

func (t *tracker) update(f func(p *Progress)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&t.p)
	if t.fn != nil {
		t.fn(t.p)
	}
}
