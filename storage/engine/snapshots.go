package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// MaxSnapshotBytes bounds the body of a snapshot published in one request.
const MaxSnapshotBytes = 32 << 20

// PutSnapshot publishes a stream's application snapshot at an offset. The
// offset must be a boundary the server issued (see boundary); with a cold
// store the body is uploaded under the stream's prefix before the
// PublishSnapshot command is proposed, otherwise it travels inline.
func (e *Engine) PutSnapshot(ctx context.Context, req *streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	body := req.GetBody()
	if len(body) > MaxSnapshotBytes {
		return nil, fault.Errorf(fault.ErrPayloadTooLarge, "snapshot of %d bytes exceeds %d", len(body), MaxSnapshotBytes)
	}
	var m stream.Meta
	var pos uint64
	var err error
	if req.Record != nil {
		m, pos, err = e.snapshotRecordTarget(ctx, k, req.GetRecord())
	} else {
		m, pos, err = e.snapshotTarget(k, req.GetOffset())
	}
	if err != nil {
		return nil, err
	}
	ct := strings.TrimSpace(req.GetContentType())
	if ct == "" {
		ct = DefaultContentType
	}
	digest := stream.SnapshotDigest(ct, body)
	resp := &streamv1.PutSnapshotResponse{Offset: stream.FormatOffset(pos), Digest: digest}
	g := e.GroupOf(k)
	if cur := e.groups.Machine(g).SnapshotOf(k, m.Incarnation); cur != nil && cur.GetPosition() == pos && cur.GetDigest() == digest {
		return resp, nil // the same snapshot again
	}
	ok, err := e.boundary(ctx, m, pos)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "snapshot offset %s is not an append or message boundary", req.GetOffset())
	}
	ref := &storagev1.SnapshotRef{Position: pos, Digest: digest, ContentType: ct, Size: uint64(len(body))}
	if e.cold.Enabled() {
		ref.Key = coldfmt.SnapshotKey(coldfmt.StreamPrefix(k.Bucket, k.Stream, m.Incarnation), pos, digest)
		if err := e.cold.Put(ctx, ref.Key, body, "snapshot"); err != nil {
			return nil, err
		}
	} else {
		ref.Data = body
	}
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_PublishSnapshot{PublishSnapshot: &storagev1.PublishSnapshot{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, Snapshot: ref, Match: req.GetMatch(),
		GraceMs: e.cold.Config().GCGrace.Milliseconds(),
	}}})
	if ref.Key != "" && (err != nil || res.Duplicate) && !mayHaveCommitted(res, err) {
		e.cold.Discard(ref.Key) // not committed: nothing names it
	}
	if err != nil {
		return nil, err
	}
	resp.Created = !res.Duplicate
	return resp, nil
}

// boundary decides whether pos is an offset the server could have issued
// for m's view: 0, the tail, the retention, the end of an append, or (JSON)
// the end of a message. Below a fork's base the source decides; cold
// positions are checked against the chunk's record ends (or its bytes).
func (e *Engine) boundary(ctx context.Context, m stream.Meta, pos uint64) (bool, error) {
	for depth := 0; depth < 1024; depth++ {
		if pos == 0 || pos == m.Tail || pos == m.Retained {
			return true, nil
		}
		if pos >= m.Base {
			ok, ref, found := e.machine(m.Key).Boundary(m.Key, m.Incarnation, pos)
			if !found {
				return false, fault.Errorf(fault.ErrStreamNotFound, "stream %s was deleted", m.Key.Stream)
			}
			if ok || ref == nil {
				return ok, nil
			}
			return e.cold.Boundary(ctx, m, ref, pos)
		}
		f := m.Fork
		if f == nil {
			return false, nil
		}
		sk := stream.Key{Bucket: f.GetSourceBucket(), Stream: f.GetSourceStream()}
		src, ok := e.machine(sk).Lookup(sk)
		if !ok || !src.HoldsHistory(f.GetSourceIncarnation(), m.Base) {
			return false, nil
		}
		m = src
	}
	return false, nil
}

// GetSnapshot returns the stream's latest snapshot (or the one at an
// offset: any other offset is SNAPSHOT_NOT_FOUND) with the stream's state,
// on the group's leader after a read barrier so that the state is fresh.
// A snapshot committed from staged parts comes one part per call
// (req.Part; resp.Parts says how many).
func (e *Engine) GetSnapshot(ctx context.Context, req *streamv1.GetSnapshotRequest) (*streamv1.GetSnapshotResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if !e.leads(k) {
		return nil, e.notLeader(k)
	}
	m, err := e.readLive(ctx, k)
	if err != nil {
		return nil, err
	}
	snap := e.machine(k).SnapshotOf(k, m.Incarnation)
	if snap == nil {
		return nil, fault.Errorf(fault.ErrSnapshotNotFound, "stream %s has no snapshot", k.Stream)
	}
	if raw := req.GetOffset(); raw != "" {
		off, err := stream.ParseOffset(raw)
		if err != nil {
			return nil, err
		}
		if off.Start || off.Now || off.Pos != snap.GetPosition() {
			return nil, fault.Errorf(fault.ErrSnapshotNotFound, "stream %s has no snapshot at %s", k.Stream, raw)
		}
	}
	// A snapshot committed from staged parts is read a part per call
	// (part 0 is the first), so no message holds more than a part.
	parts := uint32(max(len(snap.GetPartKeys()), 1))
	n := max(req.GetPart(), 1)
	if n > parts {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the snapshot of %s has %d parts, not %d", k.Stream, parts, n)
	}
	body, key, size := snap.GetData(), snap.GetKey(), int64(snap.GetSize())
	// The snapshot's committed digest verifies what the store returns: of
	// the whole body, or of the part (a commit checked every part's).
	check := func(b []byte) error {
		if got := stream.SnapshotDigest(snap.GetContentType(), b); got != snap.GetDigest() {
			return fmt.Errorf("%w: snapshot digest %s, committed %s", coldfmt.ErrCorrupt, got, snap.GetDigest())
		}
		return nil
	}
	what := "the snapshot"
	if len(snap.GetPartKeys()) > 0 {
		key, size = snap.GetPartKeys()[n-1], int64(snap.GetPartSizes()[n-1])
		what = fmt.Sprintf("part %d of the snapshot", n)
		want := ""
		if int(n) <= len(snap.GetPartDigests()) {
			want = snap.GetPartDigests()[n-1]
		}
		check = func(b []byte) error {
			sum := sha256.Sum256(b)
			if got := hex.EncodeToString(sum[:]); got != want {
				return fmt.Errorf("%w: snapshot part digest %s, committed %s", coldfmt.ErrCorrupt, got, want)
			}
			return nil
		}
	}
	if key != "" {
		if body, err = e.cold.Get(ctx, k, key, size, what, check); err != nil {
			return nil, err
		}
	}
	upToDate := snap.GetPosition() >= m.Tail
	return &streamv1.GetSnapshotResponse{
		Offset:      stream.FormatOffset(snap.GetPosition()),
		Digest:      snap.GetDigest(),
		ContentType: snap.GetContentType(),
		Body:        body,
		NextOffset:  stream.FormatOffset(m.Tail),
		UpToDate:    upToDate,
		Closed:      m.Closed,
		Parts:       parts,
		Size:        snap.GetSize(),
	}, nil
}

// snapshotInfo adds the latest snapshot's offset and digest to in.
func (e *Engine) snapshotInfo(m stream.Meta, in *streamv1.StreamInfo) *streamv1.StreamInfo {
	if snap := e.machine(m.Key).SnapshotOf(m.Key, m.Incarnation); snap != nil {
		in.SnapshotOffset = stream.FormatOffset(snap.GetPosition())
		in.SnapshotDigest = snap.GetDigest()
	}
	return in
}

// mayHaveCommitted reports whether a proposal that failed (or answered a
// duplicate) may still have committed what it named: it was not answered
// by the state machine, and its failure does not prove it never reached
// the log. Objects only such a proposal names must stay (the orphan sweep
// takes them if nothing does).
func mayHaveCommitted(res *stream.Result, err error) bool {
	if res != nil {
		return false
	}
	k := fault.KindOf(err)
	return k == nil || k == fault.ErrOutcomeUnknown
}
