package engine

import (
	"context"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// FrameAck statuses (the HTTP status each frame would have had alone).
const (
	frameOK        = 200
	frameDuplicate = 204
	frameInvalid   = 400
)

// Append batch bounds.
const (
	MaxBatchFrames = 512
	MaxBatchBytes  = 32 << 20
)

// appendBatch appends each frame of req as its own append, all in one Raft
// entry.
//
// Rule: every frame is validated before anything is proposed (empty, and
// for JSON streams well-formed JSON, flattened like an append). A frame
// that fails validation is acknowledged with its error (400) and left out;
// the valid frames are proposed together and applied all or none: the
// checks of the whole write (stream state, closure, content type, producer,
// Stream-Seq, Stream-Record-Match) apply to the batch as one write and,
// when they fail, fail the request. A producer tuple covers the proposed
// batch: its retry is a duplicate of the whole batch (each frame is
// acknowledged 204 with the batch's original record range). When no frame
// is valid nothing is proposed.
func (e *Engine) appendBatch(ctx context.Context, k stream.Key, req *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
	frames := req.GetFrames()
	if len(req.GetBody()) > 0 {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "an append batch carries its data in frames, not a body")
	}
	if len(frames) > MaxBatchFrames {
		return nil, fault.Errorf(fault.ErrPayloadTooLarge, "an append batch holds at most %d frames", MaxBatchFrames)
	}
	var total int
	for _, f := range frames {
		total += len(f)
	}
	if total > MaxBatchBytes {
		return nil, fault.Errorf(fault.ErrPayloadTooLarge, "an append batch holds at most %d bytes", MaxBatchBytes)
	}
	if req.GetContentType() == "" {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "Content-Type is required with a body")
	}
	if err := validWriter(req); err != nil {
		return nil, err
	}
	m, err := e.live(k)
	if err != nil {
		return nil, err
	}
	if err := checkIncarnation(m, req.GetIncarnation()); err != nil {
		return nil, err
	}
	acks := make([]*streamv1.FrameAck, len(frames))
	stored := make([][]byte, 0, len(frames))
	idx := make([]int, 0, len(frames))
	for i, f := range frames {
		if len(f) == 0 {
			acks[i] = frameError(fault.Errorf(fault.ErrInvalidArgument, "frame %d is empty", i))
			continue
		}
		if m.JSON {
			s, _, ferr := stream.FlattenJSON(f, false)
			if ferr != nil {
				acks[i] = frameError(ferr)
				continue
			}
			f = s
		}
		stored = append(stored, f)
		idx = append(idx, i)
	}
	resp := &streamv1.AppendResponse{Frames: acks, NextOffset: stream.FormatOffset(m.Tail), Closed: m.Closed,
		RecordStart: m.RecordNext, RecordNext: m.RecordNext, Incarnation: m.Incarnation}
	if len(stored) == 0 {
		return resp, nil
	}
	g := e.GroupOf(k)
	if err := e.cold.AdmitWrite(ctx, g); err != nil {
		return nil, err
	}
	a := &storagev1.Append{
		Bucket: k.Bucket, Stream: k.Stream, ContentType: req.GetContentType(), Frames: stored,
		Close: req.GetClose(), StreamSeq: req.GetStreamSeq(), Incarnation: req.GetIncarnation(),
		RecordMatch: req.RecordMatch,
	}
	if p := req.GetProducer(); p != nil {
		a.Producer = &storagev1.ProducerRef{Id: p.GetId(), Epoch: p.GetEpoch(), Seq: p.GetSeq()}
	}
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_Append{Append: a}})
	if err != nil {
		return nil, err
	}
	resp.NextOffset, resp.Closed = stream.FormatOffset(res.Meta.Tail), res.Meta.Closed
	resp.Duplicate, resp.ProducerEpoch, resp.ProducerSeq = res.Duplicate, res.ProducerEpoch, res.ProducerSeq
	resp.RecordStart, resp.RecordNext = res.RecordStart, res.RecordNext
	for j, i := range idx {
		ack := &streamv1.FrameAck{Status: frameOK, NextOffset: resp.NextOffset, Closed: res.Meta.Closed,
			RecordStart: res.RecordStart, RecordNext: res.RecordNext}
		if res.Duplicate {
			ack.Status = frameDuplicate
		} else if j < len(res.Frames) {
			f := res.Frames[j]
			ack.NextOffset = stream.FormatOffset(f.End)
			ack.RecordStart, ack.RecordNext = f.RecordStart, f.RecordNext
			ack.Closed = res.Meta.Closed && j == len(idx)-1
		}
		acks[i] = ack
	}
	return resp, nil
}

// frameError acknowledges a frame that failed validation. ErrorCode holds
// the storage error kind's name; the node maps it to the contract code.
func frameError(err error) *streamv1.FrameAck {
	ack := &streamv1.FrameAck{Status: frameInvalid, ErrorCode: fault.ErrInvalidArgument.Name(), Error: err.Error()}
	if fe, ok := err.(*fault.Error); ok {
		ack.ErrorCode, ack.Error = fe.Kind.Name(), fe.Message
	}
	return ack
}
