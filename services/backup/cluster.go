package backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/storage/backupfmt"
)

// infoTimeout bounds one node's GetBackupInfo.
const infoTimeout = 30 * time.Second

// node is one of the nodes the caller named.
type node struct {
	client backupv1.BackupServiceClient
	// index is the node's place in the caller's list (its name in
	// messages when it never answered).
	index int
	info  *backupv1.BackupInfo
}

func (n *node) String() string {
	if n.info != nil {
		return fmt.Sprintf("node %d", n.info.GetNodeId())
	}
	return fmt.Sprintf("node #%d", n.index)
}

// cluster is what the nodes told about their cluster, and the leaders
// learnt since.
type cluster struct {
	// nodes answered GetBackupInfo, in the caller's order.
	nodes         []*node
	byID          map[uint64]*node
	clusterID     string
	groupCount    uint32
	formatVersion uint32
	// maxImport is the smallest max_import_bytes the nodes report (0:
	// none reported one).
	maxImport uint64
	log       *slog.Logger
	backoff   func(attempt int) time.Duration

	mu      sync.Mutex
	leaders map[uint32]*node
}

// discover asks every node for its BackupInfo. The nodes that answer must
// agree on the cluster id, the group count and the format version, which
// must be this build's (ErrPrecondition otherwise); with all, every node
// must answer (ErrPrecondition otherwise).
func discover(ctx context.Context, clients []backupv1.BackupServiceClient, all bool, log *slog.Logger) (*cluster, error) {
	if len(clients) == 0 {
		return nil, errors.New("backup: no nodes configured")
	}
	infos := make([]*backupv1.BackupInfo, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, infoTimeout)
			defer cancel()
			infos[i], errs[i] = c.GetBackupInfo(cctx, &backupv1.GetBackupInfoRequest{})
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cl := &cluster{byID: map[uint64]*node{}, leaders: map[uint32]*node{}, log: log, backoff: defaultBackoff}
	var failed []error
	for i, c := range clients {
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("node #%d: %w", i, errs[i]))
			log.Warn("node did not answer GetBackupInfo", "node", i, "err", errs[i])
			continue
		}
		n := &node{client: c, index: i, info: infos[i]}
		if len(cl.nodes) == 0 {
			cl.clusterID, cl.groupCount, cl.formatVersion = n.info.GetClusterId(), n.info.GetGroupCount(), n.info.GetFormatVersion()
		}
		switch {
		case n.info.GetClusterId() != cl.clusterID:
			return nil, fmt.Errorf("%w: %s (#%d) is in cluster %q, %s in %q", ErrPrecondition, n, i, n.info.GetClusterId(), cl.nodes[0], cl.clusterID)
		case n.info.GetGroupCount() != cl.groupCount:
			return nil, fmt.Errorf("%w: %s (#%d) has %d groups, %s %d", ErrPrecondition, n, i, n.info.GetGroupCount(), cl.nodes[0], cl.groupCount)
		case n.info.GetFormatVersion() != cl.formatVersion:
			return nil, fmt.Errorf("%w: %s (#%d) has format version %d, %s %d", ErrPrecondition, n, i, n.info.GetFormatVersion(), cl.nodes[0], cl.formatVersion)
		}
		if _, dup := cl.byID[n.info.GetNodeId()]; dup {
			continue // two addresses of one node
		}
		cl.byID[n.info.GetNodeId()] = n
		cl.nodes = append(cl.nodes, n)
		if m := n.info.GetMaxImportBytes(); m > 0 && (cl.maxImport == 0 || m < cl.maxImport) {
			cl.maxImport = m
		}
	}
	switch {
	case len(cl.nodes) == 0:
		return nil, fmt.Errorf("backup: no node answered: %w", errors.Join(failed...))
	case all && len(failed) > 0:
		return nil, fmt.Errorf("%w: every node must answer: %w", ErrPrecondition, errors.Join(failed...))
	case cl.formatVersion != backupfmt.FormatVersion:
		return nil, fmt.Errorf("%w: the cluster has backup format version %d, this build %d", ErrPrecondition, cl.formatVersion, backupfmt.FormatVersion)
	case cl.groupCount == 0:
		return nil, fmt.Errorf("%w: the cluster reports 0 groups", ErrPrecondition)
	}
	return cl, nil
}

// coldStore is the cold store the nodes report: ok is false when none
// does; an error when they name different ones.
func (cl *cluster) coldStore() (store, endpoint string, ok bool, err error) {
	for _, n := range cl.nodes {
		s, e := n.info.GetColdStore(), n.info.GetColdEndpoint()
		if s == "" {
			continue
		}
		if !ok {
			store, endpoint, ok = s, e, true
			continue
		}
		if s != store || e != endpoint {
			return "", "", false, fmt.Errorf("%w: the nodes name different cold stores (%q at %q, %q at %q); name it explicitly", ErrPrecondition, store, endpoint, s, e)
		}
	}
	return store, endpoint, ok, nil
}

// defaultBackoff is the pause before retry attempt (0-based): 50 ms,
// doubling, at most 2 s.
func defaultBackoff(attempt int) time.Duration {
	d := 50 * time.Millisecond << min(attempt, 6)
	return min(d, 2*time.Second)
}

// onLeader runs call on the group's leader: it starts on the last leader
// seen (or a node picked by the group), follows NOT_LEADER hints among the
// nodes it knows, and retries answers that say "not now" (no leader,
// unavailable, a lost outcome) with backoff, on the next node, until ctx
// ends. Any other error is returned as it came.
func (cl *cluster) onLeader(ctx context.Context, group uint32, call func(ctx context.Context, n *node) error) error {
	return cl.retry(ctx, group, true, call)
}

// onAny runs call on any node, as onLeader does but without learning a
// leader from the node that answered (a read any replica serves).
func (cl *cluster) onAny(ctx context.Context, group uint32, call func(ctx context.Context, n *node) error) error {
	return cl.retry(ctx, group, false, call)
}

func (cl *cluster) retry(ctx context.Context, group uint32, leads bool, call func(ctx context.Context, n *node) error) error {
	cl.mu.Lock()
	cur := cl.leaders[group]
	cl.mu.Unlock()
	next := int(group) % len(cl.nodes)
	if cur == nil {
		cur = cl.nodes[next]
	}
	attempt, hops := 0, 0
	for {
		err := call(ctx, cur)
		if err == nil && !leads {
			return nil
		}
		if err == nil {
			cl.mu.Lock()
			cl.leaders[group] = cur
			cl.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("group %d: %w (last answer from %s: %v)", group, context.Cause(ctx), cur, err)
		}
		a, leader := classify(err)
		switch a {
		case answerNotLeader:
			// Follow a hint at once, but not around a loop of stale hints.
			if n := cl.byID[leader]; n != nil && n != cur && hops < len(cl.nodes) {
				hops++
				cur = n
				continue
			}
		case answerRetry:
		default:
			return err
		}
		hops = 0
		cl.log.Debug("retrying on another node", "group_id", group, "node", cur.String(), "err", err)
		t := time.NewTimer(cl.backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("group %d: %w (last answer from %s: %v)", group, context.Cause(ctx), cur, err)
		case <-t.C:
		}
		attempt++
		next = (next + 1) % len(cl.nodes)
		cur = cl.nodes[next]
	}
}
