package cold

import (
	"errors"
	"flag"
	"time"
)

// Config sets when hot bytes move to the cold store and how much
// memory they may take meanwhile.
type Config struct {
	// FlushBytes flushes a stream once it holds this many hot bytes.
	FlushBytes uint64 `toml:"flush_bytes"`
	// FlushAge flushes a stream whose oldest hot byte is this old: each
	// stream's hot window at a point drawn in the last quarter of it, so
	// that streams written together do not flush together (agedOut).
	FlushAge time.Duration `toml:"flush_age"`
	// GroupFlushBytes flushes a group's largest streams while the group
	// holds more hot bytes than this.
	GroupFlushBytes uint64 `toml:"group_flush_bytes"`
	// HotCapBytes is the most hot bytes a group holds: above it, writes
	// answer 503 with Retry-After until flushes catch up.
	HotCapBytes uint64 `toml:"hot_cap_bytes"`
	// NodeHotCapBytes is the most hot bytes the node holds, all groups
	// together: above it, a write waits up to AdmitWait for flushes to
	// catch up, then answers 503 with Retry-After. Above half of it, every
	// group flushes its largest streams down to its share of that half.
	// It is what bounds the node's memory when the cold store cannot keep
	// up (a million streams written rarely make one object per append);
	// the group caps alone allow GroupCount times HotCapBytes.
	NodeHotCapBytes uint64 `toml:"node_hot_cap_bytes"`
	// AdmitWait is how long a write waits for room under NodeHotCapBytes
	// before it is refused.
	AdmitWait time.Duration `toml:"admit_wait"`
	// ExternalMinBytes stores an append of at least this many bytes as an
	// object of its own before it is proposed (0: never). Set from
	// runtime.external_payload_min_size by the application.
	ExternalMinBytes uint64 `toml:"-"`
	// MaxChunkBytes bounds the bytes of one chunk object.
	MaxChunkBytes uint64 `toml:"max_chunk_bytes"`
	// CacheBytes bounds the block cache of cold reads.
	CacheBytes uint64 `toml:"cache_bytes"`
	// BlockBytes is the block size of the cache (one ranged GET). Reads
	// are verified per checksum block (coldfmt.ChecksumBlockBytes, 64
	// KiB): a multiple of it (the default is) fetches nothing extra; a
	// smaller or unaligned block makes each fill fetch the checksum blocks
	// it touches.
	BlockBytes uint64 `toml:"block_bytes"`
	// FlushInterval is how often a leader looks for streams to flush.
	FlushInterval time.Duration `toml:"flush_interval"`
	// FlushConcurrency bounds the uploads a node runs at once. A node
	// with many streams written rarely uploads one small object per
	// stream and flush age: with few uploads at once, the round trip of
	// each (an fsync or an S3 PUT, then the ColdFlush proposal) and not
	// the store's throughput bounds the flush rate, and the hot window
	// grows past its age.
	FlushConcurrency int `toml:"flush_concurrency"`
	// FlushInflightBytes bounds the hot bytes the running uploads encode
	// together, so that many concurrent uploads of large streams do not
	// each hold a chunk of MaxChunkBytes.
	FlushInflightBytes uint64 `toml:"flush_inflight_bytes"`
	// GCGrace delays the deletion of objects retention or compaction
	// retired, so reads planned before still complete.
	GCGrace time.Duration `toml:"gc_grace"`
}

// DefaultConfig is the cold tier's default configuration.
func DefaultConfig() Config {
	return Config{
		FlushBytes:         1 << 20,
		FlushAge:           5 * time.Second,
		GroupFlushBytes:    8 << 20,
		HotCapBytes:        64 << 20,
		NodeHotCapBytes:    128 << 20,
		AdmitWait:          2 * time.Second,
		ExternalMinBytes:   1 << 20,
		MaxChunkBytes:      4 << 20,
		CacheBytes:         64 << 20,
		BlockBytes:         256 << 10,
		FlushInterval:      100 * time.Millisecond,
		FlushConcurrency:   32,
		FlushInflightBytes: 32 << 20,
		GCGrace:            5 * time.Minute,
	}
}

// RegisterFlags registers the cold tier's flags, named by their keys in
// the [storage.cold] section, with defaults (ExternalMinBytes is
// runtime.external_payload_min_size, registered by the application).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := DefaultConfig()
	fs.Uint64Var(&c.FlushBytes, "storage.cold.flush_bytes", d.FlushBytes, "flush a stream once it holds this many hot bytes")
	fs.DurationVar(&c.FlushAge, "storage.cold.flush_age", d.FlushAge, "flush a stream whose oldest hot byte is this old (each at a point drawn in the last quarter of it, so that streams written together do not flush together)")
	fs.Uint64Var(&c.GroupFlushBytes, "storage.cold.group_flush_bytes", d.GroupFlushBytes, "flush a group's largest streams while it holds more hot bytes than this")
	fs.Uint64Var(&c.HotCapBytes, "storage.cold.hot_cap_bytes", d.HotCapBytes, "hot bytes per group above which writes answer 503")
	fs.Uint64Var(&c.NodeHotCapBytes, "storage.cold.node_hot_cap_bytes", d.NodeHotCapBytes, "hot bytes per node above which writes wait for flushes (up to storage.cold.admit_wait), then answer 503; above half of it every group flushes its largest streams")
	fs.DurationVar(&c.AdmitWait, "storage.cold.admit_wait", d.AdmitWait, "how long a write waits for room under storage.cold.node_hot_cap_bytes before it answers 503")
	fs.Uint64Var(&c.MaxChunkBytes, "storage.cold.max_chunk_bytes", d.MaxChunkBytes, "largest chunk object")
	fs.Uint64Var(&c.CacheBytes, "storage.cold.cache_bytes", d.CacheBytes, "block cache of cold reads")
	fs.Uint64Var(&c.BlockBytes, "storage.cold.block_bytes", d.BlockBytes, "block size of the cold read cache")
	fs.DurationVar(&c.FlushInterval, "storage.cold.flush_interval", d.FlushInterval, "how often a leader looks for streams to flush")
	fs.IntVar(&c.FlushConcurrency, "storage.cold.flush_concurrency", d.FlushConcurrency, "uploads a node runs at once")
	fs.Uint64Var(&c.FlushInflightBytes, "storage.cold.flush_inflight_bytes", d.FlushInflightBytes, "hot bytes the running uploads encode together")
	fs.DurationVar(&c.GCGrace, "storage.cold.gc_grace", d.GCGrace, "delay before retired cold objects are deleted")
}

// Validate checks the cold tier's settings.
func (c *Config) Validate() error {
	var errs []error
	if c.FlushBytes == 0 || c.MaxChunkBytes == 0 || c.HotCapBytes == 0 || c.GroupFlushBytes == 0 || c.NodeHotCapBytes == 0 {
		errs = append(errs, errors.New("storage.cold: flush_bytes, group_flush_bytes, hot_cap_bytes, node_hot_cap_bytes and max_chunk_bytes must be positive"))
	}
	if c.AdmitWait < 0 {
		errs = append(errs, errors.New("storage.cold: admit_wait must not be negative"))
	}
	if c.GroupFlushBytes > c.HotCapBytes {
		errs = append(errs, errors.New("storage.cold: group_flush_bytes must not exceed hot_cap_bytes"))
	}
	if c.FlushAge <= 0 || c.FlushInterval <= 0 {
		errs = append(errs, errors.New("storage.cold: flush_age and flush_interval must be positive"))
	}
	if c.CacheBytes == 0 || c.BlockBytes == 0 || c.BlockBytes > c.CacheBytes {
		errs = append(errs, errors.New("storage.cold: cache_bytes and block_bytes must be positive, block_bytes at most cache_bytes"))
	}
	if c.FlushConcurrency < 1 || c.FlushInflightBytes == 0 {
		errs = append(errs, errors.New("storage.cold: flush_concurrency and flush_inflight_bytes must be at least 1"))
	}
	if c.GCGrace < 0 {
		errs = append(errs, errors.New("storage.cold: gc_grace must not be negative"))
	}
	return errors.Join(errs...)
}
