package node

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"

	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// purgeReclaimPasses bounds the GC passes one purge request runs before it
// answers with what is left (a later request goes on).
const purgeReclaimPasses = 64

// purge erases a bucket in every group, reclaims its cold objects and
// proves its prefix empty (DELETE /__ursula/purge/{bucket}). Idempotent:
// send it again until the report is complete. A cold-store failure is
// reported in cold_gc_error, not as an error.
func (s *Server) purge(ctx context.Context, bucket string) (*adminv1.PurgeBucketResponse, error) {
	first, err := s.n.Engine.PurgeBucket(ctx, bucket)
	if err != nil {
		return nil, err
	}
	rep := &adminv1.PurgeBucketResponse{Bucket: bucket, RemovedStreams: first.Removed, GroupsWithStreams: first.GroupsWithStreams}
	s.reportErasure(rep)
	store := s.n.Cold.Store()
	fail := func(err error) (*adminv1.PurgeBucketResponse, error) {
		rep.ColdGcError = proto.String(err.Error())
		return rep, nil
	}
	if store == nil {
		return fail(errors.New("no cold store is configured"))
	}
	if s.n.Cold.GCHeld() {
		// A backup may be copying the bucket's objects: the fence is in
		// place, the objects go once every hold ends.
		return fail(errors.New("cold GC held by a backup: the bucket's objects stay until every hold ends; send the purge again then"))
	}
	worker, err := coldgc.New(coldgc.Config{Interval: time.Second}, coldgcv1.NewColdGCServiceClient(s.local), store, s.logger)
	if err != nil {
		return nil, err
	}
	for range purgeReclaimPasses {
		n, err := worker.Reclaim(ctx, bucket)
		if err != nil {
			return fail(err)
		}
		if n == 0 {
			break
		}
	}
	// The second replicated round proves every group's queue of the
	// bucket empty, linearized after the fence.
	second, err := s.n.Engine.PurgeBucket(ctx, bucket)
	if err != nil {
		return nil, err
	}
	rep.RemovedStreams += second.Removed
	rep.ColdGcEntriesReclaimed = second.GCReclaimed
	rep.ColdGcPendingEntries = second.GCPending
	rep.ColdGcComplete = second.GCPending == 0
	if !rep.ColdGcComplete {
		return rep, nil
	}
	prefix := coldfmt.BucketPrefix(bucket)
	if err := worker.DeletePrefix(ctx, prefix); err != nil {
		return fail(err)
	}
	absent := true
	if err := store.List(ctx, prefix, func(objstore.Info) error {
		absent = false
		return errStopList
	}); err != nil && !errors.Is(err, errStopList) {
		return fail(err)
	}
	rep.BucketPrefixAbsent = absent
	return rep, nil
}

var errStopList = errors.New("stop listing")

// reportErasure adds this replica's progress on the deleted-data bound to
// a purge report: which of the purged groups still hold records here, and
// when the last is due.
func (s *Server) reportErasure(rep *adminv1.PurgeBucketResponse) {
	st := s.n.Cluster.Erasure()
	if !st.Enforced {
		return
	}
	rep.RaftDeletedDataMaxAgeMs = uint64(st.MaxAge.Milliseconds())
	purged := map[uint32]bool{}
	for _, g := range rep.GroupsWithStreams {
		purged[g] = true
	}
	var due time.Time
	for _, d := range st.Groups {
		if !purged[d.Group] {
			continue
		}
		rep.RaftErasurePendingGroups = append(rep.RaftErasurePendingGroups, d.Group)
		if at := d.Since.Add(st.MaxAge); at.After(due) {
			due = at
		}
	}
	if !due.IsZero() {
		rep.RaftErasureDueBy = proto.String(due.UTC().Format(time.RFC3339))
	}
	rep.RaftErasureComplete = len(rep.RaftErasurePendingGroups) == 0
}
