package backup

import (
	"slices"
	"strings"
	"testing"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
)

// removeStream drops a stream from the cluster's state (its cold objects
// stay in the source, as until the cold GC collects them).
func (e *env) removeStream(bucket, name string) {
	e.cluster.mu.Lock()
	defer e.cluster.mu.Unlock()
	for g, snap := range e.cluster.snaps {
		e.cluster.snaps[g].Streams = slices.DeleteFunc(snap.Streams, func(st *storagev1.StreamState) bool {
			return st.GetBucket() == bucket && st.GetStream() == name
		})
	}
}

func objectsOf(m *Manifest) []string {
	var out []string
	for _, c := range m.ColdObjects {
		out = append(out, c.Object)
	}
	return out
}

func TestPruneRetention(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.clock = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	b1 := e.create(CreateOptions{})
	e.removeStream("app", "events")
	e.addStream(streamSpec{bucket: "app", name: "new1", chunks: 2})
	e.clock = time.Date(2026, 7, 2, 0, 0, 0, 0, time.UTC)
	b2 := e.create(CreateOptions{})
	e.addStream(streamSpec{bucket: "app", name: "new2", chunks: 1})
	e.clock = time.Date(2026, 7, 3, 0, 0, 0, 0, time.UTC)
	b3 := e.create(CreateOptions{})

	all, err := List(t.Context(), e.loc)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{all[0].ID, all[1].ID, all[2].ID}; !slices.Equal(got, []string{b1.ID, b2.ID, b3.ID}) {
		t.Fatalf("list order %v", got)
	}
	onlyB1 := []string{}
	for _, o := range objectsOf(b1) {
		if !slices.Contains(objectsOf(b2), o) && !slices.Contains(objectsOf(b3), o) {
			onlyB1 = append(onlyB1, o)
		}
	}
	if len(onlyB1) != 2 {
		t.Fatalf("%d objects only the first backup names, want 2 (the removed stream's chunks)", len(onlyB1))
	}
	// Leftovers of a failed backup: a group object and an object no
	// manifest names.
	orphan := objectKey(backupfmt.Digest([]byte("orphan")))
	for _, k := range []string{"backups/failed/groups/00000.bin", orphan} {
		if err := e.loc.store.Put(t.Context(), k, []byte("orphan")); err != nil {
			t.Fatal(err)
		}
	}

	removed, err := Prune(t.Context(), e.loc, Retention{KeepLast: 2}, b3.CreatedAt.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{b1.ID}) {
		t.Fatalf("removed %v, want %v", removed, []string{b1.ID})
	}
	objs := listKeys(t, e.loc.store, objectsPrefix)
	for _, o := range onlyB1 {
		if slices.Contains(objs, o) {
			t.Fatalf("%s, named by the removed backup only, is still there", o)
		}
	}
	if slices.Contains(objs, orphan) {
		t.Fatal("the orphan object is still there")
	}
	if keys := listKeys(t, e.loc.store, backupsPrefix); slices.ContainsFunc(keys, func(k string) bool {
		return strings.HasPrefix(k, backupPrefix(b1.ID)) || strings.HasPrefix(k, backupPrefix("failed"))
	}) {
		t.Fatalf("backups/ still holds %v", keys)
	}
	for _, b := range []*Manifest{b2, b3} {
		if _, err := Verify(t.Context(), e.loc, b.ID, DepthDeep, nil); err != nil {
			t.Fatalf("verify %s after the prune: %v", b.ID, err)
		}
	}

	// keep_within keeps the backups younger than it, and always the
	// newest.
	removed, err = Prune(t.Context(), e.loc, Retention{KeepWithin: 36 * time.Hour}, b3.CreatedAt.Add(12*time.Hour))
	if err != nil || len(removed) != 0 {
		t.Fatalf("prune within 36h: %v, %v", removed, err)
	}
	removed, err = Prune(t.Context(), e.loc, Retention{KeepWithin: time.Hour}, b3.CreatedAt.Add(48*time.Hour))
	if err != nil || !slices.Equal(removed, []string{b2.ID}) {
		t.Fatalf("prune within 1h, two days later: %v, %v (want only %s removed: the newest stays)", removed, err, b2.ID)
	}
	if n := len(listKeys(t, e.loc.store, objectsPrefix)); n != len(b3.ColdObjects) {
		t.Fatalf("objects/ holds %d objects, the remaining backup names %d", n, len(b3.ColdObjects))
	}
	if _, err := Verify(t.Context(), e.loc, "", DepthDeep, nil); err != nil {
		t.Fatalf("verify the newest: %v", err)
	}
	if _, err := Prune(t.Context(), e.loc, Retention{}, time.Now()); err == nil {
		t.Fatal("a retention without rules pruned")
	}
}
