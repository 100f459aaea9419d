package app

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/gateway/subscription"
	"github.com/ursula/ursula/gateway/upstream"
	"github.com/ursula/ursula/services/backup"
	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/services/node"
	"github.com/ursula/ursula/services/platform/memlimit"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/objstore"
)

// Targets a process can run.
const (
	TargetAll     = "all"
	TargetNode    = "node"
	TargetGateway = "gateway"
	TargetColdGC  = "coldgc"
	TargetBackup  = "backup"
)

// Config is the root configuration of every role.
type Config struct {
	// Target selects the roles: all, node or gateway.
	Target string `toml:"target"`
	// Engine configures storage: data directory, Raft groups, WAL.
	Engine engine.Config `toml:"raft"`
	// Node configures the storage node's listeners.
	Node node.Config `toml:"server"`
	// Runtime configures the process's workers.
	Runtime RuntimeConfig `toml:"runtime"`
	// Gateway configures the HTTP gateway.
	Gateway gateway.Config `toml:"gateway"`
	// Upstream is how a gateway reaches storage nodes.
	Upstream UpstreamConfig `toml:"upstream"`
	// Subscriptions configures the reserved subscription APIs.
	Subscriptions subscription.Config `toml:"subscriptions"`
	// Log configures logging.
	Log LogConfig `toml:"log"`
	// Telemetry configures traces and metrics export (the exporters
	// themselves by the standard OTEL_* environment variables).
	Telemetry telemetry.Config `toml:"telemetry"`
	// Cold configures the cold tier: where committed bytes go, and when.
	Cold ColdConfig `toml:"cold"`
	// ColdGC configures the cold-GC and compaction worker (run by the all
	// and coldgc targets).
	ColdGC coldgc.Config `toml:"coldgc"`
	// Backup configures the scheduled backup service (run by the backup
	// target, and by the all target when backup.location is set); it
	// reaches the nodes named by [upstream].
	Backup backup.Config `toml:"backup"`
	// Storage configures the node's snapshots.
	Storage StorageConfig `toml:"storage"`
}

// StorageConfig is the [storage] section.
type StorageConfig struct {
	Snapshot SnapshotConfig `toml:"snapshot"`
}

// SnapshotConfig is the [storage.snapshot] section. Snapshots are kept
// inline, in the node's data directory.
type SnapshotConfig struct {
	// DriveInterval is how often the snapshot driver enforces
	// raft.deleted_data_max_age on each shard (at most an eighth of
	// raft.wal.segment_size of copies per shard each time); "0s" disables
	// it, and nothing enforces the bound then.
	DriveInterval time.Duration `toml:"drive_interval"`
}

// ColdConfig is the [cold] section: the object store (backend, dir, s3)
// and the cold tier's thresholds, side by side.
type ColdConfig struct {
	objstore.Config
	TierConfig
}

// TierConfig is the cold tier's part of the [cold] section.
type TierConfig = cold.Config

// RuntimeConfig configures the process's workers and memory.
type RuntimeConfig struct {
	// CoreCount is the number of shard workers (S); bound to the WAL.
	CoreCount int `toml:"core_count"`
	// Config bounds the Go heap's growth between collections
	// (gc_headroom; see services/platform/memlimit).
	memlimit.Config
}

// UpstreamConfig tells a gateway where the nodes are. Nodes empty in the
// all-in-one target means this process's node.
type UpstreamConfig struct {
	upstream.Config
	// InProcess, in the all-in-one target, has the gateway call this
	// process's node directly instead of over loopback gRPC (same client
	// interface, same service code, no HTTP/2 hop).
	InProcess bool `toml:"in_process"`
}

// LogConfig configures slog.
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `toml:"level"`
	// Format is text or json.
	Format string `toml:"format"`
	// Levels overrides Level per component: the value of the logger's
	// "component" attribute (engine, raft, cluster, transport, cold, node,
	// gateway, upstream, subscriptions, coldgc, backup, memlimit, telemetry) to a
	// level, for example
	// levels = { engine = "debug", gateway = "warn" }. A key may be a package
	// path ("storage/engine"); its last element names the component. On the
	// command line: -log.levels engine=debug,gateway=warn.
	Levels map[string]string `toml:"levels,omitempty"`
}

// registerFlags registers every flag on fs, writing defaults into c.
func (c *Config) registerFlags(fs *flag.FlagSet, target string) {
	fs.StringVar(&c.Target, "target", target, "roles to run: all, node, gateway, coldgc or backup")
	c.Engine.RegisterFlags(fs)
	fs.DurationVar(&c.Storage.Snapshot.DriveInterval, "storage.snapshot.drive-interval", engine.DefaultSnapshotDriveInterval,
		`how often the snapshot driver enforces raft.deleted_data_max_age; "0s" disables it`)
	fs.IntVar(&c.Runtime.CoreCount, "runtime.core-count", runtime.NumCPU(), "number of shard workers (bound to the WAL)")
	c.Runtime.Config.RegisterFlags(fs, "runtime.")
	nodeListen, clusterListen := "127.0.0.1:4447", "127.0.0.1:4439"
	if target == TargetNode {
		nodeListen, clusterListen = ":4437", ":4439"
	}
	c.Node.RegisterFlags(fs, nodeListen, clusterListen)
	c.Gateway.RegisterFlags(fs)
	c.Subscriptions.RegisterFlags(fs)
	c.Upstream.Config.RegisterFlags(fs)
	fs.BoolVar(&c.Upstream.InProcess, "upstream.in-process", true, "all-in-one: call the local node in-process instead of over loopback gRPC")
	fs.StringVar(&c.Cold.Backend, "cold.backend", objstore.BackendFS, "cold store: fs (a local directory), s3 or memory (tests only)")
	fs.StringVar(&c.Cold.Dir, "cold.dir", "", "fs cold store directory (default: <data-dir>/cold)")
	fs.StringVar(&c.Cold.S3.Bucket, "cold.s3.bucket", "", "s3 cold store: bucket")
	fs.StringVar(&c.Cold.S3.Prefix, "cold.s3.prefix", "", "s3 cold store: key prefix (the cold root)")
	fs.StringVar(&c.Cold.S3.Endpoint, "cold.s3.endpoint", "", "s3 cold store: endpoint URL of an S3-compatible service")
	fs.StringVar(&c.Cold.S3.Region, "cold.s3.region", "", "s3 cold store: region")
	fs.BoolVar(&c.Cold.S3.PathStyle, "cold.s3.path-style", false, "s3 cold store: path-style addressing")
	c.Cold.TierConfig.RegisterFlags(fs)
	c.ColdGC.RegisterFlags(fs)
	c.Backup.RegisterFlags(fs)
	fs.StringVar(&c.Log.Level, "log.level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.Log.Format, "log.format", "text", "log format: text or json")
	fs.Func("log.levels", "per-component log levels, e.g. engine=debug,gateway=warn (components: engine, raft, cluster, transport, cold, node, gateway, upstream, subscriptions, coldgc, backup, memlimit, telemetry)", func(v string) error {
		m, err := telemetry.ParseLevelList(v)
		if err != nil {
			return err
		}
		c.Log.Levels = m
		return nil
	})
	c.Telemetry.RegisterFlags(fs)
}

// Validate checks the parts of the configuration the target uses.
func (c *Config) Validate() error {
	var errs []error
	switch c.Target {
	case TargetAll, TargetNode, TargetGateway:
	case TargetColdGC:
		errs = append(errs, c.Cold.Config.Validate(), c.ColdGC.Validate())
		if len(c.Upstream.Nodes) == 0 {
			errs = append(errs, errors.New("upstream.nodes (a storage node's client plane) is required for the coldgc target"))
		}
		errs = append(errs, c.Upstream.ClientPlane.Validate("upstream"))
		errs = append(errs, c.Runtime.Config.Validate())
		errs = append(errs, c.Log.validate())
		return errors.Join(errs...)
	case TargetBackup:
		errs = append(errs, c.Backup.Validate())
		if c.Backup.Location == "" {
			errs = append(errs, errors.New("backup.location is required for the backup target"))
		}
		if len(c.Upstream.Nodes) == 0 {
			errs = append(errs, errors.New("upstream.nodes (the storage nodes' client planes) is required for the backup target"))
		}
		errs = append(errs, c.Upstream.ClientPlane.Validate("upstream"))
		errs = append(errs, c.Runtime.Config.Validate())
		errs = append(errs, c.Log.validate())
		return errors.Join(errs...)
	default:
		errs = append(errs, fmt.Errorf("target %q: want all, node, gateway, coldgc or backup", c.Target))
	}
	if c.Target == TargetAll {
		errs = append(errs, c.ColdGC.Validate())
		if c.Backup.Location != "" {
			errs = append(errs, c.Backup.Validate())
		}
	}
	if c.Target != TargetGateway {
		errs = append(errs, c.Engine.Validate(), c.Node.Validate(), c.Cold.Config.Validate())
		if c.Storage.Snapshot.DriveInterval < 0 {
			errs = append(errs, fmt.Errorf("storage.snapshot.drive_interval %v must not be negative", c.Storage.Snapshot.DriveInterval))
		}
		var urls []string
		for _, p := range c.Engine.Peers {
			if p.ID != c.Engine.NodeID {
				urls = append(urls, p.ClusterURL)
			}
		}
		if len(c.Engine.Peers) > 1 {
			errs = append(errs, c.Node.ValidateClusterPlane(urls))
		}
	}
	if c.Target != TargetNode {
		errs = append(errs, c.Gateway.Validate(), c.Subscriptions.Validate())
		// The gateway reads its bodies under the process's budget, which
		// must hold at least the largest one.
		maxBody := c.Gateway.MaxBodyBytes
		if maxBody == 0 {
			maxBody = gateway.DefaultMaxBodyBytes
		}
		if n := c.Node.InflightBodySize(); n < maxBody {
			errs = append(errs, fmt.Errorf("%w: server.http_inflight_body_size %d is below gateway.max_body_bytes %d",
				node.ErrInflightBodyBudgetTooSmall, n, maxBody))
		}
		if c.Target == TargetGateway && len(c.Upstream.Nodes) == 0 {
			errs = append(errs, errors.New("upstream.nodes is required for the gateway target"))
		}
	}
	errs = append(errs, c.Runtime.Config.Validate())
	errs = append(errs, c.Log.validate())
	return errors.Join(errs...)
}

// Load builds the configuration: defaults, then the TOML file named by
// -config, then the flags given on the command line.
func Load(args []string, target string) (*Config, *Flags, error) {
	pre := flag.NewFlagSet("ursula", flag.ContinueOnError)
	pre.SetOutput(new(strings.Builder))
	var probe Config
	probe.registerFlags(pre, target)
	f := registerMeta(pre)
	if err := pre.Parse(args); err != nil {
		return nil, nil, err
	}

	var cfg Config
	fs := flag.NewFlagSet("ursula", flag.ContinueOnError)
	cfg.registerFlags(fs, target)
	registerMeta(fs)
	if f.ConfigFile != "" {
		raw, err := os.ReadFile(f.ConfigFile)
		if err != nil {
			return nil, nil, fmt.Errorf("read config: %w", err)
		}
		md, err := toml.Decode(string(raw), &cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("parse config %s: %w", f.ConfigFile, err)
		}
		if undec := md.Undecoded(); len(undec) > 0 {
			return nil, nil, fmt.Errorf("config %s: unknown keys %v", f.ConfigFile, undec)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if err := resolveNodeID(&cfg.Engine, os.Hostname); err != nil {
		return nil, nil, err
	}
	cfg.Engine.ShardCount = cfg.Runtime.CoreCount
	if cfg.Cold.Backend == objstore.BackendFS && cfg.Cold.Dir == "" {
		cfg.Cold.Dir = filepath.Join(cfg.Engine.DataDir, "cold")
	}
	cfg.Engine.Cold = cfg.Cold.TierConfig
	cfg.Engine.MaxMessageBytes = cfg.Node.MaxMessageBytes
	cfg.Engine.ClusterID = cfg.Node.ClusterID
	cfg.Engine.SnapshotDriveInterval = cfg.Storage.Snapshot.DriveInterval
	if cfg.Engine.SnapshotDriveInterval == 0 {
		cfg.Engine.SnapshotDriveInterval = -1 // "0s": disabled
	}
	return &cfg, f, nil
}

// Flags are the command-line switches that are not configuration.
type Flags struct {
	ConfigFile   string
	PrintConfig  bool
	VerifyConfig bool
}

func registerMeta(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.ConfigFile, "config", "", "TOML configuration file")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "print the effective configuration as TOML and exit")
	fs.BoolVar(&f.VerifyConfig, "verify-config", false, "validate the configuration and exit")
	return f
}

// validate checks the levels.
func (c LogConfig) validate() error {
	_, err := parseLevel(c.Level)
	_, lerr := telemetry.ParseLevels(c.Levels)
	return errors.Join(err, lerr)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("log.level %q: %w", s, err)
	}
	return l, nil
}
