package tier

import (
	"context"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

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
	lv, err := r.open(ctx, leaf)
	if err != nil {
		return false, err
	}
	if i := lv.searchRecords(func(e uint64) bool { return e >= pos }); i < lv.footer.Records() && lv.recordEnd(i) == pos {
		return true, nil
	}
	if !json {
		return false, nil
	}
	b, err := lv.read(ctx, pos-1, pos)
	if err != nil {
		return false, err
	}
	return len(b) == 1 && b[0] == '\n', nil
}
