package tier

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

var errFound = errors.New("found")

// CheckFormatEpoch makes sure the cold root is ours: it holds the marker of
// this format, or it is empty and gets the marker. A root holding objects
// without the marker, or another epoch, is refused: it belongs to something
// else, and our GC would delete its objects.
func CheckFormatEpoch(ctx context.Context, store objstore.Store) error {
	body, err := store.Get(ctx, coldfmt.FormatEpochKey)
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(body)); got != coldfmt.FormatEpoch {
			return fmt.Errorf("cold store: format epoch %q, this build writes %q", got, coldfmt.FormatEpoch)
		}
		return nil
	case !errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("cold store: read the format epoch: %w", err)
	}
	// Another node may write the marker while this one looks: a listing
	// that finds it validates it instead of taking it for a stranger.
	var first string
	sawMarker := false
	err = store.List(ctx, "", func(in objstore.Info) error {
		if in.Key == coldfmt.FormatEpochKey {
			sawMarker = true
			return nil
		}
		first = in.Key
		return errFound
	})
	if err != nil && !errors.Is(err, errFound) {
		return fmt.Errorf("cold store: list the root: %w", err)
	}
	if sawMarker {
		return CheckFormatEpochWritten(ctx, store)
	}
	if first != "" {
		// The marker may have landed after the listing passed its key.
		if werr := CheckFormatEpochWritten(ctx, store); werr == nil {
			return nil
		}
		return fmt.Errorf("cold store: the root holds objects (such as %q) but no %s marker: refusing a prefix that is not Ursula's", first, coldfmt.FormatEpochKey)
	}
	if _, err := store.PutIfAbsent(ctx, coldfmt.FormatEpochKey, []byte(coldfmt.FormatEpoch+"\n")); err != nil {
		return fmt.Errorf("cold store: write the format epoch: %w", err)
	}
	return CheckFormatEpochWritten(ctx, store)
}

// CheckFormatEpochWritten re-reads the marker (another node may have
// written it first).
func CheckFormatEpochWritten(ctx context.Context, store objstore.Store) error {
	body, err := store.Get(ctx, coldfmt.FormatEpochKey)
	if err != nil {
		return fmt.Errorf("cold store: read the format epoch: %w", err)
	}
	if got := strings.TrimSpace(string(body)); got != coldfmt.FormatEpoch {
		return fmt.Errorf("cold store: format epoch %q, this build writes %q", got, coldfmt.FormatEpoch)
	}
	return nil
}
