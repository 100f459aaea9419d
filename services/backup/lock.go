package backup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// lockTTL is how long a lock lasts without a renewal; it is renewed every
// third of it, so a writer must stall for two thirds of it before another
// may take the lock over.
const lockTTL = 10 * time.Minute

// releaseTimeout bounds the cleanup (lock release, hold release) that runs
// after the operation's context ended; it fits in a process's shutdown
// deadline (20 s), and what it does not finish expires on its own.
const releaseTimeout = 10 * time.Second

// lockBody is the lock object (doc.go).
type lockBody struct {
	// ID names the operation: a backup id, or "prune".
	ID string `json:"id"`
	// Token is random per acquisition: the holder recognises its own lock
	// by it (two operations may share an id).
	Token   string    `json:"token"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Expires time.Time `json:"expires"`
}

// lock is a held location lock.
type lock struct {
	loc  *Location
	now  func() time.Time
	body lockBody
	log  *slog.Logger

	mu   sync.Mutex
	lost error // set once a renewal found the lock taken over
}

// acquireLock takes the location's lock for operation id: created with
// PutIfAbsent, or taken over from a holder whose lock expired. The
// takeover is serialized by a PutIfAbsent of a marker named after the
// expired lock's token, which only one taker wins. ErrLocked when a live
// lock is held.
func acquireLock(ctx context.Context, loc *Location, id string, now func() time.Time, log *slog.Logger) (*lock, error) {
	host, _ := os.Hostname()
	tok := make([]byte, 12)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	t := now().UTC()
	l := &lock{loc: loc, now: now, log: log, body: lockBody{
		ID: id, Token: hex.EncodeToString(tok), Host: host, PID: os.Getpid(), Started: t, Expires: t.Add(lockTTL),
	}}
	body, err := json.Marshal(l.body)
	if err != nil {
		return nil, err
	}
	created, err := loc.store.PutIfAbsent(ctx, lockKey, body)
	if err != nil {
		return nil, fmt.Errorf("take the lock of %s: %w", loc, err)
	}
	if created {
		return l, nil
	}
	held, err := readLock(ctx, loc)
	if errors.Is(err, objstore.ErrNotFound) {
		// Released meanwhile: one more try, no loop (a busy location
		// answers ErrLocked rather than spinning).
		if created, err = loc.store.PutIfAbsent(ctx, lockKey, body); err == nil && created {
			return l, nil
		}
		return nil, fmt.Errorf("%w: %s: another writer took the lock", ErrLocked, loc)
	}
	if err != nil {
		return nil, err
	}
	if !t.After(held.Expires) {
		return nil, fmt.Errorf("%w: %s: held by %q (host %s, pid %d) since %s, until %s",
			ErrLocked, loc, held.ID, held.Host, held.PID, held.Started.Format(time.RFC3339), held.Expires.Format(time.RFC3339))
	}
	won, err := loc.store.PutIfAbsent(ctx, takeoverPrefix+held.Token, body)
	if err != nil {
		return nil, fmt.Errorf("take over the expired lock of %s: %w", loc, err)
	}
	if !won {
		return nil, fmt.Errorf("%w: %s: another writer is taking over the expired lock of %q", ErrLocked, loc, held.ID)
	}
	// Only the winner gets here, but the lock may have been released and
	// taken afresh since it was read.
	if again, err := readLock(ctx, loc); err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return nil, err
	} else if err == nil && again.Token != held.Token {
		return nil, fmt.Errorf("%w: %s: held by %q since %s", ErrLocked, loc, again.ID, again.Started.Format(time.RFC3339))
	}
	if err := loc.store.Put(ctx, lockKey, body); err != nil {
		return nil, fmt.Errorf("take over the lock of %s: %w", loc, err)
	}
	log.Warn("took over an expired backup lock", "location", loc.String(), "held_by", held.ID,
		"host", held.Host, "pid", held.PID, "expired", held.Expires.Format(time.RFC3339))
	return l, nil
}

func readLock(ctx context.Context, loc *Location) (lockBody, error) {
	raw, err := loc.store.Get(ctx, lockKey)
	if err != nil {
		return lockBody{}, err
	}
	var b lockBody
	if err := json.Unmarshal(raw, &b); err != nil {
		// An unreadable lock is treated as expired long ago, so that a
		// torn write cannot block the location forever; its token is the
		// digest of its bytes, so takers still serialize on one marker.
		return lockBody{Token: "unreadable-" + contentToken(raw)}, nil
	}
	return b, nil
}

// contentToken is a short stable name for bytes.
func contentToken(b []byte) string {
	return backupfmt.Digest(b)[:32]
}

// check returns the error that ended the lock, if a renewal found it lost.
func (l *lock) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// renew extends the lock when it is still ours.
func (l *lock) renew(ctx context.Context) error {
	if err := l.check(); err != nil {
		return err
	}
	held, err := readLock(ctx, l.loc)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		return l.lose(fmt.Errorf("%w: %s: the lock was removed by someone else", ErrLocked, l.loc))
	case err != nil:
		return fmt.Errorf("renew the lock of %s: %w", l.loc, err) // try again next time
	case held.Token != l.body.Token:
		return l.lose(fmt.Errorf("%w: %s: the lock was taken over by %q (host %s, pid %d)", ErrLocked, l.loc, held.ID, held.Host, held.PID))
	}
	b := l.body
	b.Expires = l.now().UTC().Add(lockTTL)
	raw, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if err := l.loc.store.Put(ctx, lockKey, raw); err != nil {
		return fmt.Errorf("renew the lock of %s: %w", l.loc, err)
	}
	return nil
}

func (l *lock) lose(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = err
	}
	return l.lost
}

// holdLock takes the location's lock for operation id and keeps it while
// the operation runs: the returned context ends when the lock turns out
// lost, and done stops the renewals and releases the lock (call it once
// the operation is over).
func holdLock(ctx context.Context, loc *Location, id string, now func() time.Time, log *slog.Logger) (context.Context, *lock, func(), error) {
	lk, err := acquireLock(ctx, loc, id, now, log)
	if err != nil {
		return nil, nil, nil, err
	}
	held, cancel := context.WithCancelCause(ctx)
	var keeper sync.WaitGroup
	keeper.Go(func() { lk.keep(held, cancel) })
	return held, lk, func() {
		cancel(nil)
		keeper.Wait()
		lk.release(ctx)
	}, nil
}

// keep renews the lock every third of its TTL until ctx ends; when the
// lock turns out lost it calls abort, which cancels the operation.
func (l *lock) keep(ctx context.Context, abort func(error)) {
	t := time.NewTicker(lockTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := l.renew(ctx); err != nil {
			if errors.Is(err, ErrLocked) {
				abort(err)
				return
			}
			if ctx.Err() == nil {
				l.log.Warn("lock renewal failed", "location", l.loc.String(), "err", err)
			}
		}
	}
}

// release deletes the lock when it is still ours. It runs after the
// operation, whose context may be over.
func (l *lock) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	held, err := readLock(ctx, l.loc)
	if err != nil || held.Token != l.body.Token {
		return
	}
	if err := l.loc.store.Delete(ctx, lockKey); err != nil {
		l.log.Warn("lock release failed: it expires on its own", "location", l.loc.String(), "err", err,
			"expires", l.body.Expires.Format(time.RFC3339))
	}
}
