package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Defaults for Config.
const (
	DefaultInterval     = time.Second
	DefaultIdleInterval = 10 * time.Second
	DefaultTimeout      = 2 * time.Second
	DefaultHistory      = 600
	DefaultMaxViewers   = 16
	// maxDocumentBytes bounds one metrics or readiness document read from
	// a node.
	maxDocumentBytes = 8 << 20
)

// Config configures a Page. It has no flags of its own: the component that
// serves the page decides whether it does (gateway.status_page) and fills
// the rest in code; zero fields take the defaults.
type Config struct {
	// Interval is how often the nodes are read while somebody watches the
	// page (and the length of one chart sample).
	Interval time.Duration
	// IdleInterval is how often they are read while nobody watches, so
	// that a page opened later still has a history.
	IdleInterval time.Duration
	// Timeout bounds one read of one node; a node that does not answer
	// within it is shown unreachable.
	Timeout time.Duration
	// History is how many samples the charts keep (600: ten minutes at
	// one a second).
	History int
	// MaxViewers bounds the live connections (/__ursula/ui/events) served
	// at once; more are answered 503 with Retry-After.
	MaxViewers int
	// Source names what serves the page, shown in its header ("gateway",
	// "node 2").
	Source string
}

func (c *Config) applyDefaults() {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.IdleInterval <= 0 {
		c.IdleInterval = DefaultIdleInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.History <= 0 {
		c.History = DefaultHistory
	}
	if c.MaxViewers <= 0 {
		c.MaxViewers = DefaultMaxViewers
	}
}

// Target is one node the page reads.
type Target interface {
	// Observe reads the node once; it returns within ctx's deadline.
	Observe(ctx context.Context) Observation
}

// HTTPTarget reads a node's /__ursula/metrics and /__ursula/ready over
// HTTP (its client plane, where both answer without credentials).
type HTTPTarget struct {
	// Address is the node's address as configured (host:port), shown on
	// the page.
	Address string
	// NodeID is the node's configured id (0: unknown), shown while it
	// does not answer.
	NodeID uint64
	// BaseURL is "http://host:port" or "https://host:port".
	BaseURL string
	// Client makes the requests (TLS configured by the caller).
	Client *http.Client
}

// Observe implements Target.
func (t HTTPTarget) Observe(ctx context.Context) Observation {
	o := Observation{Address: t.Address, NodeID: t.NodeID}
	body, _, err := t.get(ctx, "/__ursula/metrics")
	if err != nil {
		o.Err = err
		return o
	}
	if o.Metrics, err = DecodeMetrics(body); err != nil {
		o.Err = err
		return o
	}
	// /__ursula/ready answers 503 with its reasons when not ready.
	if body, _, err = t.get(ctx, "/__ursula/ready"); err == nil {
		var r Readiness
		if json.Unmarshal(body, &r) == nil {
			o.Ready = &r
		}
	}
	return o
}

func (t HTTPTarget) get(ctx context.Context, path string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.BaseURL+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		return nil, 0, unwrapURLError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, resp.StatusCode, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return body, resp.StatusCode, nil
}

// unwrapURLError drops the method and URL that *url.Error repeats.
func unwrapURLError(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && strings.HasPrefix(err.Error(), "Get ") {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// FuncTarget reads a node through a function: the node that serves the
// page reads itself without a network hop.
type FuncTarget func(ctx context.Context) Observation

// Observe implements Target.
func (f FuncTarget) Observe(ctx context.Context) Observation { return f(ctx) }

// Targets lists the nodes to read; it is called before every read, so the
// list may change (a gateway learns the cluster's nodes as it runs).
type Targets func() []Target

// Fixed lists the same nodes at every read.
func Fixed(ts ...Target) Targets { return func() []Target { return ts } }

// Page reads the nodes, keeps the cluster view and its history, and serves
// the status page (ServeHTTP). Run does the reading.
type Page struct {
	cfg     Config
	targets Targets
	logger  *slog.Logger
	now     func() time.Time

	// viewers is a semaphore of live connections.
	viewers chan struct{}
	// watched wakes Run when the first viewer arrives.
	watched chan struct{}

	mu       sync.Mutex
	latest   Snapshot
	version  uint64
	changed  chan struct{} // closed and replaced at every publish
	history  *ring
	prev     map[uint64]counters
	known    map[string]uint64
	lastSeen map[uint64]int64
	// reachable is each address's state at the last read, to log changes.
	reachable map[string]bool
}

// New validates cfg and returns a page over targets; it reads nothing
// until Run.
func New(cfg Config, targets Targets, logger *slog.Logger) (*Page, error) {
	if targets == nil {
		return nil, errors.New("statuspage: no nodes to read")
	}
	cfg.applyDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Page{
		cfg: cfg, targets: targets, logger: logger, now: time.Now,
		viewers: make(chan struct{}, cfg.MaxViewers), watched: make(chan struct{}, 1),
		changed: make(chan struct{}), history: newRing(cfg.History),
		prev: map[uint64]counters{}, known: map[string]uint64{}, lastSeen: map[uint64]int64{},
	}
	p.latest = Snapshot{Source: cfg.Source, Nodes: []NodeView{}, Groups: []GroupView{}, GroupsWithoutLeader: []uint32{}}
	return p, nil
}

// Run reads every node once per Interval while somebody watches the page,
// once per IdleInterval otherwise, until ctx ends.
func (p *Page) Run(ctx context.Context) error {
	for {
		p.Refresh(ctx)
		wait := p.cfg.IdleInterval
		if len(p.viewers) > 0 {
			wait = p.cfg.Interval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-p.watched:
			t.Stop()
		case <-t.C:
		}
	}
}

// Refresh reads every node once, in parallel, and publishes the view.
func (p *Page) Refresh(ctx context.Context) {
	targets := p.targets()
	obs := make([]Observation, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			tctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			defer cancel()
			obs[i] = t.Observe(tctx)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	p.publish(obs)
}

// publish aggregates one round of observations and wakes the viewers.
func (p *Page) publish(obs []Observation) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	snap := aggregate(obs, now, p.known, p.lastSeen)
	snap.Source = p.cfg.Source
	cur := map[uint64]counters{}
	for _, o := range obs {
		if o.Err == nil && o.Metrics != nil {
			cur[o.Metrics.NodeID] = countersOf(o.Metrics, snap.At)
		}
	}
	if s, ok := rates(cur, p.prev, snap.At); ok {
		p.history.add(s)
		snap.Sample = &s
	}
	// Remember only the nodes read now (a gateway's list changes), and
	// say when one stops or starts answering.
	seen := make(map[string]bool, len(obs))
	for _, o := range obs {
		seen[o.Address] = true
	}
	for addr := range p.known {
		if !seen[addr] {
			delete(p.known, addr)
		}
	}
	ids := make(map[uint64]bool, len(p.known))
	for _, id := range p.known {
		ids[id] = true
	}
	for id := range p.lastSeen {
		if !ids[id] {
			delete(p.lastSeen, id)
		}
	}
	for _, n := range snap.Nodes {
		if was, ok := p.reachable[n.Address]; ok && was != n.Reachable {
			p.logger.Info("status page: node reachability changed", "node_id", n.ID, "addr", n.Address, "reachable", n.Reachable, "err", n.Error)
		}
	}
	p.reachable = make(map[string]bool, len(snap.Nodes))
	for _, n := range snap.Nodes {
		p.reachable[n.Address] = n.Reachable
	}
	p.latest = snap
	p.version++
	close(p.changed)
	p.changed = make(chan struct{})
}

// current returns the newest view, its version and a channel closed at the
// next publish; with history it carries every sample kept.
func (p *Page) current(history bool) (Snapshot, uint64, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.latest
	if history {
		s.History = p.history.all()
	}
	return s, p.version, p.changed
}
