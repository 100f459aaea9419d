package engine

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"time"
)

// Config configures the storage engine of one node.
type Config struct {
	// DataDir holds the WAL (DataDir/raft-log) and snapshots.
	DataDir string `toml:"data_dir"`
	// NodeID is this node's Raft id (non-zero).
	NodeID uint64 `toml:"node_id"`
	// GroupCount is G, the number of Raft groups; bound to the WAL.
	GroupCount int `toml:"group_count"`
	// ShardCount is S, the number of shard workers; bound to the WAL.
	ShardCount int `toml:"core_count"`
	// Fsync is "never" (acknowledge from the page cache) or "always" (one
	// fsync per batch before acknowledging).
	Fsync string `toml:"fsync"`
	// ReadChunkBytes bounds the bytes one read returns.
	ReadChunkBytes uint64 `toml:"read_chunk_bytes"`
	// SnapshotEntries takes a group snapshot after this many applied entries.
	SnapshotEntries uint64 `toml:"snapshot_entries"`
	// SnapshotBytes takes a group snapshot after this many bytes of entries.
	SnapshotBytes uint64 `toml:"snapshot_bytes"`
	// SyncWindow, under fsync "always", is the shortest interval between two
	// fsyncs of one shard (group commit under load; an idle shard syncs at
	// once).
	SyncWindow time.Duration `toml:"sync_window"`
	// TickInterval is the Raft tick.
	TickInterval time.Duration `toml:"tick_interval"`
	// ExpirySweepInterval is how often a leader looks for expired streams.
	ExpirySweepInterval time.Duration `toml:"expiry_sweep_interval"`
}

// RegisterFlags registers the engine's flags with defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", "./data", "directory for the WAL and snapshots")
	fs.Uint64Var(&c.NodeID, "raft.node-id", 1, "this node's Raft id")
	fs.IntVar(&c.GroupCount, "raft.group-count", 64, "number of Raft groups (bound to the WAL)")
	fs.IntVar(&c.ShardCount, "runtime.core-count", runtime.NumCPU(), "number of shard workers (bound to the WAL)")
	fs.StringVar(&c.Fsync, "raft.fsync", "never", `WAL fsync policy: "never" or "always"`)
	fs.Uint64Var(&c.ReadChunkBytes, "read-chunk-bytes", 1<<20, "maximum bytes returned by one read")
	fs.Uint64Var(&c.SnapshotEntries, "raft.snapshot-entries", 1024, "snapshot a group after this many entries")
	fs.Uint64Var(&c.SnapshotBytes, "raft.snapshot-bytes", 512<<10, "snapshot a group after this many bytes of entries")
	fs.DurationVar(&c.SyncWindow, "raft.sync-window", 2*time.Millisecond, `minimum interval between fsyncs of one shard under fsync "always"`)
	fs.DurationVar(&c.TickInterval, "raft.tick-interval", 100*time.Millisecond, "Raft tick interval")
	fs.DurationVar(&c.ExpirySweepInterval, "expiry-sweep-interval", time.Second, "interval of the TTL expiry sweep")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir is empty"))
	}
	if c.NodeID == 0 {
		errs = append(errs, errors.New("raft.node_id must be non-zero"))
	}
	if c.GroupCount < 1 || c.GroupCount > 1<<16 {
		errs = append(errs, fmt.Errorf("raft.group_count %d out of range [1, 65536]", c.GroupCount))
	}
	if c.ShardCount < 1 || c.ShardCount > 1024 {
		errs = append(errs, fmt.Errorf("runtime.core_count %d out of range [1, 1024]", c.ShardCount))
	}
	if c.Fsync != "never" && c.Fsync != "always" {
		errs = append(errs, fmt.Errorf(`raft.fsync %q: want "never" or "always"`, c.Fsync))
	}
	if c.ReadChunkBytes == 0 {
		errs = append(errs, errors.New("read_chunk_bytes must be positive"))
	}
	if c.TickInterval <= 0 || c.ExpirySweepInterval <= 0 {
		errs = append(errs, errors.New("tick and sweep intervals must be positive"))
	}
	return errors.Join(errs...)
}
