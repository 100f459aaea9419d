package cold

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"sync"
	"time"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// Staged snapshot parts: a snapshot above the size one request carries goes
// up in parts, each an object under the stream's prefix
// (sp/{position}/{part}-{nonce}), not replicated state, until a commit
// names them in a PublishSnapshot.
const (
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
	// seeding is set once the term's seed listing of every stream's parts
	// was handed to the seed loop (and cleared when it failed, so the next
	// trigger runs it again); counted once it listed every stream.
	seeding, counted bool
}

type stagedStream struct {
	key    stream.Key
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
func (sg *stagedGroup) stream(prefix string, k stream.Key) *stagedStream {
	ss := sg.streams[prefix]
	if ss == nil {
		ss = &stagedStream{key: k, parts: map[uint64]map[uint32]stagedPart{}, committing: map[uint64]bool{}}
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

// listStaged learns a stream's staged parts from a listing of its prefix,
// once per term. Parts this node staged in the term win over the listing;
// parts the current snapshot names are committed, not staged; of two
// objects for the same part (a replacement cut short) the newer counts.
func (t *Tier) listStaged(ctx context.Context, g uint32, term uint64, k stream.Key, prefix string) error {
	t.staged.mu.Lock()
	sg := t.staged.group(g, term)
	listed := sg == nil || sg.stream(prefix, k).listed
	t.staged.mu.Unlock()
	if listed {
		return nil
	}
	found := map[uint64]map[uint32]stagedPart{}
	err := t.store.List(ctx, prefix+"sp/", func(in objstore.Info) error {
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
		return fault.Errorf(fault.ErrColdStoreFailed, "list the staged snapshot parts of %s: %v", k.Stream, err)
	}
	t.staged.mu.Lock()
	defer t.staged.mu.Unlock()
	if sg = t.staged.group(g, term); sg == nil {
		return nil
	}
	ss := sg.stream(prefix, k)
	if ss.listed {
		return nil
	}
	var committed []string
	if m, ok := t.groups.Machine(g).Lookup(k); ok {
		committed = t.groups.Machine(g).SnapshotOf(k, m.Incarnation).GetPartKeys()
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
	if len(ss.parts) == 0 && len(ss.committing) == 0 {
		// Nothing staged: keep no entry, so that the seed listing of a
		// group of a million streams without parts holds no memory per
		// stream. A later need lists the prefix again, which is only
		// redundant.
		delete(sg.streams, prefix)
		return nil
	}
	ss.listed = true
	return nil
}

// StagePart stores part n of the snapshot at pos of stream k (incarnation
// inc), on the leader of its group g in term, replacing an earlier upload
// of that part, and returns the part's SHA-256 (hex).
func (t *Tier) StagePart(ctx context.Context, g uint32, term uint64, k stream.Key, inc, pos uint64, n uint32, body []byte) (string, error) {
	if t.store == nil {
		return "", errNoStore("staging snapshot parts")
	}
	t.startCounting(g, term)
	prefix := coldfmt.StreamPrefix(k.Bucket, k.Stream, inc)
	if err := t.listStaged(ctx, g, term, k, prefix); err != nil {
		return "", err
	}
	var staged uint64
	var committing bool
	t.staged.mu.Lock()
	if sg := t.staged.group(g, term); sg != nil {
		ss := sg.stream(prefix, k)
		staged = ss.bytes() - ss.parts[pos][n].size
		committing = ss.committing[pos]
	}
	t.staged.mu.Unlock()
	if committing {
		return "", errCommitting(pos)
	}
	if staged+uint64(len(body)) > MaxStagedSnapshotBytes {
		return "", fault.Errorf(fault.ErrPayloadTooLarge, "stream %s would stage more than %d bytes of snapshot parts", k.Stream, MaxStagedSnapshotBytes)
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	key := coldfmt.SnapshotPartKey(prefix, pos, n)
	if err := t.Put(ctx, key, body, "snapshot part"); err != nil {
		return "", err
	}
	var replaced string
	t.staged.mu.Lock()
	if sg := t.staged.group(g, term); sg != nil {
		ss := sg.stream(prefix, k)
		if ss.committing[pos] {
			t.staged.mu.Unlock()
			t.Discard(key)
			return "", errCommitting(pos)
		}
		ps := ss.parts[pos]
		if ps == nil {
			ps = map[uint32]stagedPart{}
			ss.parts[pos] = ps
		}
		// A listing that ran meanwhile may have learned this very object:
		// it is not an earlier upload to delete.
		if old := ps[n].key; old != key {
			replaced = old
		}
		ps[n] = stagedPart{key: key, size: uint64(len(body)), digest: digest, modified: t.now()}
	}
	t.staged.mu.Unlock()
	if replaced != "" {
		t.Discard(replaced)
	}
	return digest, nil
}

// Commit holds the staged parts 1..N of one snapshot while a commit reads
// them: until End, they cannot be replaced.
type Commit struct {
	t      *Tier
	g      uint32
	term   uint64
	key    stream.Key
	prefix string
	pos    uint64
	ss     *stagedStream
	parts  []stagedPart
	want   []string
	// Total is the parts' size.
	Total uint64
}

// BeginCommit checks that the parts 1..len(digests) of the snapshot at pos
// are staged with those digests (a part learned from a listing is checked
// when Digest reads it) and holds them. Call End when done.
func (t *Tier) BeginCommit(ctx context.Context, g uint32, term uint64, k stream.Key, inc, pos uint64, digests []string) (*Commit, error) {
	if t.store == nil {
		return nil, errNoStore("committing staged snapshot parts")
	}
	t.startCounting(g, term)
	prefix := coldfmt.StreamPrefix(k.Bucket, k.Stream, inc)
	if err := t.listStaged(ctx, g, term, k, prefix); err != nil {
		return nil, err
	}
	c := &Commit{t: t, g: g, term: term, key: k, prefix: prefix, pos: pos, parts: make([]stagedPart, len(digests)), want: digests}
	t.staged.mu.Lock()
	defer t.staged.mu.Unlock()
	var ps map[uint32]stagedPart
	if sg := t.staged.group(g, term); sg != nil {
		c.ss = sg.stream(prefix, k)
		if c.ss.committing[pos] {
			return nil, errCommitting(pos)
		}
		ps = c.ss.parts[pos]
	}
	for i, want := range digests {
		n := uint32(i + 1)
		p, ok := ps[n]
		if !ok {
			return nil, fault.Errorf(fault.ErrInvalidArgument, "part %d of the snapshot at %s is not staged", n, stream.FormatOffset(pos))
		}
		if p.digest != "" && p.digest != want {
			return nil, fault.Errorf(fault.ErrSnapshotConflict, "part %d has digest %s, not %s", n, p.digest, want)
		}
		c.parts[i] = p
		c.Total += p.size
	}
	if c.Total > MaxStagedSnapshotBytes {
		return nil, fault.Errorf(fault.ErrPayloadTooLarge, "snapshot of %d bytes exceeds %d", c.Total, MaxStagedSnapshotBytes)
	}
	c.ss.committing[pos] = true
	return c, nil
}

// End releases the parts.
func (c *Commit) End() {
	c.t.staged.mu.Lock()
	delete(c.ss.committing, c.pos)
	c.t.staged.mu.Unlock()
}

// Ref is the snapshot the parts make, with its digest.
func (c *Commit) Ref(contentType, digest string) *storagev1.SnapshotRef {
	ref := &storagev1.SnapshotRef{Position: c.pos, Digest: digest, ContentType: contentType, Size: c.Total}
	for i, p := range c.parts {
		ref.PartKeys = append(ref.PartKeys, p.key)
		ref.PartSizes = append(ref.PartSizes, p.size)
		ref.PartDigests = append(ref.PartDigests, c.want[i])
	}
	return ref
}

// Settle ends the staging at the commit's position: the parts the
// snapshot names leave the index, the others are deleted.
func (c *Commit) Settle(committed []string) {
	c.t.settleStaged(c.g, c.term, c.prefix, c.pos, committed)
}

// settleStaged ends the staging at pos after a commit: the parts the
// snapshot names leave the index, the others are deleted.
func (t *Tier) settleStaged(g uint32, term uint64, prefix string, pos uint64, committed []string) {
	var drop []string
	t.staged.mu.Lock()
	if sg := t.staged.group(g, term); sg != nil {
		if ss := sg.streams[prefix]; ss != nil {
			for _, p := range ss.parts[pos] {
				if !slices.Contains(committed, p.key) {
					drop = append(drop, p.key)
				}
			}
			delete(ss.parts, pos)
		}
	}
	t.staged.mu.Unlock()
	t.Discard(drop...)
}

// Digest streams the parts from the store and returns the snapshot's
// digest (stream.SnapshotDigest of the concatenation); a part whose bytes
// do not have the digest the commit names is a conflict.
func (c *Commit) Digest(ctx context.Context, ct string) (string, error) {
	t, parts := c.t, c.parts
	h := sha256.New()
	h.Write([]byte(ct))
	h.Write([]byte{0})
	var ph hash.Hash
	for i, p := range parts {
		ph = sha256.New()
		for off := int64(0); off < int64(p.size); off += digestWindow {
			n := min(digestWindow, int64(p.size)-off)
			b, err := t.store.GetRange(ctx, p.key, off, n)
			if err == nil && int64(len(b)) != n {
				err = errors.New("short read")
			}
			if err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				t.stats.ReadErrors.Add(1)
				return "", fault.Errorf(fault.ErrColdStoreFailed, "read snapshot part %d (%s): %v", i+1, p.key, err)
			}
			h.Write(b)
			ph.Write(b)
		}
		got := hex.EncodeToString(ph.Sum(nil))
		if p.digest != "" && got != p.digest {
			// This leader computed the part's digest as it stored it: the
			// object changed since.
			return "", t.readFailed(ctx, c.key, fmt.Sprintf("read snapshot part %d", i+1),
				fmt.Errorf("%w: part %d (%s) has digest %s, staged with %s", coldfmt.ErrCorrupt, i+1, p.key, got, p.digest))
		}
		if got != c.want[i] {
			return "", fault.Errorf(fault.ErrSnapshotConflict, "part %d has digest %s, not %s", i+1, got, c.want[i])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// errCommitting refuses a part upload or commit while another commit at
// the same position reads the parts.
func errCommitting(pos uint64) error {
	return fault.Errorf(fault.ErrSnapshotConflict, "a commit of the snapshot at %s is in progress", stream.FormatOffset(pos)).With(fault.DetailRetryAfterMS, "1000")
}

// StagedUsage is the staged snapshot parts no commit has used yet in one
// group this node leads, by bucket. CountingFinished is false until the
// term's seed listing of the group's streams ended.
type StagedUsage struct {
	GroupID          uint32
	Term             uint64
	CountingFinished bool
	Bytes            map[string]uint64
}

// StagedUsage reports, for each group this node leads, its term and the
// bytes of its staged snapshot parts per bucket. It lists nothing itself:
// a term's totals start at the node's first part, commit or discard in the
// group, or when a report (or the flush loop) finds the node leading it,
// and the seed loop then lists the group's streams in the background
// (CountingFinished false until it is done). Every led group is reported,
// with no bytes when it has none, so that a collector can tell a group
// without parts from a group nobody reported.
func (t *Tier) StagedUsage(context.Context) []StagedUsage {
	if t.store == nil {
		return nil
	}
	var out []StagedUsage
	for i := range t.groups.GroupCount() {
		g := uint32(i)
		if !t.groups.Leads(g) {
			continue
		}
		st := t.groups.Status(g)
		t.startCounting(g, st.Term)
		m := t.groups.Machine(g)
		u := StagedUsage{GroupID: g, Term: st.Term, Bytes: map[string]uint64{}}
		t.staged.mu.Lock()
		if sg := t.staged.group(g, st.Term); sg != nil {
			u.CountingFinished = sg.counted
			for prefix, ss := range sg.streams {
				// Parts staged under an earlier incarnation can never be
				// committed.
				if cur, ok := m.CurrentPrefix(ss.key); !ok || cur != prefix {
					// The stream is gone: its prefix's GC took the parts.
					delete(sg.streams, prefix)
					continue
				}
				if n := ss.bytes(); n > 0 {
					u.Bytes[ss.key.Bucket] += n
				}
			}
		}
		t.staged.mu.Unlock()
		out = append(out, u)
	}
	return out
}

// startCounting starts group g's totals for term, and hands the seed
// listing of its streams to the seed loop unless it runs or ran.
func (t *Tier) startCounting(g uint32, term uint64) {
	t.staged.mu.Lock()
	sg := t.staged.group(g, term)
	start := sg != nil && !sg.seeding && !sg.counted
	if start {
		sg.seeding = true
	}
	t.staged.mu.Unlock()
	if !start {
		return
	}
	select {
	case t.seeds <- seed{g: g, term: term}:
	default:
		// The loop is behind on more groups than there are: a later
		// trigger asks again.
		t.staged.mu.Lock()
		if sg := t.staged.group(g, term); sg != nil {
			sg.seeding = false
		}
		t.staged.mu.Unlock()
	}
}

// seed asks the seed loop to list group g's staged parts in term.
type seed struct {
	g    uint32
	term uint64
}

// seedLoop runs the seed listings one at a time until ctx ends.
func (t *Tier) seedLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-t.seeds:
			t.seedGroup(ctx, s.g, s.term)
		}
	}
}

// seedGroup lists the staged parts of every current stream of group g
// (listStaged skips streams already listed in the term) and marks the
// term's totals counted; after a failed listing the next trigger tries
// again.
func (t *Tier) seedGroup(ctx context.Context, g uint32, term uint64) {
	ok := true
	for prefix, k := range t.groups.Machine(g).CurrentPrefixes() {
		if err := t.listStaged(ctx, g, term, k, prefix); err != nil {
			if ctx.Err() == nil {
				t.logger.Warn("list staged snapshot parts", "group_id", g, "stream", k.Stream, "err", err)
			}
			ok = false
			break
		}
	}
	t.staged.mu.Lock()
	defer t.staged.mu.Unlock()
	if sg := t.staged.group(g, term); sg != nil {
		sg.seeding = false
		sg.counted = ok
	}
}
