package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"slices"
	"strings"
	"sync"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// Snapshots above MaxSnapshotBytes go up in staged parts: each part is an
// object under the stream's prefix (sp/{position}/{part}-{nonce}), not
// replicated state, until CommitSnapshot names them in a PublishSnapshot.
const (
	// MaxSnapshotPartBytes bounds one staged part.
	MaxSnapshotPartBytes = MaxSnapshotBytes
	// MaxStagedSnapshotBytes bounds a snapshot committed from parts, and
	// the staged parts one stream may hold.
	MaxStagedSnapshotBytes = 1 << 30
	// MaxSnapshotParts bounds the parts of one snapshot.
	MaxSnapshotParts = 10000
)

// digestWindow is how much of a part a commit reads at a time.
const digestWindow = 4 << 20

// stagedIndex is the leader's in-memory view of the staged parts of the
// groups it leads, per term: a new term starts empty and each stream's
// parts are learned from a listing of its prefix the first time they are
// needed, so that a leader change or restart loses nothing.
type stagedIndex struct {
	mu     sync.Mutex
	groups map[uint32]*stagedGroup
}

type stagedGroup struct {
	term    uint64
	streams map[string]*stagedStream // cold prefix → parts
}

type stagedStream struct {
	bucket string
	listed bool
	parts  map[uint64]map[uint32]stagedPart // position → part number → part
	// committing marks the positions a commit is reading: their parts
	// cannot be replaced (the replaced object is deleted) until it ends.
	committing map[uint64]bool
}

type stagedPart struct {
	key      string
	size     uint64
	digest   string // empty when learned from a listing: checked at commit
	modified time.Time
}

// group returns g's index for term, starting it afresh on a new term;
// nil when the index already follows a later term (the caller's view is
// stale). Callers hold x.mu.
func (x *stagedIndex) group(g uint32, term uint64) *stagedGroup {
	if x.groups == nil {
		x.groups = map[uint32]*stagedGroup{}
	}
	sg := x.groups[g]
	if sg != nil && sg.term > term {
		return nil
	}
	if sg == nil || sg.term != term {
		sg = &stagedGroup{term: term, streams: map[string]*stagedStream{}}
		x.groups[g] = sg
	}
	return sg
}

// stream returns the parts of the stream under prefix. Callers hold x.mu.
func (sg *stagedGroup) stream(prefix, bucket string) *stagedStream {
	ss := sg.streams[prefix]
	if ss == nil {
		ss = &stagedStream{bucket: bucket, parts: map[uint64]map[uint32]stagedPart{}, committing: map[uint64]bool{}}
		sg.streams[prefix] = ss
	}
	return ss
}

// bytes is the size of every part the stream has staged.
func (ss *stagedStream) bytes() uint64 {
	var n uint64
	for _, ps := range ss.parts {
		for _, p := range ps {
			n += p.size
		}
	}
	return n
}

// term is this node's Raft term in group g.
func (e *Engine) term(g uint32) uint64 { return e.host.Status(g).Term }

// listStaged learns a stream's staged parts from a listing of its prefix,
// once per term. Parts this node staged in the term win over the listing;
// parts the current snapshot names are committed, not staged; of two
// objects for the same part (a replacement cut short) the newer counts.
func (e *Engine) listStaged(ctx context.Context, g uint32, term uint64, k stream.Key, prefix string) error {
	e.staged.mu.Lock()
	sg := e.staged.group(g, term)
	listed := sg == nil || sg.stream(prefix, k.Bucket).listed
	e.staged.mu.Unlock()
	if listed {
		return nil
	}
	found := map[uint64]map[uint32]stagedPart{}
	err := e.cold.store.List(ctx, prefix+"sp/", func(in objstore.Info) error {
		pos, n, ok := coldfmt.ParseSnapshotPartKey(prefix, in.Key)
		if !ok {
			return nil
		}
		ps := found[pos]
		if ps == nil {
			ps = map[uint32]stagedPart{}
			found[pos] = ps
		}
		if old, dup := ps[n]; dup && old.modified.After(in.Modified) {
			return nil
		}
		ps[n] = stagedPart{key: in.Key, size: uint64(in.Size), modified: in.Modified}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errcode.New(errcode.ColdStoreFailed, "list the staged snapshot parts of %s: %v", k.Stream, err)
	}
	e.staged.mu.Lock()
	defer e.staged.mu.Unlock()
	if sg = e.staged.group(g, term); sg == nil {
		return nil
	}
	ss := sg.stream(prefix, k.Bucket)
	if ss.listed {
		return nil
	}
	var committed []string
	if m, ok := e.machine(k).Lookup(k); ok {
		committed = e.machine(k).SnapshotOf(k, m.Incarnation).GetPartKeys()
	}
	for pos, ps := range found {
		for n, p := range ps {
			if slices.Contains(committed, p.key) {
				continue
			}
			have := ss.parts[pos]
			if have == nil {
				have = map[uint32]stagedPart{}
				ss.parts[pos] = have
			}
			if _, ok := have[n]; !ok {
				have[n] = p
			}
		}
	}
	ss.listed = true
	return nil
}

// snapshotTarget checks a snapshot offset against the stream as its leader
// knows it: beyond the tail 409, below the retention 410.
func (e *Engine) snapshotTarget(k stream.Key, raw string) (stream.Meta, uint64, error) {
	off, err := stream.ParseOffset(raw)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	if off.Start || off.Now {
		return stream.Meta{}, 0, errcode.New(errcode.InvalidArgument, "a snapshot offset must be an offset the server issued, not %q", raw)
	}
	m, err := e.live(k)
	if err != nil {
		return stream.Meta{}, 0, err
	}
	if off.Pos > m.Tail {
		return stream.Meta{}, 0, errcode.New(errcode.SnapshotConflict, "snapshot offset %s is beyond the tail %s", raw, stream.FormatOffset(m.Tail))
	}
	if off.Pos < m.Retained {
		return stream.Meta{}, 0, trimmed(m, off.Pos)
	}
	return m, off.Pos, nil
}

// PutSnapshotPart stages part n of a snapshot at an offset in the cold
// store (replacing any earlier upload of that part) and returns the part's
// SHA-256. It runs on the group's leader; nothing is replicated.
func (e *Engine) PutSnapshotPart(ctx context.Context, req *streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
	k := keyOf(req.GetRef())
	if err := validKey(k); err != nil {
		return nil, err
	}
	if e.cold == nil {
		return nil, errcode.New(errcode.NoColdStore, "staged snapshot parts need a cold store")
	}
	n := req.GetPart()
	if n < 1 || n > MaxSnapshotParts {
		return nil, errcode.New(errcode.InvalidArgument, "part number %d is outside 1..%d", n, MaxSnapshotParts)
	}
	body := req.GetBody()
	if len(body) == 0 {
		return nil, errcode.New(errcode.InvalidArgument, "a snapshot part holds at least one byte")
	}
	if len(body) > MaxSnapshotPartBytes {
		return nil, errcode.New(errcode.PayloadTooLarge, "snapshot part of %d bytes exceeds %d", len(body), MaxSnapshotPartBytes)
	}
	if !e.leads(k) {
		return nil, e.notLeader(k)
	}
	m, pos, err := e.snapshotTarget(k, req.GetOffset())
	if err != nil {
		return nil, err
	}
	g := e.GroupOf(k)
	term := e.term(g)
	prefix := coldfmt.StreamPrefix(k.Bucket, k.Stream, m.Incarnation)
	if err := e.listStaged(ctx, g, term, k, prefix); err != nil {
		return nil, err
	}
	var staged uint64
	var committing bool
	e.staged.mu.Lock()
	if sg := e.staged.group(g, term); sg != nil {
		ss := sg.stream(prefix, k.Bucket)
		staged = ss.bytes() - ss.parts[pos][n].size
		committing = ss.committing[pos]
	}
	e.staged.mu.Unlock()
	if committing {
		return nil, errCommitting(req.GetOffset())
	}
	if staged+uint64(len(body)) > MaxStagedSnapshotBytes {
		return nil, errcode.New(errcode.PayloadTooLarge, "stream %s would stage more than %d bytes of snapshot parts", k.Stream, MaxStagedSnapshotBytes)
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	key := coldfmt.SnapshotPartKey(prefix, pos, n)
	if err := e.cold.store.Put(ctx, key, body); err != nil {
		e.cold.stats.UploadErrors.Add(1)
		return nil, errcode.New(errcode.Unavailable, "store a %d-byte snapshot part in the cold store: %v", len(body), err).With(errcode.KeyRetryAfterMS, "1000")
	}
	e.cold.stats.Uploads.Add(1)
	e.cold.stats.UploadBytes.Add(uint64(len(body)))
	var replaced string
	e.staged.mu.Lock()
	if sg := e.staged.group(g, term); sg != nil {
		ss := sg.stream(prefix, k.Bucket)
		if ss.committing[pos] {
			e.staged.mu.Unlock()
			e.discard(key)
			return nil, errCommitting(req.GetOffset())
		}
		ps := ss.parts[pos]
		if ps == nil {
			ps = map[uint32]stagedPart{}
			ss.parts[pos] = ps
		}
		replaced = ps[n].key
		ps[n] = stagedPart{key: key, size: uint64(len(body)), digest: digest, modified: e.now()}
	}
	e.staged.mu.Unlock()
	if replaced != "" {
		e.discard(replaced)
	}
	return &streamv1.PutSnapshotPartResponse{Digest: digest}, nil
}

// CommitSnapshot publishes the staged parts 1..N at an offset as one
// snapshot: the parts must be staged with the digests the request names,
// and the snapshot's digest is computed over the parts read back from the
// store a window at a time. The offset and match checks are PutSnapshot's.
func (e *Engine) CommitSnapshot(ctx context.Context, req *streamv1.CommitSnapshotRequest) (*streamv1.CommitSnapshotResponse, error) {
	k := keyOf(req.GetRef())
	if err := validKey(k); err != nil {
		return nil, err
	}
	if e.cold == nil {
		return nil, errcode.New(errcode.NoColdStore, "staged snapshot parts need a cold store")
	}
	want := req.GetParts()
	if len(want) == 0 || len(want) > MaxSnapshotParts {
		return nil, errcode.New(errcode.InvalidArgument, "a commit names 1 to %d parts, not %d", MaxSnapshotParts, len(want))
	}
	for i, p := range want {
		if p.GetPart() != uint32(i+1) {
			return nil, errcode.New(errcode.InvalidArgument, "parts must be 1..%d in order: entry %d is part %d", len(want), i+1, p.GetPart())
		}
		if !validDigest(p.GetDigest()) {
			return nil, errcode.New(errcode.InvalidArgument, "part %d: digest %q is not a lower-case hex SHA-256", p.GetPart(), p.GetDigest())
		}
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
	term := e.term(g)
	prefix := coldfmt.StreamPrefix(k.Bucket, k.Stream, m.Incarnation)
	if err := e.listStaged(ctx, g, term, k, prefix); err != nil {
		return nil, err
	}
	resp := &streamv1.CommitSnapshotResponse{Offset: stream.FormatOffset(pos)}
	if cur := e.machines[g].SnapshotOf(k, m.Incarnation); cur != nil && cur.GetPosition() == pos && cur.GetContentType() == ct &&
		slices.EqualFunc(cur.GetPartDigests(), want, func(d string, w *streamv1.SnapshotPartDigest) bool { return d == w.GetDigest() }) {
		resp.Digest = cur.GetDigest()
		return resp, nil // committed already (a retry)
	}
	parts := make([]stagedPart, len(want))
	var total uint64
	e.staged.mu.Lock()
	var ps map[uint32]stagedPart
	var ss *stagedStream
	if sg := e.staged.group(g, term); sg != nil {
		ss = sg.stream(prefix, k.Bucket)
		if ss.committing[pos] {
			e.staged.mu.Unlock()
			return nil, errCommitting(req.GetOffset())
		}
		ps = ss.parts[pos]
	}
	for i, w := range want {
		p, ok := ps[w.GetPart()]
		if !ok {
			e.staged.mu.Unlock()
			return nil, errcode.New(errcode.InvalidArgument, "part %d of the snapshot at %s is not staged", w.GetPart(), req.GetOffset())
		}
		if p.digest != "" && p.digest != w.GetDigest() {
			e.staged.mu.Unlock()
			return nil, errcode.New(errcode.SnapshotConflict, "part %d has digest %s, not %s", w.GetPart(), p.digest, w.GetDigest())
		}
		parts[i] = p
		total += p.size
	}
	ss.committing[pos] = true
	e.staged.mu.Unlock()
	defer func() {
		e.staged.mu.Lock()
		delete(ss.committing, pos)
		e.staged.mu.Unlock()
	}()
	if total > MaxStagedSnapshotBytes {
		return nil, errcode.New(errcode.PayloadTooLarge, "snapshot of %d bytes exceeds %d", total, MaxStagedSnapshotBytes)
	}
	digest, err := e.partsDigest(ctx, ct, parts, want)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(parts))
	sizes := make([]uint64, len(parts))
	digests := make([]string, len(parts))
	for i, p := range parts {
		keys[i], sizes[i], digests[i] = p.key, p.size, want[i].GetDigest()
	}
	resp.Digest = digest
	if cur := e.machines[g].SnapshotOf(k, m.Incarnation); cur != nil && cur.GetPosition() == pos && cur.GetDigest() == digest {
		e.settleStaged(g, term, prefix, pos, cur.GetPartKeys())
		return resp, nil // the same snapshot again
	}
	ok, err := e.boundary(ctx, m, pos)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errcode.New(errcode.InvalidArgument, "snapshot offset %s is not an append or message boundary", req.GetOffset())
	}
	ref := &storagev1.SnapshotRef{Position: pos, Digest: digest, ContentType: ct, Size: total, PartKeys: keys, PartSizes: sizes, PartDigests: digests}
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_PublishSnapshot{PublishSnapshot: &storagev1.PublishSnapshot{
		Bucket: k.Bucket, Stream: k.Stream, Incarnation: m.Incarnation, Snapshot: ref, Match: req.GetMatch(),
		GraceMs: e.cold.cfg.GCGrace.Milliseconds(),
	}}})
	if err != nil {
		return nil, err // the parts stay staged for another commit
	}
	if res.Duplicate {
		keys = e.machines[g].SnapshotOf(k, m.Incarnation).GetPartKeys()
	}
	e.settleStaged(g, term, prefix, pos, keys)
	resp.Created = !res.Duplicate
	return resp, nil
}

// settleStaged ends the staging at pos after a commit: the parts the
// snapshot names leave the index, the others are deleted.
func (e *Engine) settleStaged(g uint32, term uint64, prefix string, pos uint64, committed []string) {
	var drop []string
	e.staged.mu.Lock()
	if sg := e.staged.group(g, term); sg != nil {
		if ss := sg.streams[prefix]; ss != nil {
			for _, p := range ss.parts[pos] {
				if !slices.Contains(committed, p.key) {
					drop = append(drop, p.key)
				}
			}
			delete(ss.parts, pos)
		}
	}
	e.staged.mu.Unlock()
	e.discard(drop...)
}

// partsDigest streams the parts from the store and returns the snapshot
// digest (stream.SnapshotDigest of the concatenation); a part whose bytes
// do not have the digest the commit names (or the size it was staged
// with) is a conflict.
func (e *Engine) partsDigest(ctx context.Context, ct string, parts []stagedPart, want []*streamv1.SnapshotPartDigest) (string, error) {
	h := sha256.New()
	h.Write([]byte(ct))
	h.Write([]byte{0})
	var ph hash.Hash
	for i, p := range parts {
		ph = sha256.New()
		for off := int64(0); off < int64(p.size); off += digestWindow {
			n := min(digestWindow, int64(p.size)-off)
			b, err := e.cold.store.GetRange(ctx, p.key, off, n)
			if err == nil && int64(len(b)) != n {
				err = errors.New("short read")
			}
			if err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				e.cold.stats.ReadErrors.Add(1)
				return "", errcode.New(errcode.ColdStoreFailed, "read snapshot part %d (%s): %v", i+1, p.key, err)
			}
			h.Write(b)
			ph.Write(b)
		}
		if got := hex.EncodeToString(ph.Sum(nil)); got != want[i].GetDigest() {
			return "", errcode.New(errcode.SnapshotConflict, "part %d has digest %s, not %s", i+1, got, want[i].GetDigest())
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// errCommitting refuses a part upload or commit while another commit at
// the same offset reads the parts.
func errCommitting(offset string) error {
	return errcode.New(errcode.SnapshotConflict, "a commit of the snapshot at %s is in progress", offset).With(errcode.KeyRetryAfterMS, "1000")
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

// StagedUsage is the staged snapshot parts no commit has used yet in one
// group this node leads, by bucket. CountingFinished is false when a
// stream's listing failed (its parts are then missing from Bytes).
type StagedUsage struct {
	GroupID          uint32
	Term             uint64
	CountingFinished bool
	Bytes            map[string]uint64
}

// StagedUsage reports, for each group this node leads, the bytes of its
// staged snapshot parts per bucket, listing the streams it has not listed
// in the current term first. Groups without staged parts are left out.
func (e *Engine) StagedUsage(ctx context.Context) []StagedUsage {
	if e.cold == nil {
		return nil
	}
	var out []StagedUsage
	for i, mach := range e.machines {
		g := uint32(i)
		st := e.host.Status(g)
		if e.multiNode() && !st.IsLeader {
			continue
		}
		u := StagedUsage{GroupID: g, Term: st.Term, CountingFinished: true, Bytes: map[string]uint64{}}
		live := mach.LivePrefixes()
		for prefix, k := range live {
			if err := e.listStaged(ctx, g, st.Term, k, prefix); err != nil {
				u.CountingFinished = false
			}
		}
		e.staged.mu.Lock()
		if sg := e.staged.group(g, st.Term); sg != nil {
			for prefix, ss := range sg.streams {
				if _, ok := live[prefix]; !ok {
					// The stream is gone: its prefix's GC took the parts.
					delete(sg.streams, prefix)
					continue
				}
				if n := ss.bytes(); n > 0 {
					u.Bytes[ss.bucket] += n
				}
			}
		}
		e.staged.mu.Unlock()
		if len(u.Bytes) > 0 || !u.CountingFinished {
			out = append(out, u)
		}
	}
	return out
}
