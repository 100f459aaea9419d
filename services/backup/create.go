package backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// Defaults of CreateOptions and RestoreOptions.
const (
	DefaultHoldTTL     = 10 * time.Minute
	DefaultConcurrency = 4
	DefaultCallTimeout = 2 * time.Minute
)

// IDFormat is the layout of the default backup id (UTC).
const IDFormat = "20060102T150405Z"

// CreateOptions configure Create.
type CreateOptions struct {
	// ID names the backup; default the UTC start time in IDFormat.
	ID string
	// HoldTTL is how long each group's hold on the cold GC lasts without
	// a renewal (it is renewed every third of it while the group's
	// objects are copied); default DefaultHoldTTL.
	HoldTTL time.Duration
	// Concurrency bounds the groups exported at once and, separately, the
	// cold objects copied at once; default DefaultConcurrency.
	Concurrency int
	// Progress, when set, is called (from one goroutine at a time) as the
	// backup advances.
	Progress func(Progress)
	// Logger logs retries, renewals and skipped nodes; default none.
	Logger *slog.Logger
	// Now is the clock of ids, times in the manifest and the lock;
	// default time.Now.
	Now func() time.Time
	// SourceColdStore is the source cluster's cold store; nil opens the
	// one the nodes report (BackupInfo.cold_store and cold_endpoint).
	SourceColdStore *Location
	// CallTimeout bounds a group's hold (including its retries on other
	// nodes) and each node's export; default DefaultCallTimeout.
	CallTimeout time.Duration

	// backoff replaces the retry pauses (tests).
	backoff func(attempt int) time.Duration
}

func (o CreateOptions) withDefaults() CreateOptions {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ID == "" {
		o.ID = o.Now().UTC().Format(IDFormat)
	}
	if o.HoldTTL <= 0 {
		o.HoldTTL = DefaultHoldTTL
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	return o
}

// Create backs the cluster up into loc (doc.go describes the steps) and
// returns the manifest it wrote last. A failure writes no manifest, so
// the incomplete backup stays invisible; Prune removes what it left.
func Create(ctx context.Context, nodes []backupv1.BackupServiceClient, loc *Location, opts CreateOptions) (*Manifest, error) {
	opts = opts.withDefaults()
	if err := validID(opts.ID); err != nil {
		return nil, err
	}
	log := opts.Logger.With("backup_id", opts.ID, "location", loc.String())
	started := opts.Now().UTC()
	tr := newTracker(opts.Progress, started)
	tr.update(func(p *Progress) { p.Phase = PhaseInfo })

	cl, err := discover(ctx, nodes, false, log)
	if err != nil {
		return nil, err
	}
	if opts.backoff != nil {
		cl.backoff = opts.backoff
	}
	if _, err := loc.store.Head(ctx, manifestKey(opts.ID)); err == nil {
		return nil, fmt.Errorf("%w: %s already holds a complete backup %q", ErrPrecondition, loc, opts.ID)
	} else if !errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("read %s: %w", loc, err)
	}
	src, srcName, srcErr := sourceStore(ctx, cl, opts.SourceColdStore)
	if errors.Is(srcErr, ErrPrecondition) {
		return nil, srcErr
	}

	ctx, lk, unlock, err := holdLock(ctx, loc, opts.ID, opts.Now, log)
	if err != nil {
		return nil, err
	}
	defer unlock()

	c := &creator{
		id: opts.ID, loc: loc, cl: cl, src: src, srcErr: srcErr, opts: opts, log: log, tr: tr,
		sem: make(chan struct{}, opts.Concurrency), objects: map[string]*ColdObject{},
	}
	if c.prior, err = priorObjects(ctx, loc, log); err != nil {
		return nil, err
	}
	log.Info("backup started", "cluster_id", cl.clusterID, "groups", cl.groupCount, "nodes", len(cl.nodes),
		"source_cold_store", srcName, "known_objects", len(c.prior))
	tr.update(func(p *Progress) { p.Phase, p.Groups = PhaseGroups, int(cl.groupCount) })

	groups, err := c.groups(ctx)
	if err == nil {
		err = lk.check()
	}
	if err == nil {
		// Proves the lock still ours right before the manifest.
		err = lk.renew(ctx)
	}
	if err != nil {
		c.discard(ctx)
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return nil, err
	}

	tr.update(func(p *Progress) { p.Phase = PhaseManifest })
	m := c.manifest(groups, srcName, started)
	body, err := encodeManifest(m)
	if err != nil {
		return nil, err
	}
	if created, err := loc.store.PutIfAbsent(ctx, manifestKey(m.ID), body); err != nil || !created {
		c.discard(ctx)
		if err == nil {
			err = fmt.Errorf("%w: %s: backup %q completed meanwhile", ErrPrecondition, loc, m.ID)
		}
		return nil, fmt.Errorf("write the manifest: %w", err)
	}
	tr.update(func(p *Progress) { p.Phase = PhaseDone })
	log.Info("backup complete", "groups", m.Totals.Groups, "cold_objects", m.Totals.ColdObjects,
		"copied_objects", m.Totals.CopiedObjects, "copied_bytes", m.Totals.CopiedBytes,
		"reused_objects", m.Totals.ReusedObjects, "duration", m.CompletedAt.Sub(m.CreatedAt).String())
	return m, nil
}

// sourceStore opens the source cluster's cold store: explicit, or the one
// the nodes report. Without one it returns a nil store and the reason,
// which fails the backup only if a group references a cold object.
func sourceStore(ctx context.Context, cl *cluster, explicit *Location) (objstore.Store, string, error) {
	if explicit != nil {
		return explicit.store, explicit.String(), nil
	}
	spec, endpoint, ok, err := cl.coldStore()
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return nil, "", errors.New("the nodes report no cold store")
	}
	l, err := openReported(ctx, spec, endpoint)
	if err != nil {
		return nil, spec, err
	}
	return l.store, l.String(), nil
}

// openReported opens a cold store a node reported. A directory must exist
// here already: a node's directory on another host is not this one's.
func openReported(ctx context.Context, spec, endpoint string) (*Location, error) {
	if !strings.Contains(spec, "://") {
		if fi, err := os.Stat(spec); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("the nodes' cold store %s is not a directory on this host (name the cold store explicitly)", spec)
		}
	}
	if endpoint == "" {
		return OpenLocation(ctx, spec)
	}
	return openLocation(ctx, spec, endpoint)
}

// priorObjects maps the cold objects the location's complete backups hold
// by the reference they were copied for. A manifest that does not decode
// is skipped: its objects are only copied again.
func priorObjects(ctx context.Context, loc *Location, log *slog.Logger) (map[refKey]ColdObject, error) {
	ids, complete, err := loc.backupIDs(ctx)
	if err != nil {
		return nil, err
	}
	prior := map[refKey]ColdObject{}
	for _, id := range ids {
		if !complete[id] {
			continue
		}
		m, err := loc.readManifest(ctx, id)
		if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) {
			log.Warn("earlier backup skipped for reuse", "earlier_id", id, "err", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, o := range m.ColdObjects {
			if backupfmt.ValidDigest(o.BLAKE3) {
				prior[refKey{o.Key, o.Check}] = o
			}
		}
	}
	return prior, nil
}

// creator is one Create in progress.
type creator struct {
	id     string
	loc    *Location
	cl     *cluster
	src    objstore.Store
	srcErr error
	prior  map[refKey]ColdObject
	opts   CreateOptions
	log    *slog.Logger
	tr     *tracker
	// sem bounds the cold objects copied at once, over all groups.
	sem chan struct{}

	mu      sync.Mutex
	objects map[string]*ColdObject // by cold key; nil value: in flight
	present map[string]bool        // digests known to be in objects/
	totals  ManifestTotal
}

// groups backs up every group, Concurrency at a time; the first failure
// stops the others.
func (c *creator) groups(ctx context.Context) ([]GroupEntry, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	n := int(c.cl.groupCount)
	out := make([]GroupEntry, n)
	next := make(chan uint32)
	var wg sync.WaitGroup
	for range min(c.opts.Concurrency, n) {
		wg.Go(func() {
			for g := range next {
				e, err := c.group(ctx, g)
				if err != nil {
					cancel(err)
					continue
				}
				out[g] = e
				c.tr.update(func(p *Progress) { p.GroupsDone++ })
			}
		})
	}
feed:
	for g := range uint32(n) {
		select {
		case next <- g:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// hold asks the group's leader to hold (ttl > 0) or release (0) the cold
// GC for this backup, and returns the hold's log index.
func (c *creator) hold(ctx context.Context, g uint32, ttl time.Duration) (uint64, error) {
	var index uint64
	err := c.cl.onLeader(ctx, g, func(ctx context.Context, n *node) error {
		r, err := n.client.HoldColdGC(ctx, &backupv1.HoldColdGCRequest{Group: g, Holder: c.id, TtlMs: ttl.Milliseconds()})
		if err == nil {
			index = r.GetIndex()
		}
		return err
	})
	return index, err
}

// group backs one group up: hold, export, group object, cold objects,
// release.
func (c *creator) group(ctx context.Context, g uint32) (GroupEntry, error) {
	log := c.log.With("group_id", g)
	hctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	holdIndex, err := c.hold(hctx, g, c.opts.HoldTTL)
	cancel()
	if err != nil {
		return GroupEntry{}, fmt.Errorf("group %d: hold the cold GC: %w", g, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if _, err := c.hold(rctx, g, 0); err != nil {
			log.Warn("cold-GC hold not released: it expires on its own", "err", err, "ttl", c.opts.HoldTTL.String())
		}
	}()
	rctx, stopRenew := context.WithCancel(ctx)
	var renewing sync.WaitGroup
	renewing.Go(func() { c.renewHold(rctx, g, log) })
	defer renewing.Wait()
	defer stopRenew()

	best, from, err := c.export(ctx, g, holdIndex, log)
	if err != nil {
		return GroupEntry{}, err
	}
	obj := best.GetObject()
	gobj, snap, err := backupfmt.DecodeGroup(obj)
	if err != nil {
		return GroupEntry{}, fmt.Errorf("%w: group %d as %s exported it: %v", ErrCorrupt, g, from, err)
	}
	if gobj.GetClusterId() != c.cl.clusterID || gobj.GetGroup() != g || gobj.GetGroupCount() != c.cl.groupCount {
		return GroupEntry{}, fmt.Errorf("%w: %s exported group %d of %d of cluster %q for group %d of %d of %q",
			ErrCorrupt, from, gobj.GetGroup(), gobj.GetGroupCount(), gobj.GetClusterId(), g, c.cl.groupCount, c.cl.clusterID)
	}
	if limit := c.cl.maxImport; limit > 0 && uint64(len(obj)) > limit {
		// Such a backup could never be restored into this cluster: fail
		// now, while the data is still in the cluster, not at the restore.
		return GroupEntry{}, fmt.Errorf("group %d: its state is %d bytes (mostly hot bytes the cold tier has not flushed yet), above the largest import the nodes accept (%d bytes, max_message_bytes less a margin): "+
			"it could not be restored; let the cold tier catch up (or flush-cold the group's largest streams) and back up again", g, len(obj), limit)
	}
	key := groupKey(c.id, int(g))
	if err := c.loc.store.Put(ctx, key, obj); err != nil {
		return GroupEntry{}, fmt.Errorf("group %d: write the group object: %w", g, err)
	}
	c.mu.Lock()
	c.totals.GroupBytes += int64(len(obj))
	c.mu.Unlock()

	refs, err := c.copyRefs(ctx, g, snap)
	if err != nil {
		return GroupEntry{}, err
	}
	nodeID := best.GetNodeId()
	if nodeID == 0 {
		nodeID = from.info.GetNodeId()
	}
	log.Debug("group backed up", "node_id", nodeID, "commit_index", best.GetCommitIndex(), "cold_objects", refs)
	return GroupEntry{
		Group: g, Object: key, Size: int64(len(obj)), BLAKE3: best.GetBlake3(),
		NodeID: nodeID, CommitIndex: best.GetCommitIndex(), AppliedIndex: best.GetAppliedIndex(), HoldIndex: holdIndex,
		ExportedAt: time.UnixMilli(gobj.GetExportedMs()).UTC(), Streams: len(snap.GetStreams()), ColdObjects: refs,
	}, nil
}

// renewHold renews the group's hold every third of its TTL until ctx
// ends. A failed renewal is logged: if the hold then lapses and the GC
// deletes an object the export references, its copy fails, and with it
// the backup, rather than the backup missing the object.
func (c *creator) renewHold(ctx context.Context, g uint32, log *slog.Logger) {
	t := time.NewTicker(max(c.opts.HoldTTL/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		_, err := c.hold(hctx, g, c.opts.HoldTTL)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("cold-GC hold renewal failed", "err", err)
		}
	}
}

// export asks every node for its replica of the group, at or above the
// hold's index, and keeps the answer with the highest commit index (then
// applied index) whose digest checks out.
func (c *creator) export(ctx context.Context, g uint32, minApplied uint64, log *slog.Logger) (*backupv1.ExportGroupResponse, *node, error) {
	var (
		best *backupv1.ExportGroupResponse
		from *node
		errs []error
	)
	for _, n := range c.cl.nodes {
		ectx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		r, err := n.client.ExportGroup(ectx, &backupv1.ExportGroupRequest{Group: g, MinAppliedIndex: minApplied})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, context.Cause(ctx)
			}
			log.Warn("export failed on a node", "node", n.String(), "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			continue
		}
		if d := backupfmt.Digest(r.GetObject()); d != r.GetBlake3() {
			errs = append(errs, fmt.Errorf("%w: %s exported group %d with BLAKE3 %s, its answer says %q", ErrCorrupt, n, g, d, r.GetBlake3()))
			continue
		}
		if r.GetAppliedIndex() < minApplied {
			errs = append(errs, fmt.Errorf("%s exported group %d at applied index %d, below the hold's %d", n, g, r.GetAppliedIndex(), minApplied))
			continue
		}
		if best == nil || r.GetCommitIndex() > best.GetCommitIndex() ||
			r.GetCommitIndex() == best.GetCommitIndex() && r.GetAppliedIndex() > best.GetAppliedIndex() {
			best, from = r, n
		}
	}
	if best == nil {
		err := fmt.Errorf("group %d: no node exported it: %w", g, errors.Join(errs...))
		if slices.ContainsFunc(errs, func(e error) bool { return errors.Is(e, ErrCorrupt) }) {
			err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil, nil, err
	}
	return best, from, nil
}

// copyRefs copies every cold object the group's snapshot references into
// objects/ and returns how many it references. The walk runs in this
// goroutine (it reads index pages as it descends); the copies run beside
// it, at most Concurrency over the whole backup.
func (c *creator) copyRefs(ctx context.Context, g uint32, snap *storagev1.Snapshot) (int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var copies sync.WaitGroup
	refs := 0
	walkErr := backupfmt.Walk(ctx, snap, c.readPage, func(r backupfmt.Ref) error {
		refs++
		if !c.claim(r) {
			return nil // another group's copy, or one in flight
		}
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		copies.Go(func() {
			defer func() { <-c.sem }()
			if err := c.copyObject(ctx, r); err != nil {
				cancel(fmt.Errorf("group %d: %w", g, err))
			}
		})
		return nil
	})
	copies.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	if walkErr != nil {
		if errors.Is(walkErr, coldfmt.ErrCorrupt) {
			walkErr = fmt.Errorf("%w: %w", ErrCorrupt, walkErr)
		}
		return 0, fmt.Errorf("group %d: walk its cold references: %w", g, walkErr)
	}
	return refs, nil
}

// claim reserves a cold key for copying; false when it is copied or
// being copied already.
func (c *creator) claim(r backupfmt.Ref) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.objects[r.Key]; ok {
		return false
	}
	c.objects[r.Key] = nil
	c.tr.update(func(p *Progress) {
		p.TotalObjects++
		p.TotalBytes += int64(r.Size)
	})
	return true
}

// earlier returns the object an earlier backup copied for the same
// reference.
func (c *creator) earlier(r backupfmt.Ref) (ColdObject, bool) {
	p, ok := c.prior[refKey{r.Key, r.Check}]
	if !ok || r.Size != 0 && uint64(p.Size) != r.Size {
		return ColdObject{}, false
	}
	return p, true
}

// readPage reads an index page for the walk: from the location when an
// earlier backup holds it (the source is not read then), else from the
// source. Walk verifies the page before it decodes it.
func (c *creator) readPage(ctx context.Context, ref *storagev1.ColdRef) ([]byte, error) {
	if p, ok := c.earlier(backupfmt.Ref{Key: ref.GetKey(), Size: ref.GetSize(), Check: fmt.Sprintf("crc32c:%08x", ref.GetCrc32C())}); ok {
		body, err := c.loc.store.Get(ctx, p.Object)
		if err == nil && coldfmt.PageChecksum(body) == ref.GetCrc32C() {
			return body, nil
		}
	}
	if c.src == nil {
		return nil, fmt.Errorf("index page %s: %w", ref.GetKey(), c.srcErr)
	}
	return c.src.Get(ctx, ref.GetKey())
}

// copyObject copies one cold object into objects/ under its digest,
// unless an earlier backup holds the same reference's object.
func (c *creator) copyObject(ctx context.Context, r backupfmt.Ref) error {
	if p, ok := c.earlier(r); ok {
		if ok, err := c.inLocation(ctx, p.BLAKE3, p.Size); err != nil {
			return err
		} else if ok {
			c.record(r, p.BLAKE3, p.Size, false)
			return nil
		}
	}
	if c.src == nil {
		return fmt.Errorf("cold object %s: %w", r.Key, c.srcErr)
	}
	body, err := c.src.Get(ctx, r.Key)
	if errors.Is(err, objstore.ErrNotFound) {
		return fmt.Errorf("%w: cold object %s is not in the source cold store", ErrMissingCold, r.Key)
	}
	if err != nil {
		return fmt.Errorf("read cold object: %w", err)
	}
	if err := verifyRef(r, body); err != nil {
		return fmt.Errorf("%w: source cold object %s: %v", ErrCorrupt, r.Key, err)
	}
	d := backupfmt.Digest(body)
	created, err := c.loc.store.PutIfAbsent(ctx, objectKey(d), body)
	if err != nil {
		return fmt.Errorf("copy cold object %s: %w", r.Key, err)
	}
	c.record(r, d, int64(len(body)), created)
	return nil
}

// inLocation reports whether objects/ holds the digest's object with the
// size (asked once per digest and backup).
func (c *creator) inLocation(ctx context.Context, digest string, size int64) (bool, error) {
	c.mu.Lock()
	ok := c.present[digest]
	c.mu.Unlock()
	if ok {
		return true, nil
	}
	info, err := c.loc.store.Head(ctx, objectKey(digest))
	if errors.Is(err, objstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", c.loc, err)
	}
	if info.Size != size {
		return false, nil
	}
	c.mu.Lock()
	if c.present == nil {
		c.present = map[string]bool{}
	}
	c.present[digest] = true
	c.mu.Unlock()
	return true, nil
}

func (c *creator) record(r backupfmt.Ref, digest string, size int64, copied bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objects[r.Key] = &ColdObject{Key: r.Key, Object: objectKey(digest), Size: size, BLAKE3: digest, Check: r.Check}
	if c.present == nil {
		c.present = map[string]bool{}
	}
	c.present[digest] = true
	if copied {
		c.totals.CopiedObjects++
		c.totals.CopiedBytes += size
	} else {
		c.totals.ReusedObjects++
		c.totals.ReusedBytes += size
	}
	c.tr.update(func(p *Progress) {
		p.Objects++
		p.Bytes += size
		if copied {
			p.CopiedObjects++
			p.CopiedBytes += size
		} else {
			p.ReusedObjects++
		}
	})
}

// manifest assembles the manifest of the finished copy.
func (c *creator) manifest(groups []GroupEntry, src string, started time.Time) *Manifest {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := &Manifest{
		FormatVersion: backupfmt.FormatVersion, ID: c.id, ClusterID: c.cl.clusterID, GroupCount: c.cl.groupCount,
		SourceColdStore: src, CreatedAt: started, CompletedAt: c.opts.Now().UTC(), Groups: groups,
		ColdObjects: make([]ColdObject, 0, len(c.objects)), Totals: c.totals,
	}
	for _, o := range c.objects {
		m.ColdObjects = append(m.ColdObjects, *o)
		m.Totals.ColdBytes += o.Size
	}
	slices.SortFunc(m.ColdObjects, func(a, b ColdObject) int { return strings.Compare(a.Key, b.Key) })
	m.Totals.Groups = len(groups)
	m.Totals.ColdObjects = len(m.ColdObjects)
	for _, g := range groups {
		m.Totals.Streams += g.Streams
	}
	return m
}

// discard removes the group objects of a failed backup (best effort; a
// later Prune removes what is left, and the cold objects it copied).
func (c *creator) discard(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	var keys []string
	err := c.loc.store.List(ctx, backupPrefix(c.id), func(info objstore.Info) error {
		keys = append(keys, info.Key)
		return nil
	})
	if err == nil && len(keys) > 0 {
		err = c.loc.store.Delete(ctx, keys...)
	}
	if err != nil {
		c.log.Warn("the failed backup's group objects were not removed: prune removes them", "err", err)
	}
}
