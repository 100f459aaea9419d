package backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ursula/ursula/storage/objstore"
)

// Retention says which complete backups Prune keeps: the KeepLast newest
// and those created within KeepWithin before now (either rule keeps a
// backup; a zero rule keeps nothing by itself). The newest complete
// backup is always kept.
type Retention struct {
	KeepLast   int           `json:"keep_last"`
	KeepWithin time.Duration `json:"keep_within"`
}

// IsZero reports a retention without rules (Prune refuses it).
func (r Retention) IsZero() bool { return r.KeepLast == 0 && r.KeepWithin == 0 }

// Validate refuses negative rules and a retention without any.
func (r Retention) Validate() error {
	switch {
	case r.KeepLast < 0 || r.KeepWithin < 0:
		return fmt.Errorf("backup: retention keep_last %d, keep_within %v: must not be negative", r.KeepLast, r.KeepWithin)
	case r.IsZero():
		return errors.New("backup: retention needs keep_last or keep_within")
	}
	return nil
}

// pruneLockID names Prune in the lock.
const pruneLockID = "prune"

// Prune removes the complete backups r does not keep (manifest first, so
// a backup is invisible before any of its objects goes), the leftovers of
// failed backups, and then every object in objects/ that no remaining
// manifest names. It runs under the location's lock, so no Create runs
// meanwhile. It returns the ids of the complete backups removed.
func Prune(ctx context.Context, loc *Location, r Retention, now time.Time) (removed []string, err error) {
	return prune(ctx, loc, r, now, slog.New(slog.DiscardHandler))
}

func prune(ctx context.Context, loc *Location, r Retention, now time.Time, log *slog.Logger) ([]string, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	ctx, lk, unlock, err := holdLock(ctx, loc, pruneLockID, time.Now, log)
	if err != nil {
		return nil, err
	}
	defer unlock()

	ids, complete, err := loc.backupIDs(ctx)
	if err != nil {
		return nil, err
	}
	// Every manifest must read: the objects a manifest that does not
	// decode names are unknown, so nothing could be collected safely.
	all, err := List(ctx, loc)
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	newestFirst := slices.Clone(all)
	slices.Reverse(newestFirst)
	keep := map[string]bool{}
	var removed []string
	for i, m := range newestFirst {
		if i == 0 || i < r.KeepLast || (r.KeepWithin > 0 && now.Sub(m.CreatedAt) <= r.KeepWithin) {
			keep[m.ID] = true
			continue
		}
		removed = append(removed, m.ID)
	}
	slices.Sort(removed)
	for _, id := range removed {
		if err := loc.store.Delete(ctx, manifestKey(id)); err != nil {
			return nil, fmt.Errorf("prune: remove backup %s: %w", id, err)
		}
		if err := deletePrefix(ctx, loc, backupPrefix(id)); err != nil {
			return nil, fmt.Errorf("prune: remove backup %s: %w", id, err)
		}
		log.Info("backup removed", "backup_id", id)
	}
	// What a failed backup left (no manifest): no Create runs while the
	// lock is held, so none of it is in progress.
	for _, id := range ids {
		if complete[id] {
			continue
		}
		if err := deletePrefix(ctx, loc, backupPrefix(id)); err != nil {
			return nil, fmt.Errorf("prune: remove incomplete backup %s: %w", id, err)
		}
		log.Info("incomplete backup removed", "backup_id", id)
	}
	named := map[string]bool{}
	for _, m := range all {
		if keep[m.ID] {
			for _, c := range m.ColdObjects {
				named[c.Object] = true
			}
		}
	}
	var unnamed []string
	err = loc.store.List(ctx, objectsPrefix, func(info objstore.Info) error {
		if !named[info.Key] {
			unnamed = append(unnamed, info.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("prune: list objects: %w", err)
	}
	if err := lk.check(); err != nil {
		return nil, err
	}
	for chunk := range slices.Chunk(unnamed, 1000) {
		if err := loc.store.Delete(ctx, chunk...); err != nil {
			return nil, fmt.Errorf("prune: remove unreferenced objects: %w", err)
		}
	}
	if len(unnamed) > 0 {
		log.Info("unreferenced objects removed", "objects", len(unnamed))
	}
	if removed == nil {
		removed = []string{}
	}
	return removed, nil
}

// deletePrefix deletes every object under prefix.
func deletePrefix(ctx context.Context, loc *Location, prefix string) error {
	var keys []string
	if err := loc.store.List(ctx, prefix, func(info objstore.Info) error {
		if strings.HasPrefix(info.Key, prefix) {
			keys = append(keys, info.Key)
		}
		return nil
	}); err != nil {
		return err
	}
	for chunk := range slices.Chunk(keys, 1000) {
		if err := loc.store.Delete(ctx, chunk...); err != nil {
			return err
		}
	}
	return nil
}
