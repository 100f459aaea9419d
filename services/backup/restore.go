package backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// maxMissingKeys bounds the missing keys an ErrMissingCold message and
// the report name.
const maxMissingKeys = 20

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// ColdStore is the target cluster's cold store, which the backup's
	// cold objects are copied into; nil opens the one the nodes report
	// (BackupInfo.cold_store and cold_endpoint).
	ColdStore *Location
	// Concurrency bounds the objects copied and the groups checked and
	// imported at once; default DefaultConcurrency.
	Concurrency int
	// Progress, when set, is called (from one goroutine at a time) as the
	// restore advances.
	Progress func(Progress)
	// Logger logs retries and each group imported; default none.
	Logger *slog.Logger

	// backoff replaces the retry pauses (tests).
	backoff func(attempt int) time.Duration
}

// RestoreReport is what Restore did.
type RestoreReport struct {
	ID         string `json:"id"`
	Location   string `json:"location"`
	ClusterID  string `json:"cluster_id"`
	GroupCount uint32 `json:"group_count"`
	ColdStore  string `json:"cold_store"`
	// ObjectsCopied and BytesCopied went into the target cold store;
	// ObjectsSkipped and BytesSkipped were there already, same size.
	ObjectsCopied  int64 `json:"objects_copied"`
	BytesCopied    int64 `json:"bytes_copied"`
	ObjectsSkipped int64 `json:"objects_skipped"`
	BytesSkipped   int64 `json:"bytes_skipped"`
	// ColdChecked sums the distinct references the nodes checked;
	// ColdMissing the ones they did not find, the first of which
	// MissingKeys names.
	ColdChecked uint64   `json:"cold_checked"`
	ColdMissing uint64   `json:"cold_missing"`
	MissingKeys []string `json:"missing_keys,omitempty"`
	// Imported groups took the backup now; Already had taken it before
	// (an interrupted restore run again).
	Imported int           `json:"imported"`
	Already  int           `json:"already"`
	Streams  uint64        `json:"streams"`
	Groups   []GroupImport `json:"groups"`
	Started  time.Time     `json:"started"`
	Finished time.Time     `json:"finished"`
}

// GroupImport is one group's import.
type GroupImport struct {
	Group   uint32 `json:"group"`
	NodeID  uint64 `json:"node_id"`
	Index   uint64 `json:"index"`
	Streams uint64 `json:"streams"`
	Already bool   `json:"already"`
}

// Restore restores backup id (the latest complete one for "") into the
// cluster of nodes, which must be of the backup's cluster id and group
// count and whose groups must be empty (doc.go describes the steps). It
// checks everything it can before the first import: every node answers
// and fits the backup, the backup's objects check out as they are copied,
// and the cluster finds every cold object a group references. A restore
// that stopped (a timeout, a leader change, a crash) can run again: groups
// imported before answer already. The report is returned with the error
// too, with what was done until then.
func Restore(ctx context.Context, nodes []backupv1.BackupServiceClient, loc *Location, id string, opts RestoreOptions) (*RestoreReport, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := manifestOf(ctx, loc, id)
	if err != nil {
		return nil, err
	}
	r := &restorer{loc: loc, m: m, opts: opts, log: opts.Logger.With("backup_id", m.ID, "location", loc.String()), report: &RestoreReport{
		ID: m.ID, Location: loc.String(), ClusterID: m.ClusterID, GroupCount: m.GroupCount, Groups: []GroupImport{},
		Started: time.Now().UTC(),
	}}
	r.tr = newTracker(opts.Progress, r.report.Started)
	err = r.run(ctx, nodes)
	r.report.Finished = time.Now().UTC()
	slices.SortFunc(r.report.Groups, func(a, b GroupImport) int { return int(a.Group) - int(b.Group) })
	if err == nil {
		r.tr.update(func(p *Progress) { p.Phase = PhaseDone })
	}
	return r.report, err
}

// restorer is one Restore in progress.
type restorer struct {
	loc  *Location
	m    *Manifest
	opts RestoreOptions
	log  *slog.Logger
	tr   *tracker
	cl   *cluster
	cold objstore.Store

	mu     sync.Mutex
	report *RestoreReport
	// refusals are the groups whose cold check said they would refuse
	// the import (they hold data).
	refusals []string
}

func (r *restorer) run(ctx context.Context, nodes []backupv1.BackupServiceClient) error {
	m := r.m
	if err := m.validate(); err != nil {
		return err
	}
	r.tr.update(func(p *Progress) { p.Phase, p.Groups = PhaseInfo, int(m.GroupCount) })
	cl, err := discover(ctx, nodes, true, r.log)
	if err != nil {
		return err
	}
	if r.opts.backoff != nil {
		cl.backoff = r.opts.backoff
	}
	r.cl = cl
	switch {
	case cl.clusterID != m.ClusterID:
		return fmt.Errorf("%w: backup %s is of cluster %q, the nodes are of %q (give the target cluster the source's cluster id before its first start)",
			ErrPrecondition, m.ID, m.ClusterID, cl.clusterID)
	case cl.groupCount != m.GroupCount:
		return fmt.Errorf("%w: backup %s has %d groups, the cluster %d", ErrPrecondition, m.ID, m.GroupCount, cl.groupCount)
	}
	if limit := cl.maxImport; limit > 0 {
		for _, g := range m.Groups {
			if uint64(g.Size) > limit {
				return fmt.Errorf("%w: group %d's object is %d bytes, above the largest import the target nodes accept (%d bytes): raise their server.max_message_bytes",
					ErrPrecondition, g.Group, g.Size, limit)
			}
		}
	}
	if err := r.openColdStore(ctx); err != nil {
		return err
	}
	if err := r.copyCold(ctx); err != nil {
		return err
	}
	if err := r.coldCheck(ctx); err != nil {
		return err
	}
	return r.importGroups(ctx)
}

// openColdStore opens the target cluster's cold store: explicit, or the
// one the nodes report. A backup without cold objects needs none.
func (r *restorer) openColdStore(ctx context.Context) error {
	if r.opts.ColdStore != nil {
		r.cold, r.report.ColdStore = r.opts.ColdStore.store, r.opts.ColdStore.String()
		return nil
	}
	spec, endpoint, ok, err := r.cl.coldStore()
	switch {
	case err != nil:
		return err
	case !ok && len(r.m.ColdObjects) > 0:
		return fmt.Errorf("%w: backup %s references %d cold objects and the cluster reports no cold store", ErrPrecondition, r.m.ID, len(r.m.ColdObjects))
	case !ok:
		return nil
	}
	l, err := openReported(ctx, spec, endpoint)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	r.cold, r.report.ColdStore = l.store, l.String()
	return nil
}

// copyCold copies the backup's cold objects into the target cold store,
// verifying each as it is read, and skipping keys the store holds with
// the same size.
func (r *restorer) copyCold(ctx context.Context) error {
	objs := r.m.ColdObjects
	r.tr.update(func(p *Progress) {
		p.Phase = PhaseCopy
		p.TotalObjects = int64(len(objs))
		for _, o := range objs {
			p.TotalBytes += o.Size
		}
	})
	return parallel(ctx, len(objs), r.opts.Concurrency, func(ctx context.Context, i int) error {
		o := objs[i]
		copied, err := r.copyObject(ctx, o)
		if err != nil {
			return err
		}
		r.mu.Lock()
		if copied {
			r.report.ObjectsCopied++
			r.report.BytesCopied += o.Size
		} else {
			r.report.ObjectsSkipped++
			r.report.BytesSkipped += o.Size
		}
		r.mu.Unlock()
		r.tr.update(func(p *Progress) {
			p.Objects++
			p.Bytes += o.Size
			if copied {
				p.CopiedObjects++
				p.CopiedBytes += o.Size
			} else {
				p.ReusedObjects++
			}
		})
		return nil
	})
}

func (r *restorer) copyObject(ctx context.Context, o ColdObject) (bool, error) {
	info, err := r.cold.Head(ctx, o.Key)
	switch {
	case err == nil && info.Size == o.Size:
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%w: the target cold store holds %s with %d bytes, the backup's object %d", ErrPrecondition, o.Key, info.Size, o.Size)
	case !errors.Is(err, objstore.ErrNotFound):
		return false, fmt.Errorf("read the target cold store: %w", err)
	}
	body, err := r.read(ctx, o.Object, o.Size, o.BLAKE3, "cold object "+o.Key)
	if err != nil {
		return false, err
	}
	created, err := r.cold.PutIfAbsent(ctx, o.Key, body)
	if err != nil {
		return false, fmt.Errorf("copy cold object %s: %w", o.Key, err)
	}
	return created, nil
}

// read reads an object of the backup and checks its size and digest.
func (r *restorer) read(ctx context.Context, key string, size int64, digest, what string) ([]byte, error) {
	body, err := r.loc.store.Get(ctx, key)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s (%s) is missing from %s", ErrCorrupt, key, what, r.loc)
	}
	if err != nil {
		return nil, fmt.Errorf("read the backup: %w", err)
	}
	if int64(len(body)) != size {
		return nil, fmt.Errorf("%w: %s (%s) has %d bytes, the manifest says %d", ErrCorrupt, key, what, len(body), size)
	}
	if d := backupfmt.Digest(body); d != digest {
		return nil, fmt.Errorf("%w: %s (%s) has BLAKE3 %s, the manifest says %s", ErrCorrupt, key, what, d, digest)
	}
	return body, nil
}

// groupObject reads group g's object, checks it against the manifest and
// decodes it.
func (r *restorer) groupObject(ctx context.Context, g GroupEntry) ([]byte, error) {
	body, err := r.read(ctx, g.Object, g.Size, g.BLAKE3, fmt.Sprintf("group %d's object", g.Group))
	if err != nil {
		return nil, err
	}
	gobj, _, err := backupfmt.DecodeGroup(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, g.Object, err)
	}
	if gobj.GetClusterId() != r.m.ClusterID || gobj.GetGroup() != g.Group || gobj.GetGroupCount() != r.m.GroupCount {
		return nil, fmt.Errorf("%w: %s holds group %d of %d of cluster %q, the manifest says group %d of %d of %q",
			ErrCorrupt, g.Object, gobj.GetGroup(), gobj.GetGroupCount(), gobj.GetClusterId(), g.Group, r.m.GroupCount, r.m.ClusterID)
	}
	return body, nil
}

// coldCheck asks the cluster, group by group, for the cold objects its
// cold store lacks: any missing stops the restore before the first
// import.
func (r *restorer) coldCheck(ctx context.Context) error {
	r.tr.update(func(p *Progress) { p.Phase = PhaseColdCheck })
	gs := r.m.Groups
	err := parallel(ctx, len(gs), r.opts.Concurrency, func(ctx context.Context, i int) error {
		g := gs[i]
		body, err := r.groupObject(ctx, g)
		if err != nil {
			return err
		}
		var resp *backupv1.ColdCheckResponse
		err = r.cl.onAny(ctx, g.Group, func(ctx context.Context, n *node) error {
			var err error
			resp, err = n.client.ColdCheck(ctx, &backupv1.ColdCheckRequest{Group: g.Group, Object: body})
			return err
		})
		if err != nil {
			return fmt.Errorf("group %d: cold check: %w", g.Group, err)
		}
		r.mu.Lock()
		if why := resp.GetImportRefusal(); why != "" {
			r.refusals = append(r.refusals, fmt.Sprintf("group %d: %s", g.Group, why))
		}
		r.report.ColdChecked += resp.GetChecked()
		r.report.ColdMissing += resp.GetMissing()
		for _, k := range resp.GetFirstMissing() {
			if len(r.report.MissingKeys) < maxMissingKeys {
				r.report.MissingKeys = append(r.report.MissingKeys, k)
			}
		}
		r.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	if n := len(r.refusals); n > 0 {
		slices.Sort(r.refusals)
		first := r.refusals[:min(n, 3)]
		return fmt.Errorf("%w: %d groups of the target cluster hold data (a restore needs a fresh, empty cluster); nothing was imported; first: %s",
			ErrPrecondition, n, strings.Join(first, "; "))
	}
	if n := r.report.ColdMissing; n > 0 {
		return fmt.Errorf("%w: the target cluster's cold store (%s) lacks %d objects the backup's groups reference; nothing was imported; first: %s",
			ErrMissingCold, r.report.ColdStore, n, strings.Join(r.report.MissingKeys, ", "))
	}
	return nil
}

// importGroups imports every group on its leader. The first refusal stops
// the restore (groups imported until then stay imported; run it again).
func (r *restorer) importGroups(ctx context.Context) error {
	r.tr.update(func(p *Progress) { p.Phase = PhaseImport })
	gs := r.m.Groups
	return parallel(ctx, len(gs), r.opts.Concurrency, func(ctx context.Context, i int) error {
		g := gs[i]
		body, err := r.groupObject(ctx, g)
		if err != nil {
			return err
		}
		var (
			resp *backupv1.ImportGroupResponse
			on   *node
		)
		err = r.cl.onLeader(ctx, g.Group, func(ctx context.Context, n *node) error {
			var err error
			resp, err = n.client.ImportGroup(ctx, &backupv1.ImportGroupRequest{Group: g.Group, Object: body, Blake3: g.BLAKE3})
			on = n
			return err
		})
		if err != nil {
			switch a, _ := classify(err); a {
			case answerConflict:
				return fmt.Errorf("%w: group %d refused the import (a restore needs a fresh, empty cluster): %w", ErrPrecondition, g.Group, err)
			case answerInvalid:
				return fmt.Errorf("%w: %s: the cluster refused group %d's object: %w", ErrCorrupt, g.Object, g.Group, err)
			}
			return fmt.Errorf("group %d: import: %w", g.Group, err)
		}
		gi := GroupImport{Group: g.Group, NodeID: on.info.GetNodeId(), Index: resp.GetIndex(), Streams: resp.GetStreams(), Already: resp.GetAlready()}
		r.mu.Lock()
		r.report.Groups = append(r.report.Groups, gi)
		if gi.Already {
			r.report.Already++
		} else {
			r.report.Imported++
			r.report.Streams += gi.Streams
		}
		r.mu.Unlock()
		r.log.Info("group restored", "group_id", g.Group, "node_id", gi.NodeID, "index", gi.Index, "streams", gi.Streams, "already", gi.Already)
		r.tr.update(func(p *Progress) { p.GroupsDone++ })
		return nil
	})
}
