package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// gatedGroups is the Groups seam with a gate in front of Propose: a test
// holds a command there to interleave two requests at a chosen point.
type gatedGroups struct {
	Groups
	gate func(g uint32, cmd *storagev1.Command)
}

func (gg *gatedGroups) Propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error) {
	gg.gate(g, cmd)
	return gg.Groups.Propose(ctx, g, cmd)
}

// gatedEngine is a second request engine over te's groups whose proposals
// of the operations hold matches wait at the gate: the returned function
// waits until one arrived and returns a function that lets it go on.
func gatedEngine(te *testEngine, hold func(g uint32, cmd *storagev1.Command) bool) (*Engine, func() (release func())) {
	arrived, proceed := make(chan struct{}), make(chan struct{})
	gg := &gatedGroups{Groups: te.node.Cluster, gate: func(g uint32, cmd *storagev1.Command) {
		if hold(g, cmd) {
			arrived <- struct{}{}
			<-proceed
		}
	}}
	e := newRequestEngine(te.Config(), gg, te.node.Cold, te.now, te.logger)
	return e, func() func() {
		<-arrived
		return func() { close(proceed) }
	}
}

func isCreate(_ uint32, cmd *storagev1.Command) bool { return cmd.GetCreateStream() != nil }

// streamOutsideGroup0 is a stream name of bucket whose group is not the
// bucket group, so the create and the delete's last step run in different
// groups.
func streamOutsideGroup0(tb testing.TB, e *Engine, bucket string) string {
	tb.Helper()
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if e.GroupOf(stream.Key{Bucket: bucket, Stream: name}) != bucketGroup {
			return name
		}
	}
	tb.Fatal("every name is in group 0")
	return ""
}

// TestBucketDeleteRacesCreate interleaves a bucket delete with a stream
// create in another group at the three points that matter, without timing:
// the create has checked its bucket and waits at its proposal while the
// delete runs, or the delete waits at a step while the create runs.
// Before deletion fences, the first case left a stream in a deleted bucket.
func TestBucketDeleteRacesCreate(t *testing.T) {
	ctx := t.Context()
	te := startEngine(t, nil)
	const b = "race"
	tref := func(s string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: b, Stream: s} }
	s := streamOutsideGroup0(t, te.Engine, b)
	g := te.GroupOf(stream.Key{Bucket: b, Stream: s})
	create := func() {
		t.Helper()
		if _, err := te.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: b}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("create checked, delete completes, create proposes", func(t *testing.T) {
		create()
		creator, wait := gatedEngine(te, isCreate)
		done := make(chan error, 1)
		go func() {
			_, err := creator.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)})
			done <- err
		}()
		release := wait() // the create saw the bucket and is about to propose
		if _, err := te.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b}); err != nil {
			t.Fatalf("delete the empty bucket: %v", err)
		}
		release()
		wantCode(t, "the create after the delete", <-done, fault.ErrBucketNotFound)
		if _, ok := te.node.Cluster.Machine(g).Lookup(stream.Key{Bucket: b, Stream: s}); ok {
			t.Fatal("a stream survived its deleted bucket")
		}
	})

	t.Run("bucket created again, then a create of the old record", func(t *testing.T) {
		// The fence of the deleted record stays; a create that checked the
		// new record passes it.
		create()
		if _, err := te.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)}); err != nil {
			t.Fatalf("create in the re-created bucket: %v", err)
		}
		if _, ok := te.node.Cluster.Machine(g).BucketFence(b); ok {
			t.Fatal("the fence stayed after a create of a newer record passed it")
		}
		if _, err := te.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: tref(s)}); err != nil {
			t.Fatal(err)
		}
		if _, err := te.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("create applies before the fence: the delete fails", func(t *testing.T) {
		create()
		// Hold the delete's fence of the create's group; the create applies
		// meanwhile.
		deleter, wait := gatedEngine(te, func(fg uint32, cmd *storagev1.Command) bool {
			return fg == g && cmd.GetFenceBucket() != nil && !cmd.GetFenceBucket().GetLift()
		})
		done := make(chan error, 1)
		go func() {
			_, err := deleter.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b})
			done <- err
		}()
		release := wait()
		if _, err := te.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)}); err != nil {
			t.Fatalf("create before the fence: %v", err)
		}
		release()
		wantCode(t, "the delete of a bucket a create reached first", <-done, fault.ErrBucketExists)
		for gi := range te.GroupCount() {
			if _, ok := te.node.Cluster.Machine(uint32(gi)).BucketFence(b); ok {
				t.Fatalf("group %d kept the fence of a failed delete", gi)
			}
		}
		if !te.node.Cluster.Machine(bucketGroup).HasBucket(b) {
			t.Fatal("the failed delete removed the bucket")
		}
		if _, err := te.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: tref(s)}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("create while the delete is between its phases", func(t *testing.T) {
		// The delete has fenced every group and checked them; it waits at
		// its last step. A create now is refused as retryable, and after
		// the delete the bucket is gone for it.
		deleter, wait := gatedEngine(te, func(_ uint32, cmd *storagev1.Command) bool { return cmd.GetDeleteBucket() != nil })
		done := make(chan error, 1)
		go func() {
			_, err := deleter.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b})
			done <- err
		}()
		release := wait()
		_, err := te.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)})
		wantCode(t, "a create during the delete", err, fault.ErrUnavailable)
		release()
		if err := <-done; err != nil {
			t.Fatalf("delete: %v", err)
		}
		_, err = te.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)})
		wantCode(t, "a create after the delete", err, fault.ErrBucketNotFound)
	})
}

// TestBucketFenceSurvivesRestart: the fences and the bucket generations
// are replicated state, in snapshots too (the test configuration snapshots
// every 16 entries), so a restarted replica refuses the same creates.
func TestBucketFenceSurvivesRestart(t *testing.T) {
	ctx := t.Context()
	te := startEngine(t, nil)
	const b = "fenced"
	if _, err := te.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: b}); err != nil {
		t.Fatal(err)
	}
	gen, _ := te.node.Cluster.Machine(bucketGroup).BucketGeneration(b)
	if gen == 0 {
		t.Fatal("a new bucket record has generation 0")
	}
	if _, err := te.DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b}); err != nil {
		t.Fatal(err)
	}
	for range 40 { // past the snapshot threshold of every group touched
		mustCreate(t, te, &streamv1.CreateStreamRequest{Ref: ref("fill")})
		if _, err := te.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref("fill")}); err != nil {
			t.Fatal(err)
		}
	}
	te = restart(t, te, nil)
	s := streamOutsideGroup0(t, te.Engine, b)
	g := te.GroupOf(stream.Key{Bucket: b, Stream: s})
	if f, ok := te.node.Cluster.Machine(g).BucketFence(b); !ok || f != gen {
		t.Fatalf("fence after restart = %d, %v; want %d", f, ok, gen)
	}
	_, err := te.node.Cluster.Propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_CreateStream{CreateStream: &storagev1.CreateStream{
		Bucket: b, Stream: s, ContentType: DefaultContentType, BucketGeneration: gen,
	}}})
	wantCode(t, "a create of the deleted record after a restart", err, fault.ErrBucketNotFound)
}

// TestClusterBuckets runs the bucket operations that span every group on
// a three-node cluster, where the groups' leaders are spread over the
// nodes: one node answers a listing from every group (its own replicas
// after a read barrier of each), and a bucket delete fences the groups
// other nodes lead through forwarded proposals.
func TestClusterBuckets(t *testing.T) {
	ctx := t.Context()
	c := startCluster(t, 3)
	const b = "spread"
	tref := func(s string) *streamv1.StreamRef { return &streamv1.StreamRef{Bucket: b, Stream: s} }
	lead0 := c.waitLeader(t, bucketGroup)
	if _, err := c.engines[lead0].CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: b}); err != nil {
		t.Fatal(err)
	}
	c.spreadLeaders(t)
	// Streams in groups led by every node: each created on its leader.
	leaders := map[uint64]bool{}
	var names []string
	for i := 0; len(names) < 12 || len(leaders) < 3; i++ {
		name := fmt.Sprintf("s%03d", i)
		g := c.engines[1].GroupOf(stream.Key{Bucket: b, Stream: name})
		l := c.waitLeader(t, g)
		if _, err := c.engines[l].CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(name)}); err != nil {
			t.Fatalf("create %s on the leader of group %d: %v", name, g, err)
		}
		leaders[l] = true
		names = append(names, name)
		if i > 200 {
			t.Fatal("the groups' leaders are not spread over the nodes")
		}
	}

	t.Run("one node lists every group", func(t *testing.T) {
		for id, e := range c.engines {
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				resp, err := e.ListStreams(ctx, &streamv1.ListStreamsRequest{Bucket: b, After: after, Limit: 5})
				if err != nil {
					t.Fatalf("node %d: %v", id, err)
				}
				for _, s := range resp.GetStreams() {
					got = append(got, s.GetStreamId())
				}
				if !resp.GetHasMore() {
					break
				}
				if pages > len(names) {
					t.Fatalf("node %d: too many pages", id)
				}
				after = resp.GetNextCursor()
			}
			if !slices.Equal(got, names) {
				t.Fatalf("node %d listed %v, want %v", id, got, names)
			}
		}
	})

	t.Run("delete races a create on another node", func(t *testing.T) {
		for _, n := range names {
			g := c.engines[1].GroupOf(stream.Key{Bucket: b, Stream: n})
			if _, err := c.engines[c.waitLeader(t, g)].DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: tref(n)}); err != nil {
				t.Fatal(err)
			}
		}
		lead0 := c.waitLeader(t, bucketGroup)
		var s string
		var sl uint64
		for i := 0; s == ""; i++ {
			name := fmt.Sprintf("late%d", i)
			if l := c.waitLeader(t, c.engines[1].GroupOf(stream.Key{Bucket: b, Stream: name})); l != lead0 {
				s, sl = name, l
			}
		}
		creator, wait := gatedEngine(c.engines[sl], isCreate)
		done := make(chan error, 1)
		go func() {
			_, err := creator.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: tref(s)})
			done <- err
		}()
		release := wait()
		if _, err := c.engines[lead0].DeleteBucket(ctx, &streamv1.DeleteBucketRequest{Bucket: b}); err != nil {
			t.Fatalf("delete the empty bucket: %v", err)
		}
		release()
		wantCode(t, "the create after the delete", <-done, fault.ErrBucketNotFound)
		g := c.engines[1].GroupOf(stream.Key{Bucket: b, Stream: s})
		for id, e := range c.engines {
			if err := e.node.Cluster.ReadBarrier(ctx, g); err != nil {
				t.Fatal(err)
			}
			if _, ok := e.node.Cluster.Machine(g).Lookup(stream.Key{Bucket: b, Stream: s}); ok {
				t.Fatalf("node %d holds a stream of the deleted bucket", id)
			}
		}
	})
}
