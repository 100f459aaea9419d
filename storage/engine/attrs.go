package engine

import (
	"context"
	"encoding/json"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
)

// MaxAttrsBytes bounds a stream's attributes (title plus metadata).
const MaxAttrsBytes = 16 << 10

// GetAttrs returns a stream's attributes (nil attrs when none are set),
// after a read barrier (any replica answers).
func (e *Engine) GetAttrs(ctx context.Context, req *streamv1.GetAttrsRequest) (*streamv1.GetAttrsResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	m, err := e.readLive(ctx, k)
	if err != nil {
		return nil, err
	}
	a, set, ok := e.machine(k).Attrs(k, m.Incarnation)
	if !ok {
		return nil, fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", k.Stream)
	}
	if !set {
		return &streamv1.GetAttrsResponse{}, nil
	}
	return &streamv1.GetAttrsResponse{Attrs: &streamv1.StreamAttrs{Title: a.Title, Metadata: a.Metadata}}, nil
}

// SetAttrs replaces a stream's attributes; empty attrs clear them. Closed
// streams accept it.
func (e *Engine) SetAttrs(ctx context.Context, req *streamv1.SetAttrsRequest) (*streamv1.SetAttrsResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	a := req.GetAttrs()
	if len(a.GetTitle())+len(a.GetMetadata()) > MaxAttrsBytes {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "attributes exceed %d bytes", MaxAttrsBytes)
	}
	var md []byte
	if raw := a.GetMetadata(); len(raw) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "metadata must be a JSON object")
		}
		if len(obj) > 0 {
			var err error
			if md, err = json.Marshal(obj); err != nil {
				return nil, fault.Errorf(fault.ErrInvalidArgument, "metadata: %v", err)
			}
		}
	}
	m, err := e.live(k)
	if err != nil {
		return nil, err
	}
	if _, err := e.propose(ctx, e.GroupOf(k), &storagev1.Command{Op: &storagev1.Command_SetAttrs{SetAttrs: &storagev1.SetAttrs{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, Title: a.GetTitle(), Metadata: md,
	}}}); err != nil {
		return nil, err
	}
	return &streamv1.SetAttrsResponse{}, nil
}
