package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
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

// Config is the root configuration of every role. Every leaf of its TOML
// tree is one setting, with one dotted name used by the file, the flag
// (-raft.wal.fsync) and the environment variable (URSULA_RAFT_WAL_FSYNC);
// see settings.go.
type Config struct {
	// Target selects the roles: all, node, gateway, coldgc or backup.
	Target string `toml:"target"`
	// Engine configures storage: the WAL, the Raft groups and peers.
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
	// ColdGC configures the cold-GC and compaction worker (run by the all
	// and coldgc targets).
	ColdGC coldgc.Config `toml:"coldgc"`
	// Backup configures the scheduled backup service (run by the backup
	// target, and by the all target when backup.location is set); it
	// reaches the nodes named by [upstream].
	Backup backup.Config `toml:"backup"`
	// Storage configures the node's snapshots and its cold tier.
	Storage StorageConfig `toml:"storage"`
}

// StorageConfig is the [storage] section.
type StorageConfig struct {
	// Snapshot configures the Raft snapshots.
	Snapshot SnapshotConfig `toml:"snapshot"`
	// Cold configures the cold tier: where committed bytes go, and when
	// (the [cold] section of earlier releases).
	Cold ColdConfig `toml:"cold"`
}

// SnapshotBackendInline is the only snapshot backend: snapshots are kept
// inline, in the node's data directory.
const SnapshotBackendInline = "inline"

// SnapshotConfig is the [storage.snapshot] section. Snapshots are kept
// inline, in the node's data directory.
type SnapshotConfig struct {
	// Backend is where snapshots are kept: "inline" (the WAL directory) is
	// the only value; S3 snapshots are not supported.
	Backend string `toml:"backend"`
	// DriveInterval is how often the snapshot driver enforces
	// raft.deleted_data_max_age on each shard (at most an eighth of
	// raft.wal.segment_size of copies per shard each time); "0s" disables
	// it, and nothing enforces the bound then.
	DriveInterval time.Duration `toml:"drive_interval"`
}

// ColdConfig is the [storage.cold] section: the object store (backend,
// root, s3) and the cold tier's thresholds, side by side.
type ColdConfig struct {
	// Config is the object store; its Dir (fs) or S3.Prefix (s3) is set
	// from Root by Load.
	objstore.Config
	// Root is the cold tier's root: the directory of the fs backend
	// (default <raft.wal.path>/cold), the key prefix inside the bucket of
	// the s3 backend. Deprecated names: cold.dir, cold.s3.prefix.
	Root string `toml:"root"`
	TierConfig
}

// TierConfig is the cold tier's part of the [storage.cold] section.
type TierConfig = cold.Config

// RuntimeConfig configures the process's workers and memory.
type RuntimeConfig struct {
	// CoreCount is the number of shard workers (S); bound to the WAL. 0
	// means one per CPU.
	CoreCount int `toml:"core_count"`
	// ExternalPayloadMinSize stores an append of at least this many bytes
	// as a cold object of its own before it is proposed (0: never).
	// Deprecated name: cold.external_min_bytes.
	ExternalPayloadMinSize uint64 `toml:"external_payload_min_size"`
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
	Levels map[string]string `toml:"levels"`
}

// registerFlags registers every setting's flag on fs, named by its TOML
// key, writing defaults into c.
func (c *Config) registerFlags(fs *flag.FlagSet, target string) {
	fs.StringVar(&c.Target, "target", target, "roles to run: all, node, gateway, coldgc or backup")
	c.Engine.RegisterFlags(fs)
	fs.StringVar(&c.Storage.Snapshot.Backend, "storage.snapshot.backend", SnapshotBackendInline, `where snapshots are kept: "inline" (the WAL directory) is the only value`)
	fs.DurationVar(&c.Storage.Snapshot.DriveInterval, "storage.snapshot.drive_interval", engine.DefaultSnapshotDriveInterval,
		`how often the snapshot driver enforces raft.deleted_data_max_age; "0s" disables it`)
	fs.IntVar(&c.Runtime.CoreCount, "runtime.core_count", 0, "number of shard workers (bound to the WAL); 0: one per CPU")
	fs.Uint64Var(&c.Runtime.ExternalPayloadMinSize, "runtime.external_payload_min_size", cold.DefaultConfig().ExternalMinBytes,
		"store appends of at least this many bytes as cold objects of their own (0: never)")
	c.Runtime.Config.RegisterFlags(fs, "runtime.")
	nodeListen, clusterListen := "127.0.0.1:4447", "127.0.0.1:4439"
	if target == TargetNode {
		nodeListen, clusterListen = ":4437", ":4439"
	}
	c.Node.RegisterFlags(fs, nodeListen, clusterListen)
	c.Gateway.RegisterFlags(fs)
	c.Subscriptions.RegisterFlags(fs)
	c.Upstream.Config.RegisterFlags(fs)
	fs.BoolVar(&c.Upstream.InProcess, "upstream.in_process", true, "all-in-one: call the local node in-process instead of over loopback gRPC")
	sc := &c.Storage.Cold
	fs.StringVar(&sc.Backend, "storage.cold.backend", objstore.BackendFS, "cold store: fs (a local directory), s3 or memory (tests only)")
	fs.StringVar(&sc.Root, "storage.cold.root", "", "cold root: the fs backend's directory (default: <raft.wal.path>/cold), the s3 backend's key prefix")
	fs.StringVar(&sc.S3.Bucket, "storage.cold.s3.bucket", "", "s3 cold store: bucket")
	fs.StringVar(&sc.S3.Endpoint, "storage.cold.s3.endpoint", "", "s3 cold store: endpoint URL of an S3-compatible service (empty: AWS)")
	fs.StringVar(&sc.S3.Region, "storage.cold.s3.region", "", "s3 cold store: region (empty: the SDK's, else us-east-1)")
	fs.BoolVar(&sc.S3.PathStyle, "storage.cold.s3.path_style", false, "s3 cold store: path-style addressing")
	fs.StringVar(&sc.S3.AccessKey, "storage.cold.s3.access_key", "", "s3 cold store: static access key (empty: the SDK's credential chain)")
	fs.StringVar(&sc.S3.SecretKey, "storage.cold.s3.secret_key", "", "s3 cold store: static secret key, with access_key")
	fs.Int64Var(&sc.S3.MultipartThreshold, "storage.cold.s3.multipart_threshold", 0, "s3 cold store: upload bodies above this size in parts (0: 16 MiB)")
	fs.Int64Var(&sc.S3.PartSize, "storage.cold.s3.part_size", 0, "s3 cold store: size of each part of a multipart upload (0: 8 MiB)")
	sc.TierConfig.RegisterFlags(fs)
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
		errs = append(errs, c.Storage.Cold.Config.Validate(), c.ColdGC.Validate())
		if len(c.Upstream.Nodes) == 0 {
			errs = append(errs, errors.New("upstream.nodes (a storage node's client plane) is required for the coldgc target"))
		}
		errs = append(errs, c.Upstream.ClientPlane.Validate("upstream"))
		if c.Node.MetricsListen != "" {
			// The worker's only listener (GET /__ursula/prometheus and
			// /__ursula/ready); the rest of server.* is not used.
			if _, _, err := net.SplitHostPort(c.Node.MetricsListen); err != nil {
				errs = append(errs, fmt.Errorf("server.metrics_listen %q: %w", c.Node.MetricsListen, err))
			}
		}
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
		errs = append(errs, c.Engine.Validate(), c.Node.Validate(), c.Storage.Cold.Config.Validate())
		if b := c.Storage.Snapshot.Backend; b != SnapshotBackendInline {
			errs = append(errs, fmt.Errorf("storage.snapshot.backend %q: S3 snapshots are not supported; snapshots are kept inline, in raft.wal.path (want %q)", b, SnapshotBackendInline))
		}
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
// -config, then the URSULA_* environment variables, then the flags given
// on the command line. It returns flag.ErrHelp for -h and -help, and a nil
// Config with Flags.Version set for -version.
func Load(args []string, target string) (*Config, *Flags, error) {
	return load(args, os.Environ(), target)
}

func load(args, environ []string, target string) (*Config, *Flags, error) {
	pre := flag.NewFlagSet("ursula", flag.ContinueOnError)
	pre.SetOutput(io.Discard)
	var probe Config
	probe.registerFlags(pre, target)
	registerAliases(pre, nil)
	f := registerMeta(pre)
	if err := pre.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w (-h lists every setting)", err)
	}
	if pre.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected argument %q (settings are flags: -name value)", pre.Arg(0))
	}
	if f.Version {
		return nil, f, nil
	}

	var cfg Config
	fs := flag.NewFlagSet("ursula", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.registerFlags(fs, target)
	d := &deprecations{}
	registerAliases(fs, d)
	registerMeta(fs)
	if f.ConfigFile != "" {
		if err := decodeFile(f.ConfigFile, &cfg, d); err != nil {
			return nil, nil, err
		}
	}
	if err := applyEnv(fs, environ, d); err != nil {
		return nil, nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if err := resolveNodeID(&cfg.Engine, os.Hostname); err != nil {
		return nil, nil, err
	}
	f.Deprecated = d.used
	cfg.resolve()
	return &cfg, f, nil
}

// resolve fills the settings derived from others: the engine's copies of
// raft.wal.*, server.* and the cold tier, and the defaults that depend on
// other settings.
func (c *Config) resolve() {
	if c.Runtime.CoreCount == 0 {
		c.Runtime.CoreCount = runtime.NumCPU()
	}
	c.Engine.ShardCount = c.Runtime.CoreCount
	c.Engine.DataDir = c.Engine.WAL.Path
	c.Engine.Fsync = c.Engine.WAL.Fsync
	sc := &c.Storage.Cold
	if sc.Backend == objstore.BackendFS && sc.Root == "" {
		sc.Root = filepath.Join(c.Engine.WAL.Path, "cold")
	}
	sc.Dir, sc.S3.Prefix = "", ""
	switch sc.Backend {
	case objstore.BackendFS:
		sc.Dir = sc.Root
	case objstore.BackendS3:
		sc.S3.Prefix = sc.Root
	}
	sc.ExternalMinBytes = c.Runtime.ExternalPayloadMinSize
	c.Engine.Cold = sc.TierConfig
	c.Engine.MaxMessageBytes = c.Node.MaxMessageBytes
	c.Engine.ClusterID = c.Node.ClusterID
	c.Engine.SnapshotDriveInterval = c.Storage.Snapshot.DriveInterval
	if c.Engine.SnapshotDriveInterval == 0 {
		c.Engine.SnapshotDriveInterval = -1 // "0s": disabled
	}
}

// writeConfig prints cfg as TOML for -print-config: every setting, by its
// current name, empty lists and maps included (as [] and an empty table),
// so that the output names every key -h lists.
func writeConfig(w io.Writer, cfg *Config) error {
	c := *cfg
	fillEmpty(reflect.ValueOf(&c).Elem())
	return toml.NewEncoder(w).Encode(&c)
}

// fillEmpty replaces the nil slices and maps among the settings under v
// with empty ones (which share nothing with the original).
func fillEmpty(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() || f.Tag.Get("toml") == "-" {
			continue
		}
		switch fv.Kind() {
		case reflect.Struct:
			fillEmpty(fv)
		case reflect.Slice:
			if fv.IsNil() {
				fv.Set(reflect.MakeSlice(fv.Type(), 0, 0))
			}
		case reflect.Map:
			if fv.IsNil() {
				fv.Set(reflect.MakeMap(fv.Type()))
			}
		}
	}
}

// Flags are the command-line switches that are not configuration.
type Flags struct {
	ConfigFile   string
	PrintConfig  bool
	VerifyConfig bool
	// Version prints the build's version and exits.
	Version bool
	// Deprecated lists the deprecated names the configuration used, each
	// once, as "old -> new" pairs; Main logs a warning for each.
	Deprecated []Deprecation
}

// metaFlags are the flags that are not settings.
var metaFlags = []string{"config", "print-config", "verify-config", "version"}

func registerMeta(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.ConfigFile, "config", "", "TOML configuration file")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "print the effective configuration as TOML and exit")
	fs.BoolVar(&f.VerifyConfig, "verify-config", false, "validate the configuration and exit")
	fs.BoolVar(&f.Version, "version", false, "print the version, commit and Go version and exit")
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
