package memlimit

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// DefaultHeadroom is Config.Headroom's default.
const DefaultHeadroom = 48 << 20

// pollInterval is how often Run looks for a finished collection.
const pollInterval = 100 * time.Millisecond

// Config configures the limit.
type Config struct {
	// Headroom is how many bytes the heap may grow past the live heap
	// between collections once the live heap is larger than that; 0 leaves
	// the collector to GOGC alone.
	Headroom int64 `toml:"gc_headroom"`
	// AbortCap is the emergency stop: once the process holds more memory
	// than this (the Go runtime's memory not returned to the system), it
	// exits at once, without a graceful leadership handoff or a clean
	// shutdown record, as an OOM kill would, but with a log line saying
	// why. 0: never. It is not admission control: nothing answers 503
	// because of it.
	AbortCap int64 `toml:"node_memory_abort_cap_size"`
}

// RegisterFlags registers the flag with the given prefix ("runtime.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Int64Var(&c.Headroom, prefix+"gc_headroom", DefaultHeadroom,
		"bytes the Go heap may grow past its live part between collections once the live part is larger (0: GOGC alone)")
	fs.Int64Var(&c.AbortCap, prefix+"node_memory_abort_cap_size", 0,
		"emergency stop: bytes of memory past which the process exits at once, like an OOM kill, without handing off leadership (0: never); keep it below the container's limit, above normal use")
}

// Validate reports an invalid field.
func (c *Config) Validate() error {
	if c.Headroom < 0 {
		return fmt.Errorf("runtime.gc_headroom %d must not be negative", c.Headroom)
	}
	if c.AbortCap < 0 {
		return fmt.Errorf("runtime.node_memory_abort_cap_size %d must not be negative", c.AbortCap)
	}
	return nil
}

// Limiter keeps the soft memory limit.
type Limiter struct {
	cfg    Config
	logger *slog.Logger
	// abort ends the process when its memory passes cfg.AbortCap (a test
	// replaces it).
	abort func()
}

// New validates cfg; it starts nothing.
func New(cfg Config, logger *slog.Logger) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Limiter{cfg: cfg, logger: logger, abort: exitLikeAbort}, nil
}

// exitLikeAbort ends the process at once with the status of abort():
// no deferred function runs, so no clean shutdown is recorded and the
// next start recovers as after a crash.
func exitLikeAbort() { os.Exit(134) }

// Run keeps the limit up to date until ctx ends, then lifts it; it ends
// the process when its memory passes the abort cap.
func (l *Limiter) Run(ctx context.Context) error {
	limits := l.cfg.Headroom != 0 && os.Getenv("GOMEMLIMIT") == ""
	if !limits && l.cfg.AbortCap == 0 {
		<-ctx.Done()
		return nil
	}
	if limits {
		defer debug.SetMemoryLimit(math.MaxInt64)
	}
	samples := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/scan/heap:bytes"},
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	var cycles uint64
	var set int64 = math.MaxInt64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		metrics.Read(samples)
		u := func(i int) int64 { return int64(samples[i].Value.Uint64()) }
		if l.overCap(u(2) - u(3)) {
			return nil // only where abort was replaced
		}
		if !limits {
			continue
		}
		if c := samples[0].Value.Uint64(); c == cycles {
			continue
		} else {
			cycles = c
		}
		live := u(1)
		// What the runtime holds besides the heap proper (its objects,
		// the unused room in its spans, its free and released pages):
		// stacks, metadata and the like. The heap, fragmentation
		// included, gets live plus headroom.
		other := u(2) - u(3) - u(4) - u(5) - u(6)
		limit := Limit(live, u(7), other, l.cfg.Headroom)
		if limit != set {
			debug.SetMemoryLimit(limit)
			set = limit
		}
	}
}

// overCap reports whether used bytes pass the abort cap, and if so logs
// it and aborts.
func (l *Limiter) overCap(used int64) bool {
	if l.cfg.AbortCap == 0 || used <= l.cfg.AbortCap {
		return false
	}
	l.logger.Error("memory past runtime.node_memory_abort_cap_size: aborting without a graceful shutdown",
		"used_bytes", used, "cap_bytes", l.cfg.AbortCap)
	l.abort()
	return true
}

// scanShare is the part of the scannable heap the heap may always grow by
// between collections (1/scanShare of it): a collection costs in
// proportion to the bytes it scans (pointer-free buffers it only marks), so
// tying the growth to them bounds the collector's work per allocated byte,
// at scanShare times what GOGC=100 would cost on a heap of pointers alone.
// A fixed headroom does not: a node holding a million idle streams has a
// live heap of about a gigabyte of small pointerful objects, and a 48 MiB
// headroom made it collect, and scan all of them, about once a second
// under load (the collector took ~45 % of the CPU). 4 rather than 2 keeps
// such a node within 1.5 GiB of RSS (1.7 GiB with 2, after a million
// streams were created and appended to once).
const scanShare = 4

// scanRoomMax bounds the growth GOGC=100 would allow on the scannable heap
// alone (as much as it holds), which the heap may always have: between
// the fixed headroom and a quarter of the scannable heap lies a range
// (about 50k to 1M idle streams) where the quarter is below the fixed
// headroom, and the fixed headroom, less the fragmentation of the spans
// and the runtime's own 3 % margin, left about 28 MiB of room on a 170 MiB
// heap of 100k streams: a collection every 0.4 s under 500 writers, ~45 %
// of the CPU. Room as large as the scannable heap took that node from
// 5,306 and 6,037 to 6,191 and 6,840 appends/s (258 and 227 to 206 and
// 184 µs of CPU per append, alternating runs) for ~95 MiB more peak RSS.
// Past scanRoomMax the quarter takes over,
// so a node of a million streams (~800 MiB scannable) gains 56 MiB of
// room, not 800.
const scanRoomMax = 256 << 20

// Limit is the soft memory limit for a live heap of live bytes, of which
// scan are scannable, and other bytes of runtime memory: none
// (math.MaxInt64) while the live heap is within the headroom, else other +
// live + the largest of headroom, scan/scanShare, and scan up to
// scanRoomMax.
func Limit(live, scan, other, headroom int64) int64 {
	if live <= headroom || other < 0 {
		return math.MaxInt64
	}
	return other + live + max(headroom, scan/scanShare, min(scan, scanRoomMax))
}
