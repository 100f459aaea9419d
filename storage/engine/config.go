package engine

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/cold"
)

// Config configures the storage engine of one node.
type Config struct {
	// DataDir holds the WAL (DataDir/raft-log) and snapshots. Set from
	// raft.wal.path (WAL.Path) by the application.
	DataDir string `toml:"-"`
	// NodeID is this node's Raft id (non-zero).
	NodeID uint64 `toml:"node_id"`
	// NodeIDFromHostname, when true, derives NodeID from this host's name
	// "<name>-<n>" as n+1 (a Kubernetes StatefulSet's ordinal), overriding
	// node_id; a host name without such an ordinal refuses to start.
	NodeIDFromHostname bool `toml:"node_id_from_hostname"`
	// Peers are every voter of the cluster, this node included; empty
	// means a single-node cluster of NodeID. On the command line:
	// -raft.peers <id>/<cluster_url>/<client_url>,... (see ParsePeers).
	Peers []cluster.Peer `toml:"peers"`
	// ClusterID is recorded in the WAL at first start; a WAL holding
	// another id refuses to start. Set from server.cluster_id.
	ClusterID string `toml:"-"`
	// MaxMessageBytes bounds one cluster-plane message. Set from
	// server.max_message_bytes.
	MaxMessageBytes int `toml:"-"`
	// GroupCount is G, the number of Raft groups; bound to the WAL.
	GroupCount int `toml:"group_count"`
	// ShardCount is S, the number of shard workers; bound to the WAL. Set
	// from runtime.core_count.
	ShardCount int `toml:"-"`
	// Fsync is "never" (acknowledge from the page cache) or "always" (one
	// fsync per batch before acknowledging). Set from raft.wal.fsync
	// (WAL.Fsync) by the application.
	Fsync string `toml:"-"`
	// ReadChunkBytes bounds the bytes one read returns.
	ReadChunkBytes uint64 `toml:"read_chunk_bytes"`
	// SnapshotEntries takes a group snapshot after this many applied entries.
	SnapshotEntries uint64 `toml:"snapshot_entries"`
	// SnapshotBytes takes a group snapshot after this many bytes of entries.
	SnapshotBytes uint64 `toml:"snapshot_bytes"`
	// SyncWindow, under fsync "always", is the shortest interval between the
	// starts of two fsyncs of one shard (group commit under load; an idle
	// shard syncs at once).
	SyncWindow time.Duration `toml:"sync_window"`
	// TickInterval is the Raft tick.
	TickInterval time.Duration `toml:"tick_interval"`
	// ExpirySweepInterval is how often each group's leader removes the
	// streams that expired in its group (a minute by default; set it to a
	// quarter of the deleted-data bound when that is shorter). Expired
	// streams are also removed lazily when accessed.
	ExpirySweepInterval time.Duration `toml:"expiry_sweep_interval"`
	// DeletedDataMaxAge bounds how long a replica keeps the records of a
	// deleted, expired or purged stream in its snapshot, its Raft log and
	// the log's files after it applied the removal (multiraft, deleted.go).
	// The expiry sweep runs at least every quarter of it.
	DeletedDataMaxAge time.Duration `toml:"deleted_data_max_age"`
	// WAL configures the journals.
	WAL WALConfig `toml:"wal"`
	// SnapshotDriveInterval is how often the snapshot driver enforces
	// DeletedDataMaxAge on each shard; 0 means the default, negative
	// disables it (nothing enforces the bound then). Set from
	// storage.snapshot.drive_interval, where "0s" disables.
	SnapshotDriveInterval time.Duration `toml:"-"`
	// Cold configures the cold tier (set from the [storage.cold] section; the zero
	// value means cold.DefaultConfig).
	Cold cold.Config `toml:"-"`
}

// WALConfig is the [raft.wal] section.
type WALConfig struct {
	// Path is the directory of the WAL (<path>/raft-log) and the
	// snapshots; the application copies it to Config.DataDir.
	// Deprecated name: raft.data_dir.
	Path string `toml:"path"`
	// Fsync is "never" (acknowledge from the page cache) or "always" (one
	// fsync per batch before acknowledging); the application copies it to
	// Config.Fsync. Deprecated name: raft.fsync.
	Fsync string `toml:"fsync"`
	// SegmentSize is the journal segment size in bytes at which a shard's
	// journal rolls over to a new segment.
	SegmentSize int64 `toml:"segment_size"`
}

// Defaults of the deleted-data bound and its driver.
const (
	DefaultDeletedDataMaxAge     = time.Hour
	DefaultSnapshotDriveInterval = time.Second
)

// SweepInterval is the effective expiry sweep interval: the configured
// one, or a quarter of the deleted-data bound when that is shorter.
func (c *Config) SweepInterval() time.Duration {
	return min(c.ExpirySweepInterval, c.deletedDataMaxAge()/4)
}

func (c *Config) deletedDataMaxAge() time.Duration {
	if c.DeletedDataMaxAge == 0 {
		return DefaultDeletedDataMaxAge
	}
	return c.DeletedDataMaxAge
}

// RegisterFlags registers the engine's flags, named by their keys in the
// [raft] section, with defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.WAL.Path, "raft.wal.path", "./data", "directory of the WAL and the snapshots")
	fs.StringVar(&c.WAL.Fsync, "raft.wal.fsync", "never", `WAL fsync policy: "never" (acknowledge from the page cache) or "always"`)
	fs.Int64Var(&c.WAL.SegmentSize, "raft.wal.segment_size", 64<<20, "journal segment size in bytes")
	fs.Uint64Var(&c.NodeID, "raft.node_id", 1, "this node's Raft id")
	fs.BoolVar(&c.NodeIDFromHostname, "raft.node_id_from_hostname", false, `derive raft.node_id from the host name "<name>-<n>" as n+1 (a StatefulSet ordinal)`)
	fs.Func("raft.peers", "every voter of the cluster, this node included: comma-separated <id>/<cluster_url>/<client_url> (the [[raft.peers]] tables); empty: a single-node cluster", func(v string) error {
		peers, err := ParsePeers(v)
		if err != nil {
			return err
		}
		c.Peers = peers
		return nil
	})
	fs.IntVar(&c.GroupCount, "raft.group_count", 64, "number of Raft groups (bound to the WAL)")
	fs.Uint64Var(&c.ReadChunkBytes, "raft.read_chunk_bytes", 1<<20, "maximum bytes returned by one read")
	fs.Uint64Var(&c.SnapshotEntries, "raft.snapshot_entries", 1024, "snapshot a group after this many entries")
	fs.Uint64Var(&c.SnapshotBytes, "raft.snapshot_bytes", 512<<10, "snapshot a group after this many bytes of entries")
	fs.DurationVar(&c.SyncWindow, "raft.sync_window", 2*time.Millisecond, `minimum interval between the starts of two fsyncs of one shard under fsync "always"`)
	fs.DurationVar(&c.TickInterval, "raft.tick_interval", 100*time.Millisecond, "Raft tick interval")
	fs.DurationVar(&c.ExpirySweepInterval, "raft.expiry_sweep_interval", time.Minute, "interval of the TTL expiry sweep (each pass removes at most 16×257 expired streams per group); a quarter of raft.deleted_data_max_age when that is shorter")
	fs.DurationVar(&c.DeletedDataMaxAge, "raft.deleted_data_max_age", DefaultDeletedDataMaxAge, "bound on how long a replica keeps a removed stream's records in its snapshot, Raft log and log files")
}

// ParsePeers parses the -raft.peers syntax: comma-separated
// <id>/<cluster_url>/<client_url> entries (the addresses are host:port,
// which hold no "/"). An empty string is no peers.
func ParsePeers(v string) ([]cluster.Peer, error) {
	var peers []cluster.Peer
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		parts := strings.Split(e, "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("peer %q: want <id>/<cluster_url>/<client_url>", e)
		}
		id, err := strconv.ParseUint(parts[0], 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("peer %q: id %q is not a positive integer", e, parts[0])
		}
		peers = append(peers, cluster.Peer{ID: id, ClusterURL: parts[1], ClientURL: parts[2]})
	}
	return peers, nil
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("raft.wal.path is empty"))
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
	if len(c.Peers) > 0 {
		seen := map[uint64]bool{}
		self := false
		for _, p := range c.Peers {
			if p.ID == 0 || seen[p.ID] {
				errs = append(errs, fmt.Errorf("raft.peers: id %d is zero or repeated", p.ID))
			}
			seen[p.ID] = true
			self = self || p.ID == c.NodeID
			if p.ClusterURL == "" || p.ClientURL == "" {
				errs = append(errs, fmt.Errorf("raft.peers: peer %d needs cluster_url and client_url", p.ID))
			}
		}
		if !self {
			errs = append(errs, fmt.Errorf("raft.peers does not include this node (raft.node_id %d)", c.NodeID))
		}
	}
	if c.Fsync != "never" && c.Fsync != "always" {
		errs = append(errs, fmt.Errorf(`raft.wal.fsync %q: want "never" or "always"`, c.Fsync))
	}
	if c.ReadChunkBytes == 0 {
		errs = append(errs, errors.New("raft.read_chunk_bytes must be positive"))
	}
	if c.TickInterval <= 0 || c.ExpirySweepInterval <= 0 {
		errs = append(errs, errors.New("tick and sweep intervals must be positive"))
	}
	if c.DeletedDataMaxAge != 0 && c.DeletedDataMaxAge < 4*time.Second {
		errs = append(errs, fmt.Errorf("raft.deleted_data_max_age %v is below the minimum of 4s", c.DeletedDataMaxAge))
	}
	if n := c.WAL.SegmentSize; n != 0 && (n < 64<<10 || n > 4<<30) {
		errs = append(errs, fmt.Errorf("raft.wal.segment_size %d out of range [64 KiB, 4 GiB]", n))
	}
	if c.Cold != (cold.Config{}) {
		errs = append(errs, c.Cold.Validate())
	}
	return errors.Join(errs...)
}
