package engine

import (
	"context"
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// Stream listing page sizes.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// GetBucket describes a bucket: when it was created and how many streams
// it holds, after a read barrier of every group.
func (e *Engine) GetBucket(ctx context.Context, req *streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error) {
	b := req.GetBucket()
	if err := validBucketName(b); err != nil {
		return nil, err
	}
	if err := e.readBarrierAll(ctx); err != nil {
		return nil, err
	}
	if !e.hasBucket(b) {
		return nil, bucketNotFound(b)
	}
	created, _ := e.groups.Machine(bucketGroup).BucketCreated(b)
	var n uint64
	for g := range e.groups.GroupCount() {
		m := e.groups.Machine(uint32(g))
		n += uint64(m.CountStreams(b))
	}
	return &streamv1.GetBucketResponse{Bucket: b, CreatedMs: created, StreamCount: n}, nil
}

// DeleteBucket removes an empty bucket, in two phases so that no stream
// create in another group can race it (stream/buckets.go):
//
//  1. A deletion fence of the bucket record's generation is proposed in
//     every group (at most maxParallelBarriers at a time). Once it applied
//     in a group, a create of that record in the group either applied
//     before it or is refused.
//  2. After a read barrier of every group, every group is checked for
//     streams of the bucket. None, and DeleteBucket is proposed in the
//     bucket group, whose apply checks that group's streams again; the
//     fences stay (they refuse only creates of the deleted record). Some,
//     and the fences are lifted and the delete answers BUCKET_NOT_EMPTY.
//
// A create refused by a fence while the delete runs answers UNAVAILABLE
// with a retry-after when the delete then fails, BUCKET_NOT_FOUND when it
// succeeded. A delete that stops between the phases (its node fails)
// leaves fences that refuse creates in the bucket, answered UNAVAILABLE,
// until a DELETE is retried: it fences again and completes or lifts them.
func (e *Engine) DeleteBucket(ctx context.Context, req *streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) {
	b := req.GetBucket()
	if err := validBucketName(b); err != nil {
		return nil, err
	}
	if err := e.readBarrierAll(ctx); err != nil {
		return nil, err
	}
	gen, ok := e.groups.Machine(bucketGroup).BucketGeneration(b)
	if !ok {
		return nil, bucketNotFound(b)
	}
	// A bucket already holding streams needs no fence to fail.
	if e.bucketStreams(b) {
		return nil, bucketNotEmpty(b)
	}
	if !e.fencesAllowed() {
		// Below the fences' feature level (an upgraded cluster not raised
		// yet) a create racing the delete in another group may land in
		// the deleted bucket.
		return e.deleteBucketRecord(ctx, b)
	}
	fence := &storagev1.FenceBucket{Bucket: b, Generation: gen}
	if err := e.proposeAll(ctx, &storagev1.Command{Op: &storagev1.Command_FenceBucket{FenceBucket: fence}}); err != nil {
		return nil, err // fences that applied are lifted by a retried delete
	}
	if err := e.readBarrierAll(ctx); err != nil {
		return nil, err
	}
	if e.bucketStreams(b) {
		lift := &storagev1.FenceBucket{Bucket: b, Generation: gen, Lift: true}
		if err := e.proposeAll(context.WithoutCancel(ctx), &storagev1.Command{Op: &storagev1.Command_FenceBucket{FenceBucket: lift}}); err != nil {
			e.logger.Warn("lift bucket-delete fences", "bucket", b, "err", err)
		}
		return nil, bucketNotEmpty(b)
	}
	return e.deleteBucketRecord(ctx, b)
}

func (e *Engine) deleteBucketRecord(ctx context.Context, b string) (*streamv1.DeleteBucketResponse, error) {
	if _, err := e.propose(ctx, bucketGroup, &storagev1.Command{Op: &storagev1.Command_DeleteBucket{DeleteBucket: &storagev1.DeleteBucket{Bucket: b}}}); err != nil {
		return nil, err
	}
	return &streamv1.DeleteBucketResponse{}, nil
}

// fencesAllowed reports whether every group is at the feature level of
// the bucket-delete fences (on this node's replicas, after the delete's
// read barrier: levels never go down).
func (e *Engine) fencesAllowed() bool {
	for g := range e.groups.GroupCount() {
		if e.groups.Machine(uint32(g)).FeatureLevel() < stream.BucketFenceLevel {
			return false
		}
	}
	return true
}

// bucketStreams reports whether any group's replica on this node holds a
// stream of bucket b.
func (e *Engine) bucketStreams(b string) bool {
	for g := range e.groups.GroupCount() {
		if e.groups.Machine(uint32(g)).CountStreams(b) > 0 {
			return true
		}
	}
	return false
}

func bucketNotEmpty(b string) error {
	return fault.Errorf(fault.ErrBucketExists, "bucket %s is not empty", b)
}

// proposeAll proposes cmd in every group (forwarded to each group's
// leader), at most maxParallelBarriers at a time; it returns the first
// failure.
func (e *Engine) proposeAll(ctx context.Context, cmd *storagev1.Command) error {
	return e.eachGroup(ctx, func(ctx context.Context, g uint32) error {
		// Propose stamps the command with the time: one copy each.
		_, err := e.propose(ctx, g, proto.CloneOf(cmd))
		return err
	})
}

// ListStreams lists a bucket's streams in id order: those whose id starts
// with prefix and sorts after the cursor, at most limit (1..1000, 0 meaning
// 100), after a read barrier of every group. Expired streams not yet
// removed are left out.
func (e *Engine) ListStreams(ctx context.Context, req *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
	b := req.GetBucket()
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = defaultListLimit
	}
	if limit > maxListLimit {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "limit must be 1 to %d", maxListLimit)
	}
	if !builtinBucket(b) {
		if err := validBucketName(b); err != nil {
			return nil, err
		}
	}
	if err := e.readBarrierAll(ctx); err != nil {
		return nil, err
	}
	if !e.hasBucket(b) {
		return nil, bucketNotFound(b)
	}
	now := e.nowMs()
	var all []stream.Listing
	for g := range e.groups.GroupCount() {
		all = append(all, e.groups.Machine(uint32(g)).ListStreams(b, req.GetPrefix(), req.GetAfter(), limit+1, now)...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Meta.Key.Stream < all[j].Meta.Key.Stream })
	resp := &streamv1.ListStreamsResponse{}
	if len(all) > limit {
		all = all[:limit]
		resp.HasMore = true
	}
	for _, l := range all {
		status := "open"
		switch {
		case l.Meta.SoftDeleted:
			status = "deleted"
		case l.Meta.Closed:
			status = "closed"
		}
		resp.Streams = append(resp.Streams, &streamv1.StreamListing{
			StreamId: l.Meta.Key.Stream, Status: status, ContentType: l.Meta.ContentType,
			TailOffset: stream.FormatOffset(l.Meta.Tail), CreatedAtMs: l.CreatedMs, LastWriteAtMs: l.LastWriteMs,
		})
	}
	if resp.HasMore {
		resp.NextCursor = all[len(all)-1].Meta.Key.Stream
	}
	return resp, nil
}
