package engine

import (
	"context"
	"sort"

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

// DeleteBucket removes an empty bucket. Every group is checked for streams
// of the bucket after a read barrier (so each replica reflects every write
// acknowledged before the check began), then DeleteBucket is proposed in
// the bucket group, whose apply checks that group's streams again.
//
// Accepted race: a stream create in another group that passed its bucket
// check before the delete committed, and commits after that group was
// checked, survives the bucket. The stream stays readable, writable and
// deletable by its name, a new create of the bucket shows it again in
// listings, and a bucket purge removes it. Closing the race would need a
// cross-group lock on every create; a delete of a bucket that is being
// written to is a client error this does not try to make atomic.
func (e *Engine) DeleteBucket(ctx context.Context, req *streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) {
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
	for g := range e.groups.GroupCount() {
		if n := e.groups.Machine(uint32(g)).CountStreams(b); n > 0 {
			return nil, fault.Errorf(fault.ErrBucketExists, "bucket %s is not empty", b)
		}
	}
	if _, err := e.propose(ctx, bucketGroup, &storagev1.Command{Op: &storagev1.Command_DeleteBucket{DeleteBucket: &storagev1.DeleteBucket{Bucket: b}}}); err != nil {
		return nil, err
	}
	return &streamv1.DeleteBucketResponse{}, nil
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
