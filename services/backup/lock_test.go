package backup

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/objstore"
)

var discard = slog.New(slog.DiscardHandler)

func TestLockContention(t *testing.T) {
	ctx := t.Context()
	loc := NewLocation(objstore.NewMemory(), "mem")
	// Prune's lock reads the real clock.
	now := time.Now()
	clock := func() time.Time { return now }
	held, err := acquireLock(ctx, loc, "first", clock, discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquireLock(ctx, loc, "second", clock, discard); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), `"first"`) {
		t.Fatalf("second lock: %v, want ErrLocked naming the holder", err)
	}
	if _, err := Prune(ctx, loc, Retention{KeepLast: 1}, now); !errors.Is(err, ErrLocked) {
		t.Fatalf("prune under the lock: %v", err)
	}
	e := newEnv(t)
	e.loc = loc
	if _, err := Create(ctx, e.nodes, loc, CreateOptions{Now: clock}); !errors.Is(err, ErrLocked) {
		t.Fatalf("create under the lock: %v", err)
	}
	held.release(ctx)
	again, err := acquireLock(ctx, loc, "third", clock, discard)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	// A release by a holder whose lock was taken over leaves the new one.
	held.release(ctx)
	if b, err := readLock(ctx, loc); err != nil || b.Token != again.body.Token {
		t.Fatalf("lock after a stale release: %+v, %v", b, err)
	}
}

func TestLockTakeOverAnExpiredOne(t *testing.T) {
	ctx := t.Context()
	loc := NewLocation(objstore.NewMemory(), "mem")
	then := time.Date(2026, 7, 25, 0, 0, 0, 0, time.UTC)
	stale, err := acquireLock(ctx, loc, "crashed", func() time.Time { return then }, discard)
	if err != nil {
		t.Fatal(err)
	}
	early := func() time.Time { return then.Add(lockTTL - time.Second) }
	if _, err := acquireLock(ctx, loc, "early", early, discard); !errors.Is(err, ErrLocked) {
		t.Fatalf("lock before the expiry: %v", err)
	}
	late := func() time.Time { return then.Add(lockTTL + time.Second) }
	// Several takers race for the expired lock: exactly one wins.
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		winner []*lock
	)
	for range 8 {
		wg.Go(func() {
			l, err := acquireLock(ctx, loc, "taker", late, discard)
			if err == nil {
				mu.Lock()
				winner = append(winner, l)
				mu.Unlock()
			} else if !errors.Is(err, ErrLocked) {
				t.Errorf("taker: %v", err)
			}
		})
	}
	wg.Wait()
	if len(winner) != 1 {
		t.Fatalf("%d takers won the expired lock", len(winner))
	}
	// The crashed holder, back, finds its lock lost and gives up.
	if err := stale.renew(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("renewal of a lock taken over: %v", err)
	}
	if err := winner[0].renew(ctx); err != nil {
		t.Fatalf("renewal by the new holder: %v", err)
	}
	b, err := readLock(ctx, loc)
	if err != nil || b.Token != winner[0].body.Token || !b.Expires.After(then.Add(lockTTL)) {
		t.Fatalf("lock %+v, %v", b, err)
	}
}

func TestLockUnreadableIsTakenOver(t *testing.T) {
	ctx := t.Context()
	loc := NewLocation(objstore.NewMemory(), "mem")
	if err := loc.store.Put(ctx, lockKey, []byte("{torn")); err != nil {
		t.Fatal(err)
	}
	l, err := acquireLock(ctx, loc, "next", time.Now, discard)
	if err != nil {
		t.Fatalf("lock over an unreadable one: %v", err)
	}
	raw, _ := loc.store.Get(ctx, lockKey)
	var b lockBody
	if err := json.Unmarshal(raw, &b); err != nil || b.Token != l.body.Token || b.ID != "next" || b.PID == 0 {
		t.Fatalf("lock body %s: %v", raw, err)
	}
}
