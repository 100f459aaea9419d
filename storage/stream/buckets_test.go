package stream

import (
	"errors"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// TestBucketDeletionFences pins the apply rules of FenceBucket and of a
// CreateStream's bucket generation, step by step on one machine (group 0,
// which holds the bucket record as well).
func TestBucketDeletionFences(t *testing.T) {
	a := newApplier(t)
	if r := a.apply(1, &storagev1.FenceBucket{Bucket: "b"}); !errors.Is(r.Err, fault.ErrFeatureLevelUnsupported) {
		t.Fatalf("a fence below the fences' feature level: %v, want FEATURE_LEVEL_UNSUPPORTED", r.Err)
	}
	a.apply(1, &storagev1.SetFeatureLevel{Level: BucketFenceLevel})
	create := func(s string, gen uint64) *Result {
		t.Helper()
		return a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: s, ContentType: "text/plain", BucketGeneration: gen})
	}
	if r := a.apply(1, &storagev1.CreateBucket{Bucket: "b"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	gen1, ok := a.m.BucketGeneration("b")
	if !ok || gen1 != a.index {
		t.Fatalf("generation %d, %v; want the create's index %d", gen1, ok, a.index)
	}
	steps := []struct {
		name string
		run  func() *Result
		want *fault.Kind
	}{
		{"create before any fence", func() *Result { return create("s1", gen1) }, nil},
		{"fence", func() *Result { return a.apply(1, &storagev1.FenceBucket{Bucket: "b", Generation: gen1}) }, nil},
		{"create of the fenced generation", func() *Result { return create("s2", gen1) }, fault.ErrBucketNotFound},
		{"create of an older generation", func() *Result { return create("s2", 0) }, fault.ErrBucketNotFound},
		{"an older fence does not lower it", func() *Result { return a.apply(1, &storagev1.FenceBucket{Bucket: "b", Generation: 0}) }, nil},
		{"still refused", func() *Result { return create("s2", gen1) }, fault.ErrBucketNotFound},
		{"a lift of another generation", func() *Result { return a.apply(1, &storagev1.FenceBucket{Bucket: "b", Generation: 0, Lift: true}) }, nil},
		{"still refused after it", func() *Result { return create("s2", gen1) }, fault.ErrBucketNotFound},
		{"the lift of the fence", func() *Result {
			return a.apply(1, &storagev1.FenceBucket{Bucket: "b", Generation: gen1, Lift: true})
		}, nil},
		{"create after the lift", func() *Result { return create("s2", gen1) }, nil},
		{"fence again", func() *Result { return a.apply(1, &storagev1.FenceBucket{Bucket: "b", Generation: gen1}) }, nil},
		{"the record cannot go while it has streams", func() *Result { return a.apply(1, &storagev1.DeleteBucket{Bucket: "b"}) }, fault.ErrBucketExists},
		{"delete s1", func() *Result { return a.apply(1, &storagev1.DeleteStream{Bucket: "b", Stream: "s1"}) }, nil},
		{"delete s2", func() *Result { return a.apply(1, &storagev1.DeleteStream{Bucket: "b", Stream: "s2"}) }, nil},
		{"the record goes", func() *Result { return a.apply(1, &storagev1.DeleteBucket{Bucket: "b"}) }, nil},
		{"create of the deleted record", func() *Result { return create("s3", gen1) }, fault.ErrBucketNotFound},
		{"the bucket created again", func() *Result { return a.apply(1, &storagev1.CreateBucket{Bucket: "b"}) }, nil},
		{"create of the new record", func() *Result {
			gen2, _ := a.m.BucketGeneration("b")
			if gen2 <= gen1 {
				t.Fatalf("new generation %d not above %d", gen2, gen1)
			}
			return create("s3", gen2)
		}, nil},
		// The first create of the new record dropped the fence: a late
		// create that checked the old record lands in the new one, which
		// exists, as if it had run after the bucket was created again.
		{"the fence is gone", func() *Result { return create("s4", gen1) }, nil},
	}
	for _, st := range steps {
		if got := code(st.run()); got != st.want {
			t.Fatalf("%s: got %v, want %v", st.name, got, st.want)
		}
	}
	if _, ok := a.m.BucketFence("b"); ok {
		t.Fatal("a create of a newer record left the fence")
	}
}

// TestBucketFencesInSnapshots: generations and fences survive a snapshot
// and restore.
func TestBucketFencesInSnapshots(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.SetFeatureLevel{Level: BucketFenceLevel})
	a.apply(1, &storagev1.CreateBucket{Bucket: "b"})
	genB, _ := a.m.BucketGeneration("b")
	a.apply(1, &storagev1.CreateBucket{Bucket: "c"})
	gen, _ := a.m.BucketGeneration("c")
	a.apply(1, &storagev1.FenceBucket{Bucket: "c", Generation: gen})
	a.apply(1, &storagev1.DeleteBucket{Bucket: "c"})
	snap, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := NewMachine(0)
	if err := m.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if g, ok := m.BucketGeneration("b"); !ok || g != genB || g == 0 {
		t.Fatalf("restored generation of b = %d, %v; want %d", g, ok, genB)
	}
	if f, ok := m.BucketFence("c"); !ok || f != gen {
		t.Fatalf("restored fence of c = %d, %v; want %d", f, ok, gen)
	}
	if _, ok := m.BucketGeneration("c"); ok {
		t.Fatal("the deleted record came back")
	}
}
