package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/wal"
)

// Deps are what a node's storage needs besides its configuration.
type Deps struct {
	// ColdStore is the cold tier's object store; nil keeps every committed
	// byte in memory (tests of the hot path only).
	ColdStore objstore.Store
	// Network is the cluster plane of a multi-node cluster; nil builds the
	// gRPC one (cluster.NewGRPC), which the node's cluster-plane server
	// then serves (Node.ClusterPlane).
	Network cluster.Network
	// FS is the file system of the WAL and snapshots (fault injection);
	// nil is the operating system's.
	FS wal.FS
	// Now is the clock of TTLs and flush ages; nil is time.Now. Raft
	// ticks keep real time.
	Now func() time.Time
	// ClusterTLS is this node's cluster-plane certificate and the cluster
	// CA for the gRPC cluster plane (mutual TLS between nodes); nil runs it
	// plaintext (a loopback development cluster).
	ClusterTLS *pki.Source
	// Logger receives every component's log, each with its component.
	Logger *slog.Logger
}

// Node is one storage node's storage: the Raft groups and their journals,
// the cluster side, the cold tier and the request engine.
type Node struct {
	cfg      Config
	host     *multiraft.Host
	machines []*stream.Machine
	// hotTally is the hot bytes of all the machines (stream.Machine.TallyHotIn).
	hotTally atomic.Int64
	grpc     *cluster.GRPC // the cluster plane Open built; nil otherwise
	logger   *slog.Logger
	// walRecovery is set when this run started after a crash.
	walRecovery bool

	// Cluster proposes to the groups, answers the cluster plane and is the
	// operator's view of the groups.
	Cluster *cluster.Cluster
	// Cold is the cold tier (with or without a store).
	Cold *cold.Tier
	// Engine serves the StreamService calls.
	Engine *Engine
}

// Open assembles a node's storage in dependency order: the state machines,
// the cluster plane, the WAL and Raft host (recovered from disk), the
// cluster side, the cold tier, and the request engine. It starts nothing;
// Run does.
func Open(cfg Config, deps Deps) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	logger := deps.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	if cfg.SnapshotDriveInterval < 0 {
		logger.Warn("storage.snapshot.drive_interval is 0s: nothing enforces raft.deleted_data_max_age, and deleted streams' records stay in snapshots and journal files until they are replaced in the normal course")
	}
	n := &Node{cfg: cfg, logger: logger, machines: make([]*stream.Machine, cfg.GroupCount)}
	for g := range n.machines {
		n.machines[g] = stream.NewMachine(uint32(g))
		n.machines[g].TallyHotIn(&n.hotTally)
	}
	ccfg := cluster.Config{NodeID: cfg.NodeID, ClusterID: cfg.ClusterID, DataDir: cfg.DataDir, Peers: cfg.Peers, MaxMessageBytes: cfg.MaxMessageBytes, TLS: deps.ClusterTLS}
	net := deps.Network
	if net == nil && ccfg.MultiNode() {
		g, err := cluster.NewGRPC(ccfg, logger)
		if err != nil {
			return nil, err
		}
		net, n.grpc = g, g
	}
	var tr multiraft.Transport
	if net != nil {
		tr = net
	}
	host, err := multiraft.New(multiraft.Config{
		DeferBootstrap:  ccfg.MultiNode(),
		Dir:             cfg.DataDir,
		NodeID:          cfg.NodeID,
		Voters:          ccfg.Voters(),
		GroupCount:      cfg.GroupCount,
		ShardCount:      cfg.ShardCount,
		Fsync:           cfg.Fsync,
		TickInterval:    cfg.TickInterval,
		SyncWindow:      cfg.SyncWindow,
		SnapshotEntries: cfg.SnapshotEntries,
		SnapshotBytes:   cfg.SnapshotBytes,
		SegmentBytes:    cfg.WAL.SegmentSize,
		// The bound and its driver (multiraft, deleted.go).
		DeletedDataMaxAge: cfg.DeletedDataMaxAge,
		DriveInterval:     cfg.SnapshotDriveInterval,
		Now:               now,
		FS:                deps.FS,
	}, func(g uint32) multiraft.StateMachine { return n.machines[g] }, tr, logger.With("component", "raft"))
	if err != nil {
		return nil, fmt.Errorf("open raft host: %w", err)
	}
	n.host = host
	fail := func(err error) (*Node, error) {
		_ = host.Close()
		return nil, err
	}
	if cfg.ClusterID != "" {
		if err := cluster.BindWAL(deps.FS, cfg.DataDir, cfg.ClusterID); err != nil {
			return fail(err)
		}
	}
	// A start that finds journals, no clean-shutdown record and no sign
	// that the crash spared the host (a running record of this boot) may
	// follow a power loss: under fsync "never" the unsynced tail of the
	// journals may be gone, and metrics report wal_recovery.
	n.walRecovery = host.TailMayBeLost()
	if n.walRecovery {
		logger.Warn("previous run did not shut down cleanly and the host may have crashed with it: recovered the journals as they were on disk", "fsync", cfg.Fsync)
	}
	if n.Cluster, err = cluster.New(ccfg, host, n.machines, net, now, logger.With("component", "cluster")); err != nil {
		return fail(err)
	}
	if n.Cold, err = cold.New(cfg.Cold, deps.ColdStore, n.Cluster, n.hotTally.Load, now, logger.With("component", "cold")); err != nil {
		return fail(err)
	}
	n.Engine = newRequestEngine(cfg, n.Cluster, n.Cold, now, logger.With("component", "engine"))
	return n, nil
}

// Run runs the node's storage until ctx ends or a part of it fails: the
// Raft host (shard workers, snapshot worker), the cluster side, the cold
// tier's flushes and the request engine's sweeps. The first part that
// fails stops the others, and Run returns its error. On a clean stop the
// parts above the host stop first, then the host flushes and syncs every
// journal, and the clean shutdown is recorded.
func (n *Node) Run(ctx context.Context) error {
	hostCtx, stopHost := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHost()
	partsCtx, stopParts := context.WithCancel(ctx)
	defer stopParts()

	var (
		mu       sync.Mutex
		firstErr error
	)
	failed := func(part string, err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", part, err)
		}
		mu.Unlock()
		stopParts()
	}
	hostDone := make(chan error, 1)
	go func() {
		err := n.host.Run(hostCtx)
		if err != nil {
			failed("raft host", err)
		} else if hostCtx.Err() == nil {
			failed("raft host", errors.New("stopped on its own"))
		}
		hostDone <- err
	}()
	var wg sync.WaitGroup
	for _, part := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"cluster", n.Cluster.Run},
		{"cold tier", n.Cold.Run},
		{"engine", n.Engine.Run},
	} {
		wg.Go(func() {
			if err := part.run(partsCtx); err != nil {
				failed(part.name, err)
			} else if partsCtx.Err() == nil {
				failed(part.name, errors.New("stopped on its own"))
			}
		})
	}
	wg.Wait()
	stopHost()
	hostErr := <-hostDone
	mu.Lock()
	err := firstErr
	mu.Unlock()
	if err == nil && ctx.Err() != nil && hostErr == nil {
		// Every journal was flushed, synced and closed as the host stopped.
		return n.host.RecordCleanShutdown()
	}
	return err
}

// WaitReady blocks until every group has a leader and every group this
// node leads has applied its whole log.
func (n *Node) WaitReady(ctx context.Context) error { return n.Cluster.WaitReady(ctx) }

// Config is the node's storage configuration.
func (n *Node) Config() Config { return n.cfg }

// WALRecovery reports whether this run started after an unclean shutdown.
func (n *Node) WALRecovery() bool { return n.walRecovery }

// ClusterPlane is the gRPC cluster plane Open built, for the node's
// cluster-plane server to serve; nil on a single node or with
// Deps.Network.
func (n *Node) ClusterPlane() *cluster.GRPC { return n.grpc }

// GroupView is one group as metrics show it.
type GroupView struct {
	Status   multiraft.GroupStatus
	Streams  int
	HotBytes int64
	// ColdBytes is the group's own stream bytes in the cold tier above
	// their retention (stream.Stats).
	ColdBytes int64
	GCPending uint64
}

// Groups describes every group on this node.
func (n *Node) Groups() []GroupView {
	out := make([]GroupView, len(n.machines))
	for g, m := range n.machines {
		st := m.Stats()
		out[g] = GroupView{Status: n.host.Status(uint32(g)), Streams: st.Streams, HotBytes: st.HotBytes, ColdBytes: st.ColdBytes, GCPending: m.GCPending("")}
	}
	return out
}

// The state machine reports what it removes, for the deleted-data bound.
var _ multiraft.Remover = (*stream.Machine)(nil)
