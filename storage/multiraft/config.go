package multiraft

import (
	"errors"
	"fmt"
	"time"

	"github.com/ursula/ursula/storage/wal"
)

// Fsync modes.
const (
	FsyncNever  = "never"
	FsyncAlways = "always"
)

// Config configures a Host.
type Config struct {
	// Dir is the data directory; the WAL goes under Dir/raft-log and the
	// snapshots under Dir/snapshots.
	Dir string `yaml:"dir"`
	// NodeID is this node's Raft id (non-zero).
	NodeID uint64 `yaml:"node_id"`
	// Voters is the initial voter set used when bootstrapping a group with no
	// state; empty means [NodeID].
	Voters []uint64 `yaml:"voters"`
	// GroupCount is G, the number of Raft groups.
	GroupCount int `yaml:"group_count"`
	// ShardCount is S, the number of shard workers; group g runs on shard
	// g mod S.
	ShardCount int `yaml:"shard_count"`
	// Fsync is "never" (default) or "always". Membership entries and
	// snapshots are always synced.
	Fsync string `yaml:"fsync"`
	// TickInterval is the Raft tick; default 100ms.
	TickInterval time.Duration `yaml:"tick_interval"`
	// ElectionTicks is the election timeout in ticks; default 10.
	ElectionTicks int `yaml:"election_ticks"`
	// HeartbeatTicks is the heartbeat interval in ticks; default 1.
	HeartbeatTicks int `yaml:"heartbeat_ticks"`
	// SnapshotEntries triggers a group snapshot after this many applied
	// entries since the last one; default 10000.
	SnapshotEntries uint64 `yaml:"snapshot_entries"`
	// SnapshotBytes triggers a group snapshot after this many bytes of
	// applied entries since the last one; default 64 MiB.
	SnapshotBytes uint64 `yaml:"snapshot_bytes"`
	// SegmentBytes is the WAL segment size; default 64 MiB.
	SegmentBytes int64 `yaml:"segment_bytes"`
	// MaxBatchBytes bounds a Raft message's entries and the committed
	// entries handed out per Ready; default 4 MiB.
	MaxBatchBytes uint64 `yaml:"max_batch_bytes"`
	// DeferBootstrap leaves groups without state uninitialized (refusing
	// every message) until Bootstrap or SetVoteFloor is called, so that a
	// node whose WAL was wiped never initializes a group that exists on its
	// peers.
	DeferBootstrap bool `yaml:"defer_bootstrap"`
	// SyncWindow, under fsync "always", is the shortest interval between
	// the starts of two fsyncs of one shard: a worker whose last fsync
	// started less than SyncWindow ago waits out the rest before its next
	// batch, so that under load many proposals share one fsync instead of
	// each paying for its own; after an fsync that took longer than the
	// window it does not wait at all. An idle shard syncs at once. Zero
	// disables the wait.
	SyncWindow time.Duration `yaml:"sync_window"`
	// MaxUncommittedBytes bounds a leader's uncommitted log; proposals
	// beyond it fail with ErrProposalDropped. Default 256 MiB.
	MaxUncommittedBytes uint64 `yaml:"max_uncommitted_bytes"`
	// MaxSegments is the number of WAL segments per shard above which groups
	// pinning the oldest one are snapshotted early; default 3.
	MaxSegments int `yaml:"max_segments"`
	// MaxReadWaiters bounds the readers of one group waiting for the next
	// read-index round; more fail with ErrTooManyReads. Default 1024.
	MaxReadWaiters int `yaml:"max_read_waiters"`
	// DeletedDataMaxAge bounds how long a replica keeps removed streams'
	// records in its snapshot files, its log and its journal's files after
	// it applied the removal (deleted.go); default 1 hour.
	DeletedDataMaxAge time.Duration `yaml:"deleted_data_max_age"`
	// DriveInterval is how often the snapshot driver enforces that bound
	// on each shard; default 1 s. Negative disables the driver: nothing
	// enforces the bound then.
	DriveInterval time.Duration `yaml:"drive_interval"`
	// Now is the clock of the deleted-data bound and of how long a leader
	// that stepped down waits for the log to settle its proposals
	// (orphanPatience); nil means time.Now.
	Now func() time.Time `yaml:"-"`
	// FS is the file system seam (fault injection, tests); nil means the
	// operating system's.
	FS wal.FS `yaml:"-"`
}

// ErrInvalidConfig reports a configuration that cannot be used.
var ErrInvalidConfig = errors.New("multiraft: invalid config")

func (c *Config) setDefaults() {
	if c.Fsync == "" {
		c.Fsync = FsyncNever
	}
	if len(c.Voters) == 0 && c.NodeID != 0 {
		c.Voters = []uint64{c.NodeID}
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 1
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10000
	}
	if c.SnapshotBytes == 0 {
		c.SnapshotBytes = 64 << 20
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = wal.DefaultSegmentBytes
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 4 << 20
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = 256 << 20
	}
	if c.MaxSegments <= 0 {
		c.MaxSegments = 3
	}
	if c.MaxReadWaiters <= 0 {
		c.MaxReadWaiters = 1024
	}
	if c.DeletedDataMaxAge <= 0 {
		c.DeletedDataMaxAge = time.Hour
	}
	if c.DriveInterval == 0 {
		c.DriveInterval = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.FS == nil {
		c.FS = wal.OSFS{}
	}
}

// Validate reports the first problem of a configuration (after defaults).
func (c *Config) Validate() error {
	switch {
	case c.Dir == "":
		return fmt.Errorf("%w: dir is empty", ErrInvalidConfig)
	case c.NodeID == 0:
		return fmt.Errorf("%w: node_id must be non-zero", ErrInvalidConfig)
	case c.GroupCount <= 0 || c.GroupCount > 1<<20:
		return fmt.Errorf("%w: group_count %d out of range [1, %d]", ErrInvalidConfig, c.GroupCount, 1<<20)
	case c.ShardCount <= 0 || c.ShardCount > 4096:
		return fmt.Errorf("%w: shard_count %d out of range [1, 4096]", ErrInvalidConfig, c.ShardCount)
	case c.Fsync != FsyncNever && c.Fsync != FsyncAlways:
		return fmt.Errorf("%w: fsync %q, want %q or %q", ErrInvalidConfig, c.Fsync, FsyncNever, FsyncAlways)
	case c.ElectionTicks <= c.HeartbeatTicks:
		return fmt.Errorf("%w: election_ticks %d must exceed heartbeat_ticks %d", ErrInvalidConfig, c.ElectionTicks, c.HeartbeatTicks)
	}
	for _, v := range c.Voters {
		if v == 0 {
			return fmt.Errorf("%w: voter id 0", ErrInvalidConfig)
		}
	}
	return nil
}
