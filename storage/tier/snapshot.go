package tier

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// SnapshotKey names a new application-snapshot object under a stream
// prefix: the position and digest it stands for, and a nonce so that a
// snapshot published again after it was replaced never reuses a key the
// GC queue still holds.
func SnapshotKey(prefix string, pos uint64, digest string) string {
	return fmt.Sprintf("%ss/%020d-%s-%s", prefix, pos, digest, nonce())
}

// SnapshotPartsPrefix is the directory of the staged parts of a snapshot
// at pos under a stream prefix.
func SnapshotPartsPrefix(prefix string, pos uint64) string {
	return fmt.Sprintf("%ssp/%020d/", prefix, pos)
}

// SnapshotPartKey names a new object for part n of a snapshot at pos.
func SnapshotPartKey(prefix string, pos uint64, n uint32) string {
	return fmt.Sprintf("%s%05d-%s", SnapshotPartsPrefix(prefix, pos), n, nonce())
}

// ParseSnapshotPartKey returns the position and part number of a key
// SnapshotPartKey made under prefix.
func ParseSnapshotPartKey(prefix, key string) (pos uint64, n uint32, ok bool) {
	rest, found := strings.CutPrefix(key, prefix+"sp/")
	if !found {
		return 0, 0, false
	}
	ps, name, found := strings.Cut(rest, "/")
	if !found || len(ps) != 20 {
		return 0, 0, false
	}
	ns, _, found := strings.Cut(name, "-")
	if !found || len(ns) != 5 {
		return 0, 0, false
	}
	p, err := strconv.ParseUint(ps, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(ns, 10, 32)
	if err != nil || v == 0 {
		return 0, 0, false
	}
	return p, uint32(v), true
}

// Boundary reports whether pos, inside or at the end of leaf (a chunk or
// external payload), is a unit boundary: the end of the leaf, a record end
// of a chunk, or (json) the end of a message.
func (r *Reader) Boundary(ctx context.Context, leaf *storagev1.ColdRef, pos uint64, json bool) (bool, error) {
	if pos <= leaf.GetStart() || pos > leaf.GetEnd() {
		return false, fmt.Errorf("tier: position %d outside object %q (%d, %d]", pos, leaf.GetKey(), leaf.GetStart(), leaf.GetEnd())
	}
	if pos == leaf.GetEnd() {
		return true, nil
	}
	if leaf.GetKind() == storagev1.ColdKind_COLD_KIND_CHUNK && leaf.GetRecords() > 0 {
		recs, err := r.records(ctx, leaf)
		if err != nil {
			return false, err
		}
		if i := sort.Search(len(recs), func(i int) bool { return recs[i] >= pos }); i < len(recs) && recs[i] == pos {
			return true, nil
		}
	}
	if !json {
		return false, nil
	}
	b, err := r.cache.ReadAt(ctx, leaf.GetKey(), int64(leaf.GetSize()), int64(pos-1-leaf.GetStart()), 1)
	if err != nil {
		return false, err
	}
	return len(b) == 1 && b[0] == '\n', nil
}
