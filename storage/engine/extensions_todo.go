package engine

import (
	"context"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
)

// Protocol-extension calls not built yet (issue 6): each answers
// UNIMPLEMENTED until its feature lands.

// PutSnapshot is not built yet.
func (e *Engine) PutSnapshot(context.Context, *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "PutSnapshot is not implemented yet")
}

// GetSnapshot is not built yet.
func (e *Engine) GetSnapshot(context.Context, *streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "GetSnapshot is not implemented yet")
}

// GetAttrs is not built yet.
func (e *Engine) GetAttrs(context.Context, *streamv1.GetAttrsRequest) (*streamv1.GetAttrsResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "GetAttrs is not implemented yet")
}

// SetAttrs is not built yet.
func (e *Engine) SetAttrs(context.Context, *streamv1.SetAttrsRequest) (*streamv1.SetAttrsResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "SetAttrs is not implemented yet")
}

// GetBucket is not built yet.
func (e *Engine) GetBucket(context.Context, *streamv1.GetBucketRequest) (*streamv1.GetBucketResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "GetBucket is not implemented yet")
}

// DeleteBucket is not built yet.
func (e *Engine) DeleteBucket(context.Context, *streamv1.DeleteBucketRequest) (*streamv1.DeleteBucketResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "DeleteBucket is not implemented yet")
}

// ListStreams is not built yet.
func (e *Engine) ListStreams(context.Context, *streamv1.ListStreamsRequest) (*streamv1.ListStreamsResponse, error) {
	return nil, errcode.New(errcode.Unimplemented, "ListStreams is not implemented yet")
}
