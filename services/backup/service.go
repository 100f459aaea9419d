package backup

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/storage/objstore"
)

// Defaults of Config.
const (
	DefaultInterval = 24 * time.Hour
	DefaultListen   = "127.0.0.1:4436"
)

// readyTimeout bounds the checks of one readiness request.
const readyTimeout = 5 * time.Second

// Config is the [backup] section: the scheduled backup service
// (ursula-backup, and the all-in-one binary when Location is set). The
// nodes and the credentials it calls them with are the [upstream]
// section's nodes, tls and token_file, as for the cold-GC worker.
type Config struct {
	// Location is where backups go: s3://bucket/prefix or a directory
	// (see OpenLocation). Empty: no backup service.
	Location string `toml:"location"`
	// ColdStore names the source cluster's cold store (s3://bucket/prefix
	// or a directory); empty means the one the nodes report.
	ColdStore string `toml:"cold_store"`
	// Interval runs a backup this long after the previous one started
	// (or the location's newest backup, at start).
	Interval time.Duration `toml:"interval"`
	// Cron, when set, replaces Interval: a cron expression (five fields,
	// or @daily, @every 6h; UTC unless prefixed with CRON_TZ=<zone>).
	Cron string `toml:"cron"`
	// KeepLast and KeepWithin prune after each successful backup: the
	// KeepLast newest backups and those younger than KeepWithin stay
	// (and always the newest). Both zero: nothing is pruned.
	KeepLast   int           `toml:"keep_last"`
	KeepWithin time.Duration `toml:"keep_within"`
	// HoldTTL is how long a group's hold on the cold GC lasts unrenewed.
	HoldTTL time.Duration `toml:"hold_ttl"`
	// Concurrency bounds the groups and the objects copied at once.
	Concurrency int `toml:"concurrency"`
	// Listen is the loopback address of GET /__ursula/ready and
	// /__ursula/metrics (and /__ursula/prometheus); empty: none.
	Listen string `toml:"listen"`
}

// RegisterFlags registers the flags of the section with "backup."
// prefixes and their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Location, "backup.location", "", "backup location: s3://bucket/prefix or a directory (empty: no backup service)")
	fs.StringVar(&c.ColdStore, "backup.cold_store", "", "the source cluster's cold store (s3://bucket/prefix or a directory; default: the one the nodes report)")
	fs.DurationVar(&c.Interval, "backup.interval", DefaultInterval, "time between two backups (counted from the newest one at start)")
	fs.StringVar(&c.Cron, "backup.cron", "", "cron schedule instead of -backup.interval (5 fields or @daily, @every 6h; UTC unless CRON_TZ=zone)")
	fs.IntVar(&c.KeepLast, "backup.keep_last", 0, "retention: keep the newest N backups (0 and keep_within 0: prune nothing)")
	fs.DurationVar(&c.KeepWithin, "backup.keep_within", 0, "retention: keep backups younger than this")
	fs.DurationVar(&c.HoldTTL, "backup.hold_ttl", DefaultHoldTTL, "how long a group's cold-GC hold lasts unrenewed (renewed every third of it)")
	fs.IntVar(&c.Concurrency, "backup.concurrency", DefaultConcurrency, "groups exported, and objects copied, at once")
	fs.StringVar(&c.Listen, "backup.listen", DefaultListen, "loopback address of /__ursula/ready and /__ursula/metrics (empty: none)")
}

// Schedule is the configured schedule.
func (c *Config) Schedule() (Schedule, error) {
	if c.Cron != "" {
		return ParseSchedule(0, c.Cron)
	}
	return ParseSchedule(c.Interval, "")
}

// Retention is the configured retention (zero: no pruning).
func (c *Config) Retention() Retention {
	return Retention{KeepLast: c.KeepLast, KeepWithin: c.KeepWithin}
}

// Validate reports every problem of the section; a Location is required
// by the caller that runs the service, not here.
func (c *Config) Validate() error {
	var errs []error
	if _, err := c.Schedule(); err != nil {
		errs = append(errs, err)
	}
	if r := c.Retention(); !r.IsZero() {
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.HoldTTL < time.Minute {
		errs = append(errs, fmt.Errorf("backup: hold_ttl %v is below a minute", c.HoldTTL))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("backup: concurrency %d must be at least 1", c.Concurrency))
	}
	if c.Listen != "" {
		if err := checkLoopback(c.Listen); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("backup: listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("backup: listen %q is not a loopback address", addr)
	}
	return nil
}

// Service runs scheduled backups and prunes, and answers readiness and
// metrics.
type Service struct {
	cfg      Config
	sched    Schedule
	nodes    []backupv1.BackupServiceClient
	prom     http.Handler
	log      *slog.Logger
	now      func() time.Time
	after    func(d time.Duration) (<-chan time.Time, func() bool)
	metrics  metrics
	location *Location // set once Run opened it
	locMu    sync.Mutex
}

// New validates cfg and returns the service; it starts nothing. nodes are
// clients of the cluster's nodes; prometheus, when set, is served at
// GET /__ursula/prometheus.
func New(cfg Config, nodes []backupv1.BackupServiceClient, prometheus http.Handler, logger *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Location == "" {
		return nil, errors.New("backup: location is required")
	}
	if len(nodes) == 0 {
		return nil, errors.New("backup: no nodes")
	}
	sched, err := cfg.Schedule()
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg: cfg, sched: sched, nodes: nodes, prom: prometheus, log: logger, now: time.Now,
		after: func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		},
	}, nil
}

func (s *Service) loc() *Location {
	s.locMu.Lock()
	defer s.locMu.Unlock()
	return s.location
}

// Run serves the HTTP listener and runs backups on the schedule until ctx
// ends; an in-flight backup is then cancelled (its lock and holds
// released, no manifest written). A failed backup is logged, counted and
// tried again at the next time the schedule names; only a listener that
// cannot be bound or a location that cannot be opened fails Run.
func (s *Service) Run(ctx context.Context) error {
	var (
		srv     *http.Server
		serving sync.WaitGroup
	)
	if s.cfg.Listen != "" {
		ln, err := net.Listen("tcp", s.cfg.Listen)
		if err != nil {
			return fmt.Errorf("backup: listen: %w", err)
		}
		srv = httpserver.Config{}.Server(s.Handler(), slog.NewLogLogger(s.log.Handler(), slog.LevelWarn))
		serving.Go(func() {
			if err := srv.Serve(httpserver.LimitConnections(ln, httpserver.SidePlaneMaxConnections, nil)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("backup listener stopped", "err", err)
			}
		})
		s.log.Info("backup service listening", "listen", ln.Addr().String())
	}
	defer func() {
		if srv != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = srv.Shutdown(sctx)
			cancel()
			serving.Wait()
		}
	}()
	loc, err := OpenLocation(ctx, s.cfg.Location)
	if err != nil {
		return err
	}
	var src *Location
	if s.cfg.ColdStore != "" {
		if src, err = OpenLocation(ctx, s.cfg.ColdStore); err != nil {
			return err
		}
	}
	s.locMu.Lock()
	s.location = loc
	s.locMu.Unlock()
	return s.loop(ctx, loc, src)
}

// loop runs backups when the schedule says until ctx ends.
func (s *Service) loop(ctx context.Context, loc *Location, src *Location) error {
	var last time.Time
	if all, err := List(ctx, loc); err != nil {
		s.log.Warn("cannot list the location's backups: the first backup runs now", "location", loc.String(), "err", err)
	} else if len(all) > 0 {
		last = all[len(all)-1].CreatedAt
		s.metrics.mu.Lock()
		s.metrics.lastSuccess = all[len(all)-1].CompletedAt
		s.metrics.mu.Unlock()
	}
	next := s.sched.First(s.now(), last)
	s.log.Info("backup service started", "location", loc.String(), "schedule", s.sched.String(),
		"next_run", next.UTC().Format(time.RFC3339), "nodes", len(s.nodes))
	for {
		s.metrics.mu.Lock()
		s.metrics.nextRun = next
		s.metrics.mu.Unlock()
		if d := next.Sub(s.now()); d > 0 {
			tick, stop := s.after(d)
			select {
			case <-ctx.Done():
				stop()
				return nil
			case <-tick:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		started := s.now()
		s.runOnce(ctx, loc, src)
		if ctx.Err() != nil {
			return nil
		}
		next = s.sched.Next(started)
		if now := s.now(); next.Before(now) {
			next = s.sched.Next(now)
		}
	}
}

// runOnce makes one backup and, after a success, prunes.
func (s *Service) runOnce(ctx context.Context, loc *Location, src *Location) {
	m := &s.metrics
	m.inProgress.Add(1)
	started := s.now()
	man, err := Create(ctx, s.nodes, loc, CreateOptions{
		HoldTTL: s.cfg.HoldTTL, Concurrency: s.cfg.Concurrency, Logger: s.log, Now: s.now, SourceColdStore: src,
	})
	m.inProgress.Add(-1)
	dur := s.now().Sub(started)
	if err != nil {
		if ctx.Err() != nil {
			s.log.Info("backup cancelled", "err", err)
			return
		}
		m.failures.Add(1)
		m.mu.Lock()
		m.lastFailure, m.lastError = s.now(), err.Error()
		m.mu.Unlock()
		s.log.Error("backup failed: trying again at the next scheduled time", "err", err, "duration", dur.String())
		return
	}
	m.backups.Add(1)
	m.mu.Lock()
	m.lastSuccess, m.lastDur, m.last, m.lastError = man.CompletedAt, dur, man.Totals, ""
	m.mu.Unlock()
	r := s.cfg.Retention()
	if r.IsZero() {
		return
	}
	removed, err := prune(ctx, loc, r, s.now(), s.log)
	if err != nil {
		if ctx.Err() == nil {
			m.pruneFailures.Add(1)
			s.log.Error("prune failed: trying again after the next backup", "err", err)
		}
		return
	}
	m.prunes.Add(1)
	m.pruned.Add(uint64(len(removed)))
}

// Handler serves GET /__ursula/ready, /__ursula/metrics and, when the
// process exports it, /__ursula/prometheus.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /__ursula/ready", s.serveReady)
	mux.HandleFunc("GET /__ursula/metrics", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.metrics.snapshot())
	})
	if s.prom != nil {
		mux.Handle("GET /__ursula/prometheus", s.prom)
	}
	return mux
}

// Readiness reasons.
const (
	ReasonStarting            = "starting"
	ReasonLocationUnreachable = "location_unreachable"
	ReasonNodesUnreachable    = "nodes_unreachable"
	ReasonClusterMismatch     = "cluster_mismatch"
)

// nodeState is one node in the readiness document.
type nodeState struct {
	Node      int    `json:"node"`
	OK        bool   `json:"ok"`
	NodeID    uint64 `json:"node_id,omitempty"`
	ClusterID string `json:"cluster_id,omitempty"`
	Err       string `json:"err,omitempty"`
}

// serveReady answers 200 once the location and at least one node answer
// (and the nodes that answer agree on their cluster), 503 with the reason
// otherwise. A node down alone keeps the service ready: a backup needs
// every group exported, not every node.
func (s *Service) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	doc := map[string]any{"ready": false}
	loc := s.loc()
	if loc == nil {
		doc["reason"] = ReasonStarting
		writeJSON(w, http.StatusServiceUnavailable, doc)
		return
	}
	doc["location"] = loc.String()
	states := make([]nodeState, len(s.nodes))
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Go(func() {
			st := nodeState{Node: i}
			info, err := n.GetBackupInfo(ctx, &backupv1.GetBackupInfoRequest{})
			if err != nil {
				st.Err = err.Error()
			} else {
				st.OK, st.NodeID, st.ClusterID = true, info.GetNodeId(), info.GetClusterId()
			}
			states[i] = st
		})
	}
	_, lerr := loc.store.Head(ctx, lockKey)
	wg.Wait()
	doc["nodes"] = states
	reason, detail := "", ""
	if lerr != nil && !errors.Is(lerr, objstore.ErrNotFound) {
		reason, detail = ReasonLocationUnreachable, lerr.Error()
	}
	answered, cluster := 0, ""
	for _, st := range states {
		if !st.OK {
			continue
		}
		if answered > 0 && st.ClusterID != cluster && reason == "" {
			reason, detail = ReasonClusterMismatch, fmt.Sprintf("nodes of clusters %q and %q", cluster, st.ClusterID)
		}
		answered++
		cluster = st.ClusterID
	}
	if answered == 0 && reason == "" {
		reason, detail = ReasonNodesUnreachable, "no node answered GetBackupInfo"
	}
	code := http.StatusOK
	if reason != "" {
		code = http.StatusServiceUnavailable
		doc["reason"], doc["detail"] = reason, detail
	} else {
		doc["ready"] = true
		doc["cluster_id"] = cluster
	}
	writeJSON(w, code, doc)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
