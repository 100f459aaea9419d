package coldfmt

import (
	"fmt"
	"hash/crc32"
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// PageFanout is how many entries a cold-index level holds before its
// oldest PageFanout entries are sealed into a page one level up. A
// stream's replicated index is therefore at most PageFanout entries per
// level, and the number of levels grows with the logarithm of its history.
const PageFanout = 64

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodePage is the body of a page object sealing entries, and its digest.
// The encoding is deterministic, so apply can check a seal against its own
// state.
func EncodePage(entries []*storagev1.ColdRef) ([]byte, uint32) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&storagev1.ColdPage{Entries: entries})
	if err != nil {
		panic(fmt.Sprintf("coldfmt: encode cold page: %v", err)) // only fails on invalid UTF-8, which keys never hold
	}
	return b, PageChecksum(b)
}

// PageChecksum is the CRC-32C of a page body (a page reference's crc32c,
// its seal's digest).
func PageChecksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// DecodePage parses a page object after checking it against crc, the
// checksum its reference carries: a page's entries name the objects that
// readers fetch and the cold GC deletes, so an unverified page is never
// decoded.
func DecodePage(b []byte, crc uint32) ([]*storagev1.ColdRef, error) {
	if got := PageChecksum(b); got != crc {
		return nil, fmt.Errorf("%w: page CRC %08x, its reference %08x", ErrCorrupt, got, crc)
	}
	var p storagev1.ColdPage
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: decode cold page: %v", ErrCorrupt, err)
	}
	return p.GetEntries(), nil
}

// FindRef returns the entry of a sorted, contiguous run that covers pos.
func FindRef(entries []*storagev1.ColdRef, pos uint64) *storagev1.ColdRef {
	i := sort.Search(len(entries), func(i int) bool { return entries[i].GetEnd() > pos })
	if i < len(entries) && entries[i].GetStart() <= pos {
		return entries[i]
	}
	return nil
}
