package engine

import (
	"context"
	"crypto/sha256"
	"slices"
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// Snapshots above MaxSnapshotBytes go up in staged parts (package cold
// keeps them until a commit names them).

// MaxSnapshotPartBytes bounds one staged part.
const MaxSnapshotPartBytes = MaxSnapshotBytes

// snapshotTarget checks a snapshot offset against the stream as its leader
// knows it: beyond the tail 409, below the retention 410.
func (e *Engine) snapshotTarget(k stream.Key, raw string) (stream.Meta, uint64, error) {
	off, err := stream.ParseOffset(raw)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	if off.Start || off.Now {
		return stream.Meta{}, 0, fault.Errorf(fault.ErrInvalidArgument, "a snapshot offset must be an offset the server issued, not %q", raw)
	}
	m, err := e.live(k)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	if off.Pos > m.Tail {
		return stream.Meta{}, 0, fault.Errorf(fault.ErrSnapshotConflict, "snapshot offset %s is beyond the tail %s", raw, stream.FormatOffset(m.Tail))
	}
	if off.Pos < m.Retained {
		return stream.Meta{}, 0, stream.Trimmed(m, off.Pos)
	}
	return m, off.Pos, nil
}

// snapshotRecordTarget resolves a snapshot's JSON record coordinate
// (?record=N) to the position where record n starts, with the checks of
// snapshotTarget: beyond the record tail SNAPSHOT_CONFLICT, below the
// first retained record OFFSET_TRIMMED.
func (e *Engine) snapshotRecordTarget(ctx context.Context, k stream.Key, n uint64) (stream.Meta, uint64, error) {
	m, err := e.live(k)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	if !m.JSON {
		return stream.Meta{}, 0, fault.Errorf(fault.ErrInvalidArgument, "record coordinates need an application/json stream")
	}
	if n > m.RecordNext {
		return stream.Meta{}, 0, fault.Errorf(fault.ErrSnapshotConflict, "snapshot record %d is beyond the record tail %d", n, m.RecordNext).
			With(fault.DetailRecordNext, uintString(m.RecordNext))
	}
	if n < m.RecordFirst {
		return stream.Meta{}, 0, recordTrimmed(m, n)
	}
	pos, err := e.recordPos(ctx, m, n)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	return m, pos, nil
}

// PutSnapshotPart stages part n of a snapshot at an offset in the cold
// store (replacing any earlier upload of that part) and returns the part's
// SHA-256. It runs on the group's leader; nothing is replicated.
func (e *Engine) PutSnapshotPart(ctx context.Context, req *streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if !e.cold.Enabled() {
		return nil, fault.Errorf(fault.ErrNoColdStore, "staged snapshot parts need a cold store")
	}
	n := req.GetPart()
	if n < 1 || n > cold.MaxSnapshotParts {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "part number %d is outside 1..%d", n, cold.MaxSnapshotParts)
	}
	body := req.GetBody()
	if len(body) == 0 {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "a snapshot part holds at least one byte")
	}
	if len(body) > MaxSnapshotPartBytes {
		return nil, fault.Errorf(fault.ErrPayloadTooLarge, "snapshot part of %d bytes exceeds %d", len(body), MaxSnapshotPartBytes)
	}
	if !e.leads(k) {
		return nil, e.notLeader(k)
	}
	m, pos, err := e.snapshotTarget(k, req.GetOffset())
	if err != nil {
		return nil, err
	}
	g := e.GroupOf(k)
	digest, err := e.cold.StagePart(ctx, g, e.groups.Status(g).Term, k, m.Incarnation, pos, n, body)
	if err != nil {
		return nil, err
	}
	return &streamv1.PutSnapshotPartResponse{Digest: digest}, nil
}

// CommitSnapshot publishes the staged parts 1..N at an offset as one
// snapshot: the parts must be staged with the digests the request names,
// and the snapshot's digest is computed over the parts read back from the
// store a window at a time. The offset and match checks are PutSnapshot's.
func (e *Engine) CommitSnapshot(ctx context.Context, req *streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if !e.cold.Enabled() {
		return nil, fault.Errorf(fault.ErrNoColdStore, "staged snapshot parts need a cold store")
	}
	want := req.GetParts()
	if len(want) == 0 || len(want) > cold.MaxSnapshotParts {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "a commit names 1 to %d parts, not %d", cold.MaxSnapshotParts, len(want))
	}
	digests := make([]string, len(want))
	for i, p := range want {
		if p.GetPart() != uint32(i+1) {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "parts must be 1..%d in order: entry %d is part %d", len(want), i+1, p.GetPart())
		}
		if !validDigest(p.GetDigest()) {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "part %d: digest %q is not a lower-case hex SHA-256", p.GetPart(), p.GetDigest())
		}
		digests[i] = p.GetDigest()
	}
	if !e.leads(k) {
		return nil, e.notLeader(k)
	}
	m, pos, err := e.snapshotTarget(k, req.GetOffset())
	if err != nil {
		return nil, err
	}
	ct := strings.TrimSpace(req.GetContentType())
	if ct == "" {
		ct = DefaultContentType
	}
	g := e.GroupOf(k)
	mach := e.groups.Machine(g)
	resp := &streamv1.CommitSnapshotResponse{Offset: stream.FormatOffset(pos)}
	if cur := mach.SnapshotOf(k, m.Incarnation); cur != nil && cur.GetPosition() == pos && cur.GetContentType() == ct &&
		slices.Equal(cur.GetPartDigests(), digests) {
		resp.Digest = cur.GetDigest()
		return resp, nil // committed already (a retry)
	}
	commit, err := e.cold.BeginCommit(ctx, g, e.groups.Status(g).Term, k, m.Incarnation, pos, digests)
	if err != nil {
		return nil, err
	}
	defer commit.End()
	digest, err := commit.Digest(ctx, ct)
	if err != nil {
		return nil, err
	}
	resp.Digest = digest
	if cur := mach.SnapshotOf(k, m.Incarnation); cur != nil && cur.GetPosition() == pos && cur.GetDigest() == digest {
		commit.Settle(cur.GetPartKeys())
		return resp, nil // the same snapshot again
	}
	ok, err := e.boundary(ctx, m, pos)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "snapshot offset %s is not an append or message boundary", req.GetOffset())
	}
	ref := commit.Ref(ct, digest)
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_PublishSnapshot{PublishSnapshot: &storagev1.PublishSnapshot{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, Snapshot: ref, Match: req.GetMatch(),
		GraceMs: e.cold.Config().GCGrace.Milliseconds(),
	}}})
	if err != nil {
		return nil, err // the parts stay staged for another commit
	}
	keys := ref.GetPartKeys()
	if res.Duplicate {
		keys = mach.SnapshotOf(k, m.Incarnation).GetPartKeys()
	}
	commit.Settle(keys)
	resp.Created = !res.Duplicate
	return resp, nil
}

// validDigest reports whether d is a lower-case hex SHA-256.
func validDigest(d string) bool {
	if len(d) != 2*sha256.Size {
		return false
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// StagedUsage reports, for each group this node leads, the bytes of its
// staged snapshot parts per bucket (package cold).
func (e *Engine) StagedUsage(ctx context.Context) []cold.StagedUsage { return e.cold.StagedUsage(ctx) }
