package engine

import (
	"context"
	"errors"
	"strconv"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

func keyOf(r *streamv1.StreamRef) stream.Key {
	return stream.Key{Bucket: r.GetBucket(), Stream: r.GetStream()}
}

func info(m stream.Meta) *streamv1.StreamInfo {
	in := &streamv1.StreamInfo{
		ContentType: m.ContentType,
		NextOffset:  stream.FormatOffset(m.Tail),
		Closed:      m.Closed,
		ExpiresAt:   m.ExpiresAt,
		Incarnation: m.Incarnation,
		RecordFirst: m.RecordFirst,
		RecordNext:  m.RecordNext,
	}
	if m.HasTTL {
		ttl := m.TTLSeconds
		in.TtlSeconds = &ttl
	}
	if m.PreviousIncarnation != 0 {
		in.PreviousIncarnation = m.PreviousIncarnation
		in.InheritedOffset = stream.FormatOffset(m.InheritedOffset)
	}
	return in
}

// CreateBucket creates a bucket (idempotent).
func (e *Engine) CreateBucket(ctx context.Context, req *streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error) {
	name := req.GetBucket()
	if err := validBucketName(name); err != nil {
		return nil, err
	}
	res, err := e.propose(ctx, bucketGroup, &storagev1.Command{Op: &storagev1.Command_CreateBucket{CreateBucket: &storagev1.CreateBucket{Bucket: name}}})
	if err != nil {
		return nil, err
	}
	return &streamv1.CreateBucketResponse{Created: res.Created}, nil
}

// validBucketName enforces S3-style names; "__" names are reserved.
func validBucketName(b string) error {
	if len(b) < 1 || len(b) > stream.MaxBucketBytes {
		return fault.Errorf(fault.ErrInvalidArgument, "bucket name must be 1 to %d characters", stream.MaxBucketBytes)
	}
	if builtinBucket(b) {
		return fault.Errorf(fault.ErrInvalidArgument, "bucket names starting with __ are reserved")
	}
	if b == reservedBucketName {
		return fault.Errorf(fault.ErrInvalidArgument, "bucket name %q is reserved", b)
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || ((c == '-' || c == '.' || c == '_') && i > 0)
		if !ok {
			return fault.Errorf(fault.ErrInvalidArgument, "bucket name %q: use a-z, 0-9, '-', '.', '_' (not first)", b)
		}
	}
	return nil
}

// checkBucket is a create's check that its bucket exists; it returns the
// generation of the bucket record it found, which the CreateStream
// command carries (a deletion fence of that generation refuses it, see
// stream/buckets.go). A bucket this node's replica holds is taken as it
// is: were it being deleted, the fence answers. One it does not hold may
// have just been created on the bucket group's leader, so it looks again
// after a read barrier before answering BUCKET_NOT_FOUND.
func (e *Engine) checkBucket(ctx context.Context, b string) (uint64, error) {
	if gen, ok := e.bucketGeneration(b); ok {
		return gen, nil
	}
	if err := e.groups.ReadBarrier(ctx, bucketGroup); err != nil {
		return 0, err
	}
	if gen, ok := e.bucketGeneration(b); ok {
		return gen, nil
	}
	return 0, bucketNotFound(b)
}

// bucketGeneration is a bucket's record generation on this node's replica
// of the bucket group (built-in buckets are generation 0).
func (e *Engine) bucketGeneration(b string) (uint64, bool) {
	if builtinBucket(b) {
		return 0, true
	}
	return e.groups.Machine(bucketGroup).BucketGeneration(b)
}

// fencedCreate answers a create that a deletion fence refused (checked
// generation gen): after a read barrier of the bucket group, a newer
// record of the bucket (deleted and created again since the replica
// looked) is worth another try with its generation; the record the fence
// names, still there, is a delete in progress (retry later); no record is
// BUCKET_NOT_FOUND.
func (e *Engine) fencedCreate(ctx context.Context, b string, gen uint64) (retryGen uint64, err error) {
	if err := e.groups.ReadBarrier(ctx, bucketGroup); err != nil {
		return 0, err
	}
	now, ok := e.bucketGeneration(b)
	switch {
	case !ok:
		return 0, bucketNotFound(b)
	case now > gen:
		return now, nil
	}
	return 0, fault.Errorf(fault.ErrUnavailable, "bucket %s is being deleted", b).With(fault.DetailRetryAfterMS, "200")
}

// hasBucket reports a bucket on this node's replica of the bucket group.
func (e *Engine) hasBucket(b string) bool {
	return builtinBucket(b) || e.groups.Machine(bucketGroup).HasBucket(b)
}

func bucketNotFound(b string) error {
	return fault.Errorf(fault.ErrBucketNotFound, "bucket %s not found", b)
}

// CreateStream creates a stream, confirms an identical one or creates a fork.
func (e *Engine) CreateStream(ctx context.Context, req *streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if k.Stream == reservedStreamID && !builtinBucket(k.Bucket) {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "stream id %q is reserved", k.Stream)
	}
	// The lifetime is checked before anything is read or proposed.
	c := &storagev1.CreateStream{Bucket: k.Bucket, Stream: k.Stream, Closed: req.GetClosed()}
	if req.TtlSeconds != nil && req.GetExpiresAt() != "" {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "Stream-TTL and Stream-Expires-At are mutually exclusive")
	}
	if req.TtlSeconds != nil {
		if err := validTTL(req.GetTtlSeconds()); err != nil {
			return nil, err
		}
		c.HasTtl, c.TtlSeconds = true, req.GetTtlSeconds()
	}
	if at := req.GetExpiresAt(); at != "" {
		ms, err := parseExpiresAt(at)
		if err != nil {
			return nil, err
		}
		c.ExpiresAt, c.ExpiresAtMs = at, ms
	}
	gen, err := e.checkBucket(ctx, k.Bucket)
	if err != nil {
		return nil, err
	}
	c.BucketGeneration = gen
	if err := e.settle(k); err != nil {
		return nil, err
	}
	c.ContentType = req.GetContentType()
	var srcMeta stream.Meta
	if f := req.GetFork(); f != nil {
		var err error
		if srcMeta, err = e.resolveFork(ctx, req, c); err != nil {
			return nil, err
		}
	} else if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	c.Json = stream.IsJSONContentType(c.ContentType)
	if req.GetHasBody() && len(req.GetBody()) > 0 {
		body := req.GetBody()
		if c.Json {
			stored, _, err := stream.FlattenJSON(body, true)
			if err != nil {
				return nil, err
			}
			body = stored
		}
		c.Body = body
	}
	g := e.GroupOf(k)
	if cur, ok := e.groups.Machine(g).Lookup(k); ok && !cur.SoftDeleted && cur.ExpiredAt(e.nowMs()) {
		c.ReplaceIncarnation = cur.Incarnation
	}
	if c.Fork != nil {
		if _, exists := e.groups.Machine(g).Lookup(k); !exists || c.ReplaceIncarnation != 0 {
			// A new fork: take the reference first, release it if the
			// create does not go through.
			srcKey := stream.Key{Bucket: c.Fork.GetSourceBucket(), Stream: c.Fork.GetSourceStream()}
			if _, err := e.propose(ctx, e.GroupOf(srcKey), &storagev1.Command{Op: &storagev1.Command_AddForkRef{AddForkRef: &storagev1.AddForkRef{
				Bucket: srcKey.Bucket, Stream: srcKey.Stream, Incarnation: srcMeta.Incarnation, Position: c.Fork.GetPosition(),
			}}}); err != nil {
				return nil, err
			}
			res, err := e.proposeCreate(ctx, g, c)
			if err != nil || !res.Created {
				e.release(ctx, []*storagev1.ForkOrigin{c.Fork})
			}
			if err != nil {
				return nil, err
			}
			return &streamv1.CreateStreamResponse{Created: res.Created, Info: info(res.Meta)}, nil
		}
	}
	res, err := e.proposeCreate(ctx, g, c)
	if err != nil {
		return nil, err
	}
	return &streamv1.CreateStreamResponse{Created: res.Created, Info: info(res.Meta)}, nil
}

// proposeCreate proposes a CreateStream in group g. A refusal by a
// deletion fence is looked into (fencedCreate): when the bucket was
// created again since the check, the create runs once more with the new
// record's generation.
func (e *Engine) proposeCreate(ctx context.Context, g uint32, c *storagev1.CreateStream) (*stream.Result, error) {
	for retried := false; ; retried = true {
		res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_CreateStream{CreateStream: c}})
		if retried || !errors.Is(err, fault.ErrBucketNotFound) || builtinBucket(c.GetBucket()) {
			return res, err
		}
		gen, ferr := e.fencedCreate(ctx, c.GetBucket(), c.GetBucketGeneration())
		if ferr != nil {
			return res, ferr
		}
		c.BucketGeneration = gen
	}
}

// validTTL refuses a TTL longer than stream.MaxTTLSeconds (100 years).
func validTTL(sec uint64) error {
	if sec > stream.MaxTTLSeconds {
		return fault.Errorf(fault.ErrInvalidArgument, "Stream-TTL %d exceeds the maximum of %d seconds (100 years)", sec, uint64(stream.MaxTTLSeconds))
	}
	return nil
}

// parseExpiresAt parses a Stream-Expires-At value into its milliseconds
// since the Unix epoch. The state keeps 0 for "none", so an instant at or
// before the epoch cannot be stored and is refused rather than changed;
// RFC 3339 years have four digits, so every other instant fits an int64.
func parseExpiresAt(at string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "Stream-Expires-At %q is not an RFC 3339 timestamp", at)
	}
	ms := t.UnixMilli()
	if ms <= 0 {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "Stream-Expires-At %q is not after 1970-01-01T00:00:00Z", at)
	}
	return ms, nil
}

// resolveFork validates a fork request against its source (read locally)
// and fills c's fork origin, content type and inherited expiry.
func (e *Engine) resolveFork(ctx context.Context, req *streamv1.CreateStreamRequest, c *storagev1.CreateStream) (stream.Meta, error) {
	f := req.GetFork()
	sk := keyOf(f.GetSource())
	if err := sk.Validate(); err != nil {
		return stream.Meta{}, err
	}
	// Resolve the fork point against the source as its leader knows it.
	if err := e.groups.ReadBarrier(ctx, e.GroupOf(sk)); err != nil {
		return stream.Meta{}, err
	}
	src, err := e.live(sk)
	if err != nil {
		if de, ok := err.(*fault.Error); ok && de.Kind == fault.ErrStreamGone {
			return src, fault.Errorf(fault.ErrForkSourceGone, "fork source %s is deleted", sk.Stream)
		}
		return src, fault.Errorf(fault.ErrStreamNotFound, "fork source %s not found", sk.Stream)
	}
	if c.ContentType == "" {
		c.ContentType = src.ContentType
	} else if !stream.SameContentType(c.ContentType, src.ContentType) {
		return src, fault.Errorf(fault.ErrContentTypeMismatch, "fork content type %q differs from the source's %q", c.ContentType, src.ContentType)
	}
	pos := src.Tail
	if raw := f.GetOffset(); raw != "" {
		off, err := stream.ParseOffset(raw)
		if err != nil {
			return src, err
		}
		switch {
		case off.Start:
			pos = 0
		case off.Now:
			pos = src.Tail
		default:
			pos = off.Pos
		}
		if pos > src.Tail {
			return src, fault.Errorf(fault.ErrOffsetOutOfRange, "fork offset %s is beyond the source's tail %s", raw, stream.FormatOffset(src.Tail))
		}
	}
	if n := f.GetSubOffset(); n > 0 {
		if f.GetOffset() == "" {
			return src, fault.Errorf(fault.ErrInvalidArgument, "Stream-Fork-Sub-Offset needs an explicit Stream-Fork-Offset")
		}
		end, ok, err := e.unitEnd(ctx, src, pos, n, src.Tail)
		if err != nil {
			return src, err
		}
		if !ok {
			return src, fault.Errorf(fault.ErrInvalidArgument, "Stream-Fork-Sub-Offset %d is past the next append after the fork offset", n)
		}
		pos = end
	}
	if src.JSON {
		// A fork of a JSON stream starts on a message boundary, or its
		// view would hold half a message.
		ok, err := e.boundary(ctx, src, pos)
		if err != nil {
			return src, err
		}
		if !ok {
			return src, fault.Errorf(fault.ErrInvalidArgument, "fork offset %s is inside a JSON message of the source", f.GetOffset())
		}
		rec, err := e.recordAt(ctx, src, pos)
		if err != nil {
			return src, err
		}
		c.BaseRecord = rec
	}
	if !c.HasTtl && c.ExpiresAt == "" {
		c.HasTtl, c.TtlSeconds = src.HasTTL, src.TTLSeconds
		c.ExpiresAt, c.ExpiresAtMs = src.ExpiresAt, src.ExpiresAtMs
	}
	c.Fork = &storagev1.ForkOrigin{
		SourceBucket: sk.Bucket, SourceStream: sk.Stream, SourceIncarnation: src.Incarnation,
		Position: pos, OffsetRaw: f.GetOffset(), SubOffset: f.GetSubOffset(),
	}
	return src, nil
}

// unitEnd resolves a sub-offset through a fork chain: the append starting
// at pos may live in an ancestor, clipped at each descendant's base.
func (e *Engine) unitEnd(ctx context.Context, m stream.Meta, pos, n, clip uint64) (uint64, bool, error) {
	for depth := 0; depth < 1024; depth++ {
		if pos >= m.Base {
			if ref := e.machine(m.Key).ColdRefAt(m.Key, m.Incarnation, pos); ref != nil {
				return e.cold.UnitEnd(ctx, m, ref, pos, n, clip)
			}
			end, ok := e.machine(m.Key).UnitEnd(m.Key, m.Incarnation, pos, n, clip)
			return end, ok, nil
		}
		clip = min(clip, m.Base)
		f := m.Fork
		if f == nil {
			return 0, false, nil
		}
		sk := stream.Key{Bucket: f.GetSourceBucket(), Stream: f.GetSourceStream()}
		parent, ok := e.machine(sk).Lookup(sk)
		if !ok || !parent.HoldsHistory(f.GetSourceIncarnation(), m.Base) {
			return 0, false, nil
		}
		m = parent
	}
	return 0, false, nil
}

// Append appends to, appends to and closes, or closes a stream.
func (e *Engine) Append(ctx context.Context, req *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if len(req.GetFrames()) > 0 {
		return e.appendBatch(ctx, k, req)
	}
	body := req.GetBody()
	if len(body) == 0 && !req.GetClose() {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "empty body: nothing to append")
	}
	if len(body) > 0 && req.GetContentType() == "" {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "Content-Type is required with a body")
	}
	if err := validWriter(req); err != nil {
		return nil, err
	}
	// A write is answered by its group's leader: another replica's state
	// (it may lag, or hold nothing) must not decide it.
	m, err := e.leaderLive(k)
	if err != nil {
		return nil, err
	}
	if err := checkIncarnation(m, req.GetIncarnation()); err != nil {
		return nil, err
	}
	if m.JSON && len(body) > 0 {
		stored, _, ferr := stream.FlattenJSON(body, false)
		if ferr != nil {
			// Protocol order: closure and content type are reported before
			// a malformed body.
			if m.Closed {
				return nil, fault.Errorf(fault.ErrStreamClosed, "stream %s is closed", k.Stream).
					With(fault.DetailNextOffset, stream.FormatOffset(m.Tail)).With(fault.DetailClosed, "true")
			}
			if !stream.SameContentType(m.ContentType, req.GetContentType()) {
				return nil, fault.Errorf(fault.ErrContentTypeMismatch, "content type %q does not match the stream's %q", req.GetContentType(), m.ContentType)
			}
			return nil, ferr
		}
		body = stored
	}
	g := e.GroupOf(k)
	if len(body) > 0 {
		if err := e.cold.AdmitWrite(ctx, g); err != nil {
			return nil, err
		}
	}
	// The command's messages in one allocation instead of four.
	x := &struct {
		cmd      storagev1.Command
		op       storagev1.Command_Append
		a        storagev1.Append
		producer storagev1.ProducerRef
	}{}
	a := &x.a
	a.Bucket, a.Stream, a.ContentType, a.Body = k.Bucket, k.Stream, req.GetContentType(), body
	a.Close, a.StreamSeq, a.Incarnation, a.RecordMatch = req.GetClose(), req.GetStreamSeq(), req.GetIncarnation(), req.RecordMatch
	if p := req.GetProducer(); p != nil {
		x.producer.Id, x.producer.Epoch, x.producer.Seq = p.GetId(), p.GetEpoch(), p.GetSeq()
		a.Producer = &x.producer
	}
	x.op.Append = a
	x.cmd.Op = &x.op
	if e.cold.External(len(body)) && !m.Closed {
		// Large bodies go to the object store before they are proposed:
		// the log and every replica's memory hold only the locator.
		ext, err := e.cold.StoreExternal(ctx, m, body)
		if err != nil {
			return nil, err
		}
		if m.JSON {
			ext.NextRecord = frameRecords(body) // relative; apply rebases it
		}
		a.Body, a.External, a.Incarnation = nil, ext, m.Incarnation
	}
	res, err := e.propose(ctx, g, &x.cmd)
	if a.External != nil && (err != nil || res.Duplicate) && !mayHaveCommitted(res, err) {
		e.cold.Discard(a.External.GetKey()) // not committed: nothing names it
	}
	if err != nil {
		return nil, err
	}
	return &streamv1.AppendResponse{
		NextOffset:    stream.FormatOffset(res.Meta.Tail),
		Closed:        res.Meta.Closed,
		Duplicate:     res.Duplicate,
		ProducerEpoch: res.ProducerEpoch,
		ProducerSeq:   res.ProducerSeq,
		Incarnation:   res.Meta.Incarnation,
		RecordStart:   res.RecordStart,
		RecordNext:    res.RecordNext,
	}, nil
}

// Head returns a stream's metadata without restarting its TTL, on the
// group's leader after a read barrier.
func (e *Engine) Head(ctx context.Context, req *streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
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
	if err := checkIncarnation(m, req.GetIncarnation()); err != nil {
		return nil, err
	}
	return &streamv1.HeadResponse{Info: e.snapshotInfo(m, info(m))}, nil
}

// DeleteStream deletes a stream; a stream forks still reference is
// soft-deleted until the last of them goes.
func (e *Engine) DeleteStream(ctx context.Context, req *streamv1.DeleteStreamRequest) (*streamv1.DeleteStreamResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	m, err := e.leaderLive(k)
	if err != nil {
		return nil, err
	}
	if _, err := e.propose(ctx, e.GroupOf(k), &storagev1.Command{Op: &storagev1.Command_DeleteStream{
		DeleteStream: &storagev1.DeleteStream{Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation},
	}}); err != nil {
		return nil, err
	}
	return &streamv1.DeleteStreamResponse{}, nil
}

// SetRetention moves a stream's retention forward (to an offset, or to the
// start of a JSON record) and retires the cold objects wholly below it
// (deleted after the GC grace). A retention at or below the current one
// changes nothing; one beyond the visible snapshot is SNAPSHOT_CONFLICT,
// so that the bootstrap always covers what reads answer 410 for. The
// check runs on the leader before the proposal (apply does not repeat it:
// a release without it would apply the command differently); a snapshot
// replaced by one at a lower offset between the check and the commit can
// leave the retention above it.
func (e *Engine) SetRetention(ctx context.Context, req *streamv1.SetRetentionRequest) (*streamv1.SetRetentionResponse, error) {
	k := keyOf(req.GetRef())
	if err := k.Validate(); err != nil {
		return nil, err
	}
	m, err := e.leaderLive(k)
	if err != nil {
		return nil, err
	}
	pos, err := e.retentionTarget(ctx, m, req)
	if err != nil {
		return nil, err
	}
	if pos <= m.Retained {
		// At or below the retention: nothing to do (the leader's state
		// holds every committed retention it answered).
		return retentionResponse(m), nil
	}
	if m.JSON {
		// Reads from the retention start there: it must not cut a
		// message.
		ok, err := e.boundary(ctx, m, pos)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "retention offset %s is inside a JSON message", stream.FormatOffset(pos))
		}
	}
	if snap := e.machine(k).SnapshotOf(k, m.Incarnation); snap == nil || pos > snap.GetPosition() {
		// Reads below the retention answer 410, and a client rebuilds
		// from the bootstrap, whose snapshot must cover the retention.
		visible := "none"
		if snap != nil {
			visible = stream.FormatOffset(snap.GetPosition())
		}
		return nil, fault.Errorf(fault.ErrSnapshotConflict, "retention offset %s is beyond the visible snapshot (%s): publish a snapshot at or above it first",
			stream.FormatOffset(pos), visible)
	}
	var recordFirst uint64
	if m.JSON {
		if recordFirst, err = e.recordAt(ctx, m, pos); err != nil {
			return nil, err
		}
	}
	g := e.GroupOf(k)
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_SetRetention{SetRetention: &storagev1.SetRetention{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, Position: pos, RecordFirst: recordFirst,
	}}})
	if err != nil {
		return nil, err
	}
	if _, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_ColdRetire{ColdRetire: &storagev1.ColdRetire{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, GraceMs: e.cold.Config().GCGrace.Milliseconds(),
	}}}); err != nil {
		// The retention holds; the next flush of the stream retires.
		e.logger.Warn("retire cold objects below retention", "stream", k.Stream, "err", err)
	}
	return retentionResponse(res.Meta), nil
}

// retentionTarget resolves a retention request to a position: an offset
// ("-1" is 0, "now" the tail), or the start of JSON record n. A position
// beyond the tail (or a record beyond the record tail) is
// OFFSET_OUT_OF_RANGE; a record at or below the first retained one is
// the retention itself (no change).
func (e *Engine) retentionTarget(ctx context.Context, m stream.Meta, req *streamv1.SetRetentionRequest) (uint64, error) {
	if req.Record != nil {
		n := req.GetRecord()
		switch {
		case !m.JSON:
			return 0, fault.Errorf(fault.ErrInvalidArgument, "record coordinates need an application/json stream")
		case n > m.RecordNext:
			return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "retention record %d is beyond the record tail %d", n, m.RecordNext).
				With(fault.DetailRecordNext, uintString(m.RecordNext))
		case n <= m.RecordFirst:
			return m.Retained, nil
		}
		return e.recordPos(ctx, m, n)
	}
	off, err := stream.ParseOffset(req.GetOffset())
	if err != nil {
		return 0, err
	}
	switch {
	case off.Start:
		return 0, nil
	case off.Now:
		return m.Tail, nil
	case off.Pos > m.Tail:
		return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "retention offset %s is beyond the tail %s", req.GetOffset(), stream.FormatOffset(m.Tail))
	}
	return off.Pos, nil
}

// retentionResponse answers a retention request with the stream's
// retention (and first retained record) as m holds them.
func retentionResponse(m stream.Meta) *streamv1.SetRetentionResponse {
	return &streamv1.SetRetentionResponse{RetainedOffset: stream.FormatOffset(m.Retained), RecordFirst: m.RecordFirst, Json: m.JSON}
}

// Reserved names: the bucket "snapshots" and, in Ursula's family, the
// stream id "streams" (GET /{bucket}/streams lists a bucket).
const (
	reservedBucketName = "snapshots"
	reservedStreamID   = "streams"
)

// checkIncarnation answers INCARNATION_MISMATCH (412, with the current
// token) when a request names an incarnation other than the stream's.
func checkIncarnation(m stream.Meta, want uint64) error {
	if want == 0 || want == m.Incarnation {
		return nil
	}
	return fault.Errorf(fault.ErrIncarnationMismatch, "stream %s has incarnation %d, not %d", m.Key.Stream, m.Incarnation, want).
		With(fault.DetailIncarnation, strconv.FormatUint(m.Incarnation, 10))
}
