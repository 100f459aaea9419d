package backup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// Depth is how far Verify looks.
type Depth int

const (
	// DepthManifest: the manifest is complete and well formed, and every
	// object it lists exists with the listed size.
	DepthManifest Depth = iota
	// DepthObjects: and every object's BLAKE3 digest matches.
	DepthObjects
	// DepthDeep: and every group object decodes and validates as a
	// state-machine snapshot of the manifest's cluster and group, and
	// every cold object it references is in the manifest, as referenced.
	DepthDeep
)

var depthNames = []string{"manifest", "objects", "deep"}

// ParseDepth parses "manifest", "objects" or "deep".
func ParseDepth(s string) (Depth, error) {
	for i, n := range depthNames {
		if s == n {
			return Depth(i), nil
		}
	}
	return 0, fmt.Errorf("backup: depth %q: want manifest, objects or deep", s)
}

func (d Depth) String() string {
	if d >= 0 && int(d) < len(depthNames) {
		return depthNames[d]
	}
	return fmt.Sprintf("Depth(%d)", int(d))
}

// MarshalText renders the depth by name (JSON reports).
func (d Depth) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a depth name.
func (d *Depth) UnmarshalText(b []byte) error {
	v, err := ParseDepth(string(b))
	*d = v
	return err
}

// Problem kinds.
const (
	ProblemManifest = "manifest" // the manifest itself is malformed
	ProblemMissing  = "missing"  // a listed object does not exist
	ProblemSize     = "size"     // a listed object has another size
	ProblemDigest   = "digest"   // a listed object has another BLAKE3 digest
	ProblemDecode   = "decode"   // a group object does not decode or validate
	ProblemMismatch = "mismatch" // a group object is of another cluster or group, or references an object other than listed
	ProblemUnlisted = "unlisted" // a group references a cold object the manifest does not list
	ProblemRead     = "read"     // the store failed to read an object
)

// Problem is one thing wrong with a backup.
type Problem struct {
	// Object is the key in the location of the object concerned (for
	// ProblemUnlisted, the cold key referenced).
	Object string `json:"object"`
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// maxProblems bounds the problems a report lists (ProblemCount counts
// them all).
const maxProblems = 1000

// verifyConcurrency is how many objects Verify reads at once.
const verifyConcurrency = 4

// VerifyReport is what Verify found.
type VerifyReport struct {
	ID         string    `json:"id"`
	Location   string    `json:"location"`
	Depth      Depth     `json:"depth"`
	ClusterID  string    `json:"cluster_id"`
	GroupCount uint32    `json:"group_count"`
	CreatedAt  time.Time `json:"created_at"`
	// Groups and ColdObjects are the objects checked; Bytes their size.
	Groups      int   `json:"groups"`
	ColdObjects int   `json:"cold_objects"`
	Bytes       int64 `json:"bytes"`
	// References counts the cold references the deep check walked.
	References int  `json:"references"`
	OK         bool `json:"ok"`
	// Problems lists the first maxProblems problems found.
	Problems     []Problem `json:"problems"`
	ProblemCount int       `json:"problem_count"`
}

// verifier is one Verify in progress.
type verifier struct {
	loc   *Location
	m     *Manifest
	depth Depth
	tr    *tracker
	// cold maps the manifest's cold objects by cold key.
	cold map[string]ColdObject

	mu     sync.Mutex
	report *VerifyReport
}

func (v *verifier) problem(object, kind, format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.report.ProblemCount++
	if len(v.report.Problems) < maxProblems {
		v.report.Problems = append(v.report.Problems, Problem{Object: object, Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
}

// Verify checks backup id (the latest complete one for "") to depth
// without touching any cluster. The report lists every problem found; the
// error wraps ErrCorrupt and names the first bad object when there is
// one, ErrPrecondition for a backup of another format version, and
// ErrNotFound when there is no such backup.
func Verify(ctx context.Context, loc *Location, id string, depth Depth, progress func(Progress)) (*VerifyReport, error) {
	if depth < DepthManifest || depth > DepthDeep {
		return nil, fmt.Errorf("backup: unknown depth %d", depth)
	}
	m, err := manifestOf(ctx, loc, id)
	if err != nil {
		return nil, err
	}
	tr := newTracker(progress, time.Now())
	tr.update(func(p *Progress) { p.Phase, p.Groups = PhaseManifest, int(m.GroupCount) })
	v := &verifier{loc: loc, m: m, depth: depth, tr: tr, cold: make(map[string]ColdObject, len(m.ColdObjects)), report: &VerifyReport{
		ID: m.ID, Location: loc.String(), Depth: depth, ClusterID: m.ClusterID, GroupCount: m.GroupCount, CreatedAt: m.CreatedAt,
		Problems: []Problem{},
	}}
	if err := m.checkVersion(); err != nil {
		v.problem(manifestKey(m.ID), ProblemManifest, "%v", err)
		return v.report, err
	}
	for _, p := range m.problems() {
		v.problem(p.Object, p.Kind, "%s", p.Detail)
	}
	for _, c := range m.ColdObjects {
		if backupfmt.ValidDigest(c.BLAKE3) {
			v.cold[c.Key] = c
		}
	}

	phase := PhaseManifest
	if depth >= DepthObjects {
		phase = PhaseObjects
	}
	tr.update(func(p *Progress) {
		p.Phase = phase
		p.TotalObjects = int64(len(m.Groups) + len(m.ColdObjects))
		for _, g := range m.Groups {
			p.TotalBytes += g.Size
		}
		for _, c := range m.ColdObjects {
			p.TotalBytes += c.Size
		}
	})
	if err := v.coldObjects(ctx); err != nil {
		return nil, err
	}
	if depth == DepthDeep {
		tr.update(func(p *Progress) { p.Phase = PhaseDeep })
	}
	if err := v.groups(ctx); err != nil {
		return nil, err
	}
	tr.update(func(p *Progress) { p.Phase = PhaseDone })
	r := v.report
	r.OK = r.ProblemCount == 0
	if !r.OK {
		first := r.Problems[0]
		more := ""
		if r.ProblemCount > 1 {
			more = fmt.Sprintf(" (and %d more problems)", r.ProblemCount-1)
		}
		return r, fmt.Errorf("%w: backup %s: %s: %s%s", ErrCorrupt, m.ID, first.Object, first.Detail, more)
	}
	return r, nil
}

// parallel runs fn for 0..n-1, workers at a time, and returns the first
// error, which stops the rest.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// fetch reads (or, at DepthManifest, heads) a listed object and checks its
// size and digest. It returns the body when it read one and it checks
// out; a problem is recorded, not returned: only a failure of the caller's
// context is an error.
func (v *verifier) fetch(ctx context.Context, key string, size int64, digest, what string, read bool) ([]byte, bool, error) {
	defer v.tr.update(func(p *Progress) {
		p.Objects++
		p.Bytes += size
	})
	var (
		body []byte
		n    int64
		err  error
	)
	if read {
		body, err = v.loc.store.Get(ctx, key)
		n = int64(len(body))
	} else {
		var info objstore.Info
		info, err = v.loc.store.Head(ctx, key)
		n = info.Size
	}
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		v.problem(key, ProblemMissing, "%s is missing", what)
		return nil, false, nil
	case err != nil:
		if ctx.Err() != nil {
			return nil, false, context.Cause(ctx)
		}
		v.problem(key, ProblemRead, "%s: %v", what, err)
		return nil, false, nil
	case n != size:
		v.problem(key, ProblemSize, "%s has %d bytes, the manifest says %d", what, n, size)
		return nil, false, nil
	}
	if read {
		if d := backupfmt.Digest(body); d != digest {
			v.problem(key, ProblemDigest, "%s has BLAKE3 %s, the manifest says %s", what, d, digest)
			return nil, false, nil
		}
	}
	v.mu.Lock()
	v.report.Bytes += size
	v.mu.Unlock()
	return body, true, nil
}

func (v *verifier) coldObjects(ctx context.Context) error {
	objs := v.m.ColdObjects
	return parallel(ctx, len(objs), verifyConcurrency, func(ctx context.Context, i int) error {
		c := objs[i]
		if !backupfmt.ValidDigest(c.BLAKE3) || c.Object != objectKey(c.BLAKE3) {
			return nil // a manifest problem already
		}
		_, ok, err := v.fetch(ctx, c.Object, c.Size, c.BLAKE3, "cold object "+c.Key, v.depth >= DepthObjects)
		if ok {
			v.mu.Lock()
			v.report.ColdObjects++
			v.mu.Unlock()
		}
		return err
	})
}

func (v *verifier) groups(ctx context.Context) error {
	gs := v.m.Groups
	return parallel(ctx, len(gs), verifyConcurrency, func(ctx context.Context, i int) error {
		g := gs[i]
		if g.Object != groupKey(v.m.ID, int(g.Group)) || !backupfmt.ValidDigest(g.BLAKE3) {
			return nil // a manifest problem already
		}
		body, ok, err := v.fetch(ctx, g.Object, g.Size, g.BLAKE3, fmt.Sprintf("group %d's object", g.Group), v.depth >= DepthObjects)
		if err != nil || !ok {
			return err
		}
		if v.depth == DepthDeep {
			if err := v.deep(ctx, g, body); err != nil {
				return err
			}
		}
		v.mu.Lock()
		v.report.Groups++
		v.mu.Unlock()
		v.tr.update(func(p *Progress) { p.GroupsDone++ })
		return nil
	})
}

// deep decodes a group object and walks its references, reading index
// pages from the backup's own objects.
func (v *verifier) deep(ctx context.Context, g GroupEntry, body []byte) error {
	gobj, snap, err := backupfmt.DecodeGroup(body)
	if err != nil {
		v.problem(g.Object, ProblemDecode, "group %d: %v", g.Group, err)
		return nil
	}
	if gobj.GetClusterId() != v.m.ClusterID || gobj.GetGroup() != g.Group || gobj.GetGroupCount() != v.m.GroupCount {
		v.problem(g.Object, ProblemMismatch, "holds group %d of %d of cluster %q, the manifest says group %d of %d of %q",
			gobj.GetGroup(), gobj.GetGroupCount(), gobj.GetClusterId(), g.Group, v.m.GroupCount, v.m.ClusterID)
	}
	readPage := func(ctx context.Context, ref *storagev1.ColdRef) ([]byte, error) {
		c, ok := v.cold[ref.GetKey()]
		if !ok {
			return nil, fmt.Errorf("not listed in the manifest")
		}
		return v.loc.store.Get(ctx, c.Object)
	}
	refs := 0
	err = backupfmt.Walk(ctx, snap, readPage, func(r backupfmt.Ref) error {
		refs++
		c, ok := v.cold[r.Key]
		switch {
		case !ok:
			v.problem(r.Key, ProblemUnlisted, "group %d references cold object %s, which the manifest does not list", g.Group, r.Key)
		case r.Size != 0 && c.Size != int64(r.Size) || c.Check != r.Check:
			v.problem(c.Object, ProblemMismatch, "group %d references cold object %s of %d bytes and check %q, the manifest lists %d bytes and %q",
				g.Group, r.Key, r.Size, r.Check, c.Size, c.Check)
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		v.problem(g.Object, ProblemDecode, "group %d: walk its cold references: %v", g.Group, err)
	}
	v.mu.Lock()
	v.report.References += refs
	v.mu.Unlock()
	return nil
}
