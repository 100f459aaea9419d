package backupfmt

import (
	"context"
	"errors"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
)

// Ref is one cold object a snapshot references.
type Ref struct {
	Key  string
	Size uint64
	// Check identifies the object's content beyond its key and size, when
	// the reference carries it: "crc32c:xxxxxxxx" for chunks, external
	// payloads and pages, "sha256:<hex>" for a part of an application
	// snapshot, "" otherwise. Keys carry a nonce and objects are never
	// rewritten, so key, size and check name one content.
	Check string
}

// PageReader returns the body of an index page; Walk verifies it against
// the reference's checksum before it decodes it. A reader that cannot
// read a page and wants the walk to go on without what the page indexes
// (a check that reports missing objects) returns an error wrapping
// ErrSkipPage.
type PageReader func(ctx context.Context, ref *storagev1.ColdRef) ([]byte, error)

// ErrSkipPage, from a PageReader, makes Walk skip what the page indexes
// instead of stopping.
var ErrSkipPage = errors.New("backupfmt: skip the page")

// Walk calls fn once for every distinct cold object snap references: the
// stream's index entries at every level (reading each sealed page through
// readPage to reach what it indexes), external payloads in the hot window
// and the objects of published application snapshots. The order is
// deterministic. A page that cannot be read or verified stops the walk,
// unless readPage answers ErrSkipPage.
func Walk(ctx context.Context, snap *storagev1.Snapshot, readPage PageReader, fn func(Ref) error) error {
	seen := map[string]struct{}{}
	emit := func(r Ref) error {
		if r.Key == "" {
			return nil
		}
		if _, ok := seen[r.Key]; ok {
			return nil
		}
		seen[r.Key] = struct{}{}
		return fn(r)
	}
	var walk func(refs []*storagev1.ColdRef) error
	walk = func(refs []*storagev1.ColdRef) error {
		for _, r := range refs {
			if _, ok := seen[r.GetKey()]; ok {
				continue
			}
			if err := emit(coldRef(r)); err != nil {
				return err
			}
			if r.GetKind() != storagev1.ColdKind_COLD_KIND_PAGE {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			body, err := readPage(ctx, r)
			if errors.Is(err, ErrSkipPage) {
				continue
			}
			if err != nil {
				return fmt.Errorf("read index page %s: %w", r.GetKey(), err)
			}
			entries, err := coldfmt.DecodePage(body, r.GetCrc32C())
			if err != nil {
				return fmt.Errorf("index page %s: %w", r.GetKey(), err)
			}
			if err := walk(entries); err != nil {
				return err
			}
		}
		return nil
	}
	for _, st := range snap.GetStreams() {
		for _, x := range st.GetHotExternal() {
			if err := emit(coldRef(x.GetRef())); err != nil {
				return err
			}
		}
		if s := st.GetSnapshot(); s != nil {
			if s.GetKey() != "" {
				if err := emit(Ref{Key: s.GetKey(), Size: s.GetSize()}); err != nil {
					return err
				}
			}
			for i, k := range s.GetPartKeys() {
				r := Ref{Key: k}
				if i < len(s.GetPartSizes()) {
					r.Size = s.GetPartSizes()[i]
				}
				if i < len(s.GetPartDigests()) {
					r.Check = "sha256:" + s.GetPartDigests()[i]
				}
				if err := emit(r); err != nil {
					return err
				}
			}
		}
		for _, lv := range st.GetColdIndex() {
			if err := walk(lv.GetEntries()); err != nil {
				return err
			}
		}
	}
	return nil
}

func coldRef(r *storagev1.ColdRef) Ref {
	return Ref{Key: r.GetKey(), Size: r.GetSize(), Check: fmt.Sprintf("crc32c:%08x", r.GetCrc32C())}
}
