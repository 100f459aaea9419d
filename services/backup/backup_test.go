package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/objstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// placement is the cluster's stream placement (FNV-1a 64 of
// bucket "/" stream, mod G), so that hand-made snapshots hold streams
// where a cluster would.
func placement(bucket, stream string, groups uint32) uint32 {
	h := fnv.New64a()
	h.Write([]byte(bucket + "/" + stream))
	return uint32(h.Sum64() % uint64(groups))
}

// countingStore records the keys read from a store.
type countingStore struct {
	objstore.Store
	mu   sync.Mutex
	gets []string
}

func (s *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	s.gets = append(s.gets, key)
	s.mu.Unlock()
	return s.Store.Get(ctx, key)
}

func (s *countingStore) reads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gets)
}

func (s *countingStore) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets = nil
}

// env is a source cluster (fake nodes over a real cold store in a
// directory), a backup location in another directory, and a target
// cluster with its own cold store.
type env struct {
	t       *testing.T
	cluster *fakeCluster
	fakes   []*fakeNode
	nodes   []backupv1.BackupServiceClient
	srcDir  string
	src     *countingStore
	source  *source
	loc     *Location
	// target is a second cluster of the same id and group count, empty,
	// with its own cold store.
	target      *fakeCluster
	targetNodes []backupv1.BackupServiceClient
	targetFakes []*fakeNode
	targetCold  *Location
	clock       time.Time
}

const testGroups = 3

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, cluster: newFakeCluster("prod-1", testGroups), clock: time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)}
	e.fakes, e.nodes = e.cluster.nodes(3)
	e.srcDir = filepath.Join(dir, "source-cold")
	fs, err := objstore.NewFS(e.srcDir)
	if err != nil {
		t.Fatal(err)
	}
	e.src = &countingStore{Store: fs}
	e.source = &source{tb: t, store: e.src}
	e.cluster.coldStore = e.srcDir
	if e.loc, err = OpenLocation(t.Context(), filepath.Join(dir, "backups")); err != nil {
		t.Fatal(err)
	}
	if e.targetCold, err = OpenLocation(t.Context(), "file://"+filepath.Join(dir, "target-cold")); err != nil {
		t.Fatal(err)
	}
	e.target = newFakeCluster("prod-1", testGroups)
	e.target.coldStore = e.targetCold.String()
	e.target.coldTarget = e.targetCold.store
	e.targetFakes, e.targetNodes = e.target.nodes(3)
	// Leaders spread over the nodes, and none where the calls start
	// (node g mod 3), so that calls follow NOT_LEADER hints.
	for g := range uint32(testGroups) {
		e.cluster.leader[g] = uint64((g+2)%3) + 1
		e.target.leader[g] = uint64((g+1)%3) + 1
	}
	return e
}

// addStream writes a stream's objects to the source and puts it in its
// group.
func (e *env) addStream(sp streamSpec) *storagev1.StreamState {
	e.t.Helper()
	st := e.source.writeStream(sp)
	g := placement(sp.bucket, sp.name, testGroups)
	e.cluster.addStream(g, st)
	e.cluster.mu.Lock()
	if !slices.Contains(e.cluster.snaps[0].Buckets, sp.bucket) {
		e.cluster.snaps[0].Buckets = append(e.cluster.snaps[0].Buckets, sp.bucket)
	}
	e.cluster.mu.Unlock()
	return st
}

// populated is how many cold objects populate writes.
const populated = 14

// populate adds the standard streams: every kind of cold reference.
func (e *env) populate() {
	e.t.Helper()
	e.addStream(streamSpec{bucket: "app", name: "orders", chunks: 5, sealed: 3, external: true, appSnapshot: true, parts: 2})
	e.addStream(streamSpec{bucket: "app", name: "events", chunks: 2})
	e.addStream(streamSpec{bucket: "logs", name: "web/2026", chunks: 1, appSnapshot: true})
}

// now is a clock that advances a second per call, so ids differ.
func (e *env) now() time.Time {
	e.clock = e.clock.Add(time.Second)
	return e.clock
}

func (e *env) create(opts CreateOptions) *Manifest {
	e.t.Helper()
	if opts.Now == nil {
		opts.Now = e.now
	}
	opts.backoff = func(int) time.Duration { return 0 }
	m, err := Create(e.t.Context(), e.nodes, e.loc, opts)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return m
}

func (e *env) restore(id string, opts RestoreOptions) (*RestoreReport, error) {
	e.t.Helper()
	opts.backoff = func(int) time.Duration { return 0 }
	return Restore(e.t.Context(), e.targetNodes, e.loc, id, opts)
}

// coldKeys lists the source's cold keys (every object but none).
func listKeys(t *testing.T, s objstore.Store, prefix string) []string {
	t.Helper()
	var keys []string
	if err := s.List(t.Context(), prefix, func(i objstore.Info) error {
		keys = append(keys, i.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestCreateVerifyRestore(t *testing.T) {
	e := newEnv(t)
	e.populate()
	var phases []string
	var last Progress
	m := e.create(CreateOptions{Concurrency: 2, Progress: func(p Progress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
		last = p
	}})

	srcKeys := listKeys(t, e.src, "")
	if len(m.ColdObjects) != len(srcKeys) || len(srcKeys) != populated {
		t.Fatalf("manifest lists %d cold objects, the source holds %d (want %d)", len(m.ColdObjects), len(srcKeys), populated)
	}
	for i, c := range m.ColdObjects {
		if c.Key != srcKeys[i] || c.Object != objectKey(c.BLAKE3) {
			t.Fatalf("cold object %d: %+v, want key %s", i, c, srcKeys[i])
		}
	}
	if m.ClusterID != "prod-1" || m.GroupCount != testGroups || len(m.Groups) != testGroups || m.FormatVersion != 1 {
		t.Fatalf("manifest header: %+v", m)
	}
	for g, ge := range m.Groups {
		if ge.Group != uint32(g) || ge.Object != groupKey(m.ID, g) || ge.HoldIndex == 0 || ge.AppliedIndex < ge.HoldIndex {
			t.Fatalf("group entry %d: %+v", g, ge)
		}
	}
	if m.Totals.CopiedObjects != populated || m.Totals.ReusedObjects != 0 || m.Totals.Streams != 3 {
		t.Fatalf("totals: %+v", m.Totals)
	}
	if want := []string{PhaseInfo, PhaseGroups, PhaseManifest, PhaseDone}; !slices.Equal(phases, want) {
		t.Fatalf("phases %v, want %v", phases, want)
	}
	if last.GroupsDone != testGroups || last.Objects != populated || last.TotalObjects != populated || last.CopiedObjects != populated || last.Bytes != last.TotalBytes {
		t.Fatalf("last progress: %+v", last)
	}
	// Holds were taken and released on every group; the lock is gone.
	for g := range uint32(testGroups) {
		if e.cluster.holdCalls[g] == 0 || e.cluster.releases[g] != 1 || len(e.cluster.holds[g]) != 0 {
			t.Fatalf("group %d: %d holds, %d releases, held by %v", g, e.cluster.holdCalls[g], e.cluster.releases[g], e.cluster.holds[g])
		}
	}
	if _, err := e.loc.store.Head(t.Context(), lockKey); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("lock after create: %v", err)
	}

	for _, d := range []Depth{DepthManifest, DepthObjects, DepthDeep} {
		t.Run("verify "+d.String(), func(t *testing.T) {
			r, err := Verify(t.Context(), e.loc, "", d, nil)
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if !r.OK || r.ID != m.ID || r.Groups != testGroups || r.ColdObjects != populated || len(r.Problems) != 0 {
				t.Fatalf("report: %+v", r)
			}
			if d == DepthDeep && r.References != populated {
				t.Fatalf("deep walked %d references, want %d", r.References, populated)
			}
		})
	}

	r, err := e.restore("", RestoreOptions{Concurrency: 2})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if r.Imported != testGroups || r.Already != 0 || r.ObjectsCopied != populated || r.ObjectsSkipped != 0 || r.ColdChecked != populated || r.Streams != 3 {
		t.Fatalf("restore report: %+v", r)
	}
	if got := listKeys(t, e.targetCold.store, ""); !slices.Equal(got, srcKeys) {
		t.Fatalf("target cold store holds %v, want %v", got, srcKeys)
	}
	for _, k := range srcKeys {
		a, _ := e.src.Store.Get(t.Context(), k)
		b, _ := e.targetCold.store.Get(t.Context(), k)
		if !bytes.Equal(a, b) {
			t.Fatalf("target's %s differs from the source's", k)
		}
	}
	for _, ge := range m.Groups {
		if e.target.imported[ge.Group] != ge.BLAKE3 {
			t.Fatalf("group %d imported %q, want %s", ge.Group, e.target.imported[ge.Group], ge.BLAKE3)
		}
	}
}

func TestCreatePicksTheHighestCommitIndex(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.fakes[0].commitLag, e.fakes[1].commitLag, e.fakes[2].commitLag = 3, 0, 5
	m := e.create(CreateOptions{})
	for _, g := range m.Groups {
		if g.NodeID != 2 {
			t.Fatalf("group %d exported from node %d, want node 2 (highest commit index)", g.Group, g.NodeID)
		}
	}
}

func TestCreateToleratesAnUnreachableNode(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.fakes[0].setDown(true)
	for g := range uint32(testGroups) {
		e.cluster.leader[g] = 2
	}
	m := e.create(CreateOptions{})
	if len(m.Groups) != testGroups {
		t.Fatalf("%d groups", len(m.Groups))
	}
	for _, f := range e.fakes {
		f.setDown(true)
	}
	_, err := Create(t.Context(), e.nodes, e.loc, CreateOptions{Now: e.now})
	if err == nil || !strings.Contains(err.Error(), "no node answered") {
		t.Fatalf("create with every node down: %v", err)
	}
}

func TestCreateRefusesDisagreeingNodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*backupv1.BackupInfo)
	}{
		{"cluster id", func(i *backupv1.BackupInfo) { i.ClusterId = "other" }},
		{"group count", func(i *backupv1.BackupInfo) { i.GroupCount = 4 }},
		{"format version", func(i *backupv1.BackupInfo) { i.FormatVersion = 9 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.fakes[2].infoOverride = tc.edit
			_, err := Create(t.Context(), e.nodes, e.loc, CreateOptions{Now: e.now})
			if !errors.Is(err, ErrPrecondition) {
				t.Fatalf("create: %v, want ErrPrecondition", err)
			}
			if keys := listKeys(t, e.loc.store, ""); len(keys) != 0 {
				t.Fatalf("the location holds %v", keys)
			}
		})
	}
}

func TestCreateIsIncremental(t *testing.T) {
	e := newEnv(t)
	e.populate()
	first := e.create(CreateOptions{})
	oldKeys := listKeys(t, e.src, "")

	e.src.reset()
	e.addStream(streamSpec{bucket: "app", name: "new", chunks: 2, sealed: 0})
	second := e.create(CreateOptions{})
	if second.ID == first.ID {
		t.Fatal("both backups have one id")
	}
	if second.Totals.CopiedObjects != 2 || second.Totals.ReusedObjects != populated || len(second.ColdObjects) != populated+2 {
		t.Fatalf("second backup totals: %+v", second.Totals)
	}
	for _, k := range e.src.reads() {
		if slices.Contains(oldKeys, k) {
			t.Fatalf("the second backup read %s from the source, which the first holds", k)
		}
	}
	if n := len(listKeys(t, e.loc.store, objectsPrefix)); n != populated+2 {
		t.Fatalf("objects/ holds %d objects, want %d", n, populated+2)
	}
	// An object that vanished from the location is copied again, not
	// reused from the manifest that names it.
	gone := second.ColdObjects[0]
	if err := e.loc.store.Delete(t.Context(), gone.Object); err != nil {
		t.Fatal(err)
	}
	third := e.create(CreateOptions{})
	if third.Totals.CopiedObjects != 1 || third.Totals.ReusedObjects != populated+1 {
		t.Fatalf("third backup totals: %+v", third.Totals)
	}
	for _, id := range []string{first.ID, second.ID, third.ID} {
		if _, err := Verify(t.Context(), e.loc, id, DepthDeep, nil); err != nil {
			t.Fatalf("verify %s: %v", id, err)
		}
	}
	// A backup is also named by its manifest's key.
	if r, err := Verify(t.Context(), e.loc, "backups/"+second.ID+"/manifest.json", DepthManifest, nil); err != nil || r.ID != second.ID {
		t.Fatalf("verify by manifest key: %v %v", r, err)
	}
}

func TestCreateRefusesACorruptSourceObject(t *testing.T) {
	e := newEnv(t)
	st := e.addStream(streamSpec{bucket: "app", name: "orders", chunks: 2})
	key := st.GetColdIndex()[0].GetEntries()[1].GetKey()
	body, err := e.src.Store.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	body[0] ^= 0x40
	if err := e.src.Store.Put(t.Context(), key, body); err != nil {
		t.Fatal(err)
	}
	_, err = Create(t.Context(), e.nodes, e.loc, CreateOptions{Now: e.now, backoff: func(int) time.Duration { return 0 }})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
		t.Fatalf("create: %v, want ErrCorrupt naming %s", err, key)
	}
	if all, _ := List(t.Context(), e.loc); len(all) != 0 {
		t.Fatalf("a failed backup is listed: %v", all)
	}
	if keys := listKeys(t, e.loc.store, backupsPrefix); len(keys) != 0 {
		t.Fatalf("the failed backup left %v", keys)
	}
}

func TestCreateRenewsTheHoldWhileCopying(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.cluster.holdSeen = make(chan uint32, 64)
	renewed := make(chan struct{})
	var once sync.Once
	// The export of group 0 waits until its hold was renewed twice.
	e.cluster.exportGate = func(ctx context.Context, g uint32) error {
		if g != 0 {
			return nil
		}
		once.Do(func() {
			go func() {
				defer close(renewed)
				for n := 0; n < 3; {
					select {
					case got := <-e.cluster.holdSeen:
						if got == 0 {
							n++
						}
					case <-ctx.Done():
						return
					}
				}
			}()
		})
		select {
		case <-renewed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m := e.create(CreateOptions{HoldTTL: 3 * time.Millisecond, Concurrency: 1})
	if e.cluster.holdCalls[0] < 3 || e.cluster.releases[0] != 1 || len(m.Groups) != testGroups {
		t.Fatalf("group 0: %d hold calls, %d releases", e.cluster.holdCalls[0], e.cluster.releases[0])
	}
}

func TestCreateCancelledReleasesEverything(t *testing.T) {
	e := newEnv(t)
	e.populate()
	started := make(chan struct{})
	var once sync.Once
	e.cluster.exportGate = func(ctx context.Context, g uint32) error {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := Create(ctx, e.nodes, e.loc, CreateOptions{Now: e.now, Concurrency: 1})
		done <- err
	}()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("create: %v, want context.Canceled", err)
	}
	if keys := listKeys(t, e.loc.store, ""); len(keys) != 0 {
		t.Fatalf("a cancelled backup left %v (no lock, no manifest, no group object may stay)", keys)
	}
	e.cluster.mu.Lock()
	defer e.cluster.mu.Unlock()
	for g, h := range e.cluster.holds {
		if len(h) != 0 {
			t.Fatalf("group %d still held by %v", g, h)
		}
	}
}

func TestVerifyAndRestoreDetectCorruption(t *testing.T) {
	for _, tc := range []struct {
		name string
		pick func(m *Manifest) string
	}{
		{"group object", func(m *Manifest) string { return m.Groups[1].Object }},
		{"cold object", func(m *Manifest) string { return m.ColdObjects[3].Object }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.populate()
			m := e.create(CreateOptions{})
			key := tc.pick(m)
			body, err := e.loc.store.Get(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			body[len(body)/2] ^= 0x01
			if err := e.loc.store.Put(t.Context(), key, body); err != nil {
				t.Fatal(err)
			}
			if r, err := Verify(t.Context(), e.loc, m.ID, DepthManifest, nil); err != nil || !r.OK {
				t.Fatalf("manifest depth sees sizes only: %v", err)
			}
			for _, d := range []Depth{DepthObjects, DepthDeep} {
				r, err := Verify(t.Context(), e.loc, m.ID, d, nil)
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
					t.Fatalf("verify %s: %v, want ErrCorrupt naming %s", d, err, key)
				}
				if r.OK || r.Problems[0].Object != key || r.Problems[0].Kind != ProblemDigest {
					t.Fatalf("verify %s report: %+v", d, r.Problems)
				}
			}
			r, err := e.restore(m.ID, RestoreOptions{})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
				t.Fatalf("restore: %v, want ErrCorrupt naming %s", err, key)
			}
			if r.Imported != 0 || len(e.target.imported) != 0 {
				t.Fatalf("restore imported %d groups", r.Imported)
			}
		})
	}
}

func TestVerifyFindsMissingAndUnlistedObjects(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	gone := m.ColdObjects[0]
	if err := e.loc.store.Delete(t.Context(), gone.Object); err != nil {
		t.Fatal(err)
	}
	r, err := Verify(t.Context(), e.loc, m.ID, DepthManifest, nil)
	if !errors.Is(err, ErrCorrupt) || r.Problems[0].Kind != ProblemMissing || r.Problems[0].Object != gone.Object {
		t.Fatalf("verify: %v %+v", err, r)
	}

	// A manifest that forgot an object: only the deep check sees it.
	e2 := newEnv(t)
	e2.populate()
	m2 := e2.create(CreateOptions{})
	dropped := m2.ColdObjects[len(m2.ColdObjects)-1]
	m2.ColdObjects = m2.ColdObjects[:len(m2.ColdObjects)-1]
	body, err := encodeManifest(m2)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.loc.store.Put(t.Context(), manifestKey(m2.ID), body); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(t.Context(), e2.loc, m2.ID, DepthObjects, nil); err != nil {
		t.Fatalf("verify objects: %v", err)
	}
	r, err = Verify(t.Context(), e2.loc, m2.ID, DepthDeep, nil)
	if !errors.Is(err, ErrCorrupt) || r.Problems[0].Kind != ProblemUnlisted || r.Problems[0].Object != dropped.Key {
		t.Fatalf("verify deep: %v %+v", err, r)
	}
}

func TestVerifyManifestStructure(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	for _, tc := range []struct {
		name string
		edit func(m *Manifest)
		want error
	}{
		{"group missing", func(m *Manifest) { m.Groups = m.Groups[:2] }, ErrCorrupt},
		{"group twice", func(m *Manifest) { m.Groups[2] = m.Groups[1] }, ErrCorrupt},
		{"format version", func(m *Manifest) { m.FormatVersion = 7 }, ErrPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := *m
			bad.Groups = slices.Clone(m.Groups)
			tc.edit(&bad)
			body, _ := encodeManifest(&bad)
			if err := e.loc.store.Put(t.Context(), manifestKey(m.ID), body); err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(t.Context(), e.loc, m.ID, DepthManifest, nil); !errors.Is(err, tc.want) {
				t.Fatalf("verify: %v, want %v", err, tc.want)
			}
			if _, err := e.restore(m.ID, RestoreOptions{}); !errors.Is(err, tc.want) {
				t.Fatalf("restore: %v, want %v", err, tc.want)
			}
			if len(e.target.imported) != 0 || len(listKeys(t, e.targetCold.store, "")) != 0 {
				t.Fatal("restore wrote to the target")
			}
		})
	}
	if _, err := Verify(t.Context(), e.loc, "nope", DepthManifest, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("verify of no backup: %v", err)
	}
}

func TestRestorePreconditions(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(e *env)
	}{
		{"cluster id", func(e *env) { e.target.clusterID = "staging" }},
		{"group count", func(e *env) { e.target.groupCount = 4 }},
		{"format version", func(e *env) { e.target.version = 2 }},
		{"one node differs", func(e *env) { e.targetFakes[1].infoOverride = func(i *backupv1.BackupInfo) { i.ClusterId = "x" } }},
		{"a node unreachable", func(e *env) { e.targetFakes[2].setDown(true) }},
		{"no cold store", func(e *env) { e.target.coldStore = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.populate()
			m := e.create(CreateOptions{})
			tc.edit(e)
			_, err := e.restore(m.ID, RestoreOptions{})
			if !errors.Is(err, ErrPrecondition) {
				t.Fatalf("restore: %v, want ErrPrecondition", err)
			}
			if len(e.target.imported) != 0 || e.target.coldChecks != 0 {
				t.Fatal("restore imported or checked before failing")
			}
			if keys := listKeys(t, e.targetCold.store, ""); len(keys) != 0 {
				t.Fatalf("restore wrote %v into the target cold store", keys)
			}
		})
	}
}

func TestRestoreStopsOnMissingColdObjects(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	// The cluster checks another store than the one the restore copies
	// into: every reference is missing there.
	e.target.coldTarget = objstore.NewMemory()
	r, err := e.restore(m.ID, RestoreOptions{})
	if !errors.Is(err, ErrMissingCold) {
		t.Fatalf("restore: %v, want ErrMissingCold", err)
	}
	if r.ColdMissing == 0 || len(r.MissingKeys) == 0 || r.Imported != 0 || len(e.target.imported) != 0 {
		t.Fatalf("report %+v, imports %v", r, e.target.imported)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("lacks %d objects", r.ColdMissing)) || !strings.Contains(err.Error(), r.MissingKeys[0]) {
		t.Fatalf("the error names neither the count nor the keys: %v", err)
	}
}

func TestRestoreInterruptedRunsAgain(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	e.target.failAfter = 1
	r, err := e.restore(m.ID, RestoreOptions{Concurrency: 1})
	if err == nil || r.Imported != 1 {
		t.Fatalf("first restore: %v, %d imported", err, r.Imported)
	}
	e.target.failAfter = 0
	r, err = e.restore(m.ID, RestoreOptions{Concurrency: 1})
	if err != nil {
		t.Fatalf("second restore: %v", err)
	}
	if r.Imported != testGroups-1 || r.Already != 1 || r.ObjectsSkipped != populated || r.ObjectsCopied != 0 {
		t.Fatalf("second restore: %+v", r)
	}
	if len(e.target.imported) != testGroups {
		t.Fatalf("%d groups imported", len(e.target.imported))
	}
}

func TestRestoreFollowsLeadersAndRetries(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	e.target.leader[0], e.target.leader[1], e.target.leader[2] = 3, 2, 3
	e.target.noLeader[2] = 4 // an election: UNAVAILABLE four times
	r, err := e.restore(m.ID, RestoreOptions{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	for _, g := range r.Groups {
		if want := e.target.leader[g.Group]; g.NodeID != want {
			t.Fatalf("group %d imported on node %d, want its leader %d", g.Group, g.NodeID, want)
		}
	}
}

// TestGroupAboveTheImportLimit: a group object the nodes could not import
// fails the backup (while the data is still in the cluster), and a target
// whose nodes accept less than a backup's group objects is refused before
// the first import.
func TestGroupAboveTheImportLimit(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.cluster.maxImport = 64
	if _, err := Create(t.Context(), e.nodes, e.loc, CreateOptions{Now: e.now}); err == nil || !strings.Contains(err.Error(), "could not be restored") {
		t.Fatalf("create with group objects above the import limit: %v", err)
	}
	e.cluster.maxImport = 0
	m := e.create(CreateOptions{})
	e.target.maxImport = 64
	_, err := e.restore(m.ID, RestoreOptions{})
	if !errors.Is(err, ErrPrecondition) || !strings.Contains(err.Error(), "max_message_bytes") {
		t.Fatalf("restore into nodes that accept less: %v", err)
	}
	if len(e.target.imported) != 0 || e.target.coldChecks != 0 {
		t.Fatalf("the refused restore imported %v and cold-checked %d times", e.target.imported, e.target.coldChecks)
	}
}

func TestRestoreRefusesANonEmptyGroup(t *testing.T) {
	e := newEnv(t)
	e.populate()
	m := e.create(CreateOptions{})
	// The last group holds data: the cold check finds it before any
	// group is imported.
	last := m.GroupCount - 1
	e.target.nonEmpty[last] = true
	_, err := e.restore(m.ID, RestoreOptions{})
	if !errors.Is(err, ErrPrecondition) || !strings.Contains(err.Error(), fmt.Sprintf("group %d", last)) || !strings.Contains(err.Error(), "nothing was imported") {
		t.Fatalf("restore: %v, want ErrPrecondition for group %d before any import", err, last)
	}
	if len(e.target.imported) != 0 {
		t.Fatalf("imported %v after the refusal", e.target.imported)
	}
}

func TestCreateSourceColdStore(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.cluster.coldStore = ""
	_, err := Create(t.Context(), e.nodes, e.loc, CreateOptions{Now: e.now})
	if err == nil || !strings.Contains(err.Error(), "no cold store") {
		t.Fatalf("create without a cold store: %v", err)
	}
	src := NewLocation(e.src, "source")
	m := e.create(CreateOptions{SourceColdStore: src})
	if m.SourceColdStore != "source" || len(m.ColdObjects) != populated {
		t.Fatalf("manifest %s with %d objects", m.SourceColdStore, len(m.ColdObjects))
	}
	// A directory the nodes name that is not on this host is not created
	// (into a new location: this one's backup needs no source read).
	e.cluster.coldStore = filepath.Join(t.TempDir(), "elsewhere")
	_, err = Create(t.Context(), e.nodes, NewLocation(objstore.NewMemory(), "mem"), CreateOptions{Now: e.now})
	if err == nil || !strings.Contains(err.Error(), "not a directory on this host") {
		t.Fatalf("create with a remote directory: %v", err)
	}
	if _, err := os.Stat(e.cluster.coldStore); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the nodes' directory was created here: %v", err)
	}
}
