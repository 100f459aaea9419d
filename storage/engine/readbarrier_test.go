package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/tests/await"
)

// readIndexReads sums the read-index requests every node's Raft host
// served.
func (c *memCluster) readIndexReads() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var n uint64
	for _, e := range c.engines {
		for _, st := range e.node.Cluster.ShardStats() {
			n += st.ReadIndexReads
		}
	}
	return n
}

// TestClusterLinearizableReads: every read a client observes passes a read
// barrier; a follower's read reflects writes it had not received when the
// read began, and a leader cut off from its quorum answers UNAVAILABLE
// rather than stale state.
func TestClusterLinearizableReads(t *testing.T) {
	c := startCluster(t, 3)
	lead0 := c.waitLeader(t, bucketGroup)
	if _, err := c.engines[lead0].CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		t.Fatal(err)
	}

	t.Run("every read passes a read barrier", func(t *testing.T) {
		name := c.streamWhere(t, "r", func(uint32, uint64) bool { return true })
		le := c.engines[c.leaderOf(c.engines[1].GroupOf(key(name)))]
		mustCreate(t, le, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "text/plain", HasBody: true, Body: []byte("a")})
		reads := []struct {
			name string
			op   func(ctx context.Context) error
		}{
			{"read", func(ctx context.Context) error {
				_, err := le.Read(ctx, &streamv1.ReadRequest{Ref: ref(name)})
				return err
			}},
			{"subscribe", func(ctx context.Context) error {
				stop := errors.New("first chunk")
				err := le.Subscribe(ctx, &streamv1.SubscribeRequest{Ref: ref(name)}, func(*streamv1.ReadResponse) error { return stop })
				if errors.Is(err, stop) {
					return nil
				}
				return err
			}},
			{"head", func(ctx context.Context) error {
				_, err := le.Head(ctx, &streamv1.HeadRequest{Ref: ref(name)})
				return err
			}},
			{"attributes", func(ctx context.Context) error {
				_, err := le.GetAttrs(ctx, &streamv1.GetAttrsRequest{Ref: ref(name)})
				return err
			}},
			{"snapshot", func(ctx context.Context) error {
				_, err := le.GetSnapshot(ctx, &streamv1.GetSnapshotRequest{Ref: ref(name)})
				if codeOf(err) == fault.ErrSnapshotNotFound {
					return nil
				}
				return err
			}},
			{"bucket", func(ctx context.Context) error {
				_, err := le.GetBucket(ctx, &streamv1.GetBucketRequest{Bucket: testBucket})
				return err
			}},
			{"list", func(ctx context.Context) error {
				_, err := le.ListStreams(ctx, &streamv1.ListStreamsRequest{Bucket: testBucket})
				return err
			}},
		}
		for _, r := range reads {
			t.Run(r.name, func(t *testing.T) {
				before := c.readIndexReads()
				if err := r.op(t.Context()); err != nil {
					t.Fatal(err)
				}
				if c.readIndexReads() == before {
					t.Fatal("answered without asking any leader for a read index")
				}
			})
		}
	})

	t.Run("a lagging follower's read reflects the acknowledged write", func(t *testing.T) {
		name := c.streamWhere(t, "f", func(uint32, uint64) bool { return true })
		g := c.engines[1].GroupOf(key(name))
		lead := c.leaderOf(g)
		le := c.engines[lead]
		mustCreate(t, le, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "text/plain", HasBody: true, Body: []byte("old")})
		var f uint64
		for id := range c.engines {
			if id != lead {
				f = id
			}
		}
		fe := c.engines[f]
		await.True(t, "the follower to hold the stream", func() bool {
			m, ok := fe.machine(key(name)).Lookup(key(name))
			return ok && m.Tail == 3
		})
		// The follower receives no appends: the write commits on the
		// leader and the other follower only.
		drop := func(d delivery) bool {
			return d.group == g && d.to == f && (d.msg.GetType() == pb.MsgApp || d.msg.GetType() == pb.MsgSnap)
		}
		c.drop.Store(&drop)
		mustAppend(t, le, name, "text/plain", "+new")
		if m, _ := fe.machine(key(name)).Lookup(key(name)); m.Tail != 3 {
			t.Fatalf("the follower applied the write (tail %d) though its appends were dropped", m.Tail)
		}
		got := make(chan string, 1)
		go func() {
			resp, err := fe.Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), NoTouch: true})
			got <- fmt.Sprintf("%s %v", resp.GetData(), err)
		}()
		c.drop.Store(nil)
		if s := <-got; s != "old+new <nil>" {
			t.Fatalf("the follower read %q, want the acknowledged write", s)
		}
	})

	t.Run("a leader cut off from its quorum serves no stale read", func(t *testing.T) {
		name := c.streamWhere(t, "i", func(uint32, uint64) bool { return true })
		g := c.engines[1].GroupOf(key(name))
		old := c.leaderOf(g)
		mustCreate(t, c.engines[old], &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "text/plain", HasBody: true, Body: []byte("a")})
		cut := func(d delivery) bool { return d.group == g && (d.from == old || d.to == old) }
		c.drop.Store(&cut)
		defer c.drop.Store(nil)
		// The others elect a leader and acknowledge a write the old
		// leader never receives.
		await.True(t, "a write through a new leader", func() bool {
			for id, e := range c.engines {
				if id != old && e.status(g).IsLeader {
					_, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref(name), ContentType: "text/plain", Body: []byte("b")})
					return err == nil
				}
			}
			return false
		})
		resp, err := c.engines[old].Read(t.Context(), &streamv1.ReadRequest{Ref: ref(name), NoTouch: true})
		if err == nil {
			t.Fatalf("the cut-off leader served %q", resp.GetData())
		}
		wantCode(t, "read on the cut-off leader", err, fault.ErrUnavailable)
		if err.(*fault.Error).Details[fault.DetailRetryAfterMS] == "" {
			t.Fatalf("UNAVAILABLE without retry_after_ms: %v", err)
		}
	})
}
