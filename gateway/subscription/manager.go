package subscription

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
)

const (
	jsonContentType = "application/json"
	// zeroOffset is the lowest offset a stream issues; links to streams
	// that do not exist yet start there.
	zeroOffset = "0000000000000000_0000000000000000"
	// beforeFirstOffset is the protocol's "start of stream" sentinel; it is
	// never a valid ack.
	beforeFirstOffset = "-1"
	// maxQueuedEvents bounds observer events waiting to be processed.
	maxQueuedEvents = 1 << 16
	// loadRetryDelay spaces attempts to replay the state stream.
	loadRetryDelay = time.Second
)

type eventKind int

const (
	eventWrite eventKind = iota
	eventCreate
	eventDelete
)

// streamEvent is one observer notification waiting to be processed.
type streamEvent struct {
	kind eventKind
	path string
}

type jobKind int

const (
	jobDeliver jobKind = iota // POST the current wake of a webhook subscription
	jobExpire                 // end an expired lease
	jobCheck                  // start a wake if work is pending
)

type job struct {
	kind jobKind
	sub  *subscription
}

// Manager serves the reserved subscription API and delivers wakes. See the
// package documentation.
type Manager struct {
	cfg        Config
	client     streamv1.StreamServiceClient
	logger     *slog.Logger
	signer     *signer
	store      *stateStore
	httpClient *http.Client
	transport  *http.Transport
	policy     *addressPolicy     // which webhook destinations may be dialled
	budget     *httpserver.Budget // request bodies are charged against it
	now        func() time.Time
	prefix     string // StreamRoot + "__ds/"

	loadMu sync.Mutex
	loaded atomic.Bool

	adminMu sync.Mutex // serialises subscription create and delete
	mu      sync.Mutex // guards subs
	subs    map[string]*subscription

	eventsMu    sync.Mutex
	events      []streamEvent
	queuedWrite map[string]bool
	known       map[string]struct{} // streams seen through the hooks
	eventSignal chan struct{}

	kick chan struct{}
	jobs chan job

	closeOnce sync.Once
	closed    chan struct{}
}

// New validates cfg and builds a Manager. It loads or creates the signing
// key but starts nothing; call Run.
func New(cfg Config, client streamv1.StreamServiceClient, logger *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("subscription: nil stream client")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	sg, err := newSigner(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("subscription: %w", err)
	}
	policy, err := newAddressPolicy(cfg.AllowPrivateWebhooks, cfg.AllowWebhookHosts)
	if err != nil {
		return nil, fmt.Errorf("subscription: %w", err)
	}
	dialer := &webhookDialer{
		dialer: net.Dialer{Timeout: cfg.DeliveryTimeout, KeepAlive: 30 * time.Second},
		policy: policy,
	}
	budget := cfg.BodyBudget
	if budget == nil {
		budget = httpserver.NewBudget(0)
	}
	transport := &http.Transport{
		Proxy:                 nil, // a proxy would bypass the address checks
		DialContext:           dialer.DialContext,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       60 * time.Second,
		TLSHandshakeTimeout:   cfg.DeliveryTimeout,
		ResponseHeaderTimeout: cfg.DeliveryTimeout,
		ForceAttemptHTTP2:     true,
	}
	m := &Manager{
		cfg:    cfg,
		client: client,
		logger: logger,
		signer: sg,
		store: &stateStore{client: client, ref: &streamv1.StreamRef{
			Bucket: cfg.StateBucket, Stream: cfg.StateStream,
		}},
		transport: transport,
		policy:    policy,
		budget:    budget,
		httpClient: &http.Client{
			Transport: transport,
			Timeout:   cfg.DeliveryTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		now:         time.Now,
		prefix:      cfg.StreamRoot + "__ds/",
		subs:        make(map[string]*subscription),
		queuedWrite: make(map[string]bool),
		known:       make(map[string]struct{}),
		eventSignal: make(chan struct{}, 1),
		kick:        make(chan struct{}, 1),
		jobs:        make(chan job, 1024),
		closed:      make(chan struct{}),
	}
	return m, nil
}

// Close stops Run and releases idle webhook connections. It is idempotent
// and does not wait for Run to return.
func (m *Manager) Close() {
	m.closeOnce.Do(func() {
		close(m.closed)
		m.transport.CloseIdleConnections()
	})
}

// Run replays the persisted state, then runs the observer-event processor,
// the retry and lease scheduler and the delivery workers until ctx ends or
// Close is called, then returns nil.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.closed:
			cancel()
		case <-ctx.Done():
		}
	}()

	for {
		err := m.ensureLoaded(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		m.logger.Warn("subscription state load failed", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(loadRetryDelay):
		}
	}

	var wg sync.WaitGroup
	for range m.cfg.DeliveryWorkers {
		wg.Go(func() { m.worker(ctx) })
	}
	wg.Go(func() { m.processEvents(ctx) })
	wg.Go(func() { m.schedule(ctx) })

	// Wakes are not persisted: look for pending work left from before a
	// restart.
	for _, s := range m.allSubs() {
		select {
		case m.jobs <- job{kind: jobCheck, sub: s}:
		case <-ctx.Done():
		}
	}

	<-ctx.Done()
	wg.Wait()
	m.transport.CloseIdleConnections()
	return nil
}

// ensureLoaded replays the state stream once; later calls return at once.
func (m *Manager) ensureLoaded(ctx context.Context) error {
	if m.loaded.Load() {
		return nil
	}
	m.loadMu.Lock()
	defer m.loadMu.Unlock()
	if m.loaded.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*m.cfg.StorageTimeout)
	defer cancel()
	subs := make(map[string]*subscription)
	n, err := m.store.replay(ctx, func(rec record) { applyRecord(subs, rec) })
	if err != nil {
		return fmt.Errorf("load subscriptions: %w", err)
	}
	loaded := len(subs) // the map is shared once published
	m.mu.Lock()
	m.subs = subs
	m.mu.Unlock()
	m.loaded.Store(true)
	m.logger.Info("subscriptions loaded", "records", n, "subscriptions", loaded)
	return nil
}

// applyRecord folds one persisted record into subs.
func applyRecord(subs map[string]*subscription, rec record) {
	switch rec.Op {
	case opCreate:
		if rec.Def == nil {
			return
		}
		s := newSubscription(*rec.Def)
		for _, l := range rec.Links {
			s.setLink(l)
		}
		subs[rec.ID] = s
	case opLinks:
		if s := subs[rec.ID]; s != nil {
			for _, l := range rec.Links {
				s.setLink(l)
			}
		}
	case opDelete:
		delete(subs, rec.ID)
	}
}

func (m *Manager) getSub(id string) *subscription {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.subs[id]
}

func (m *Manager) allSubs() []*subscription {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*subscription, 0, len(m.subs))
	for _, s := range m.subs {
		out = append(out, s)
	}
	return out
}

// StreamWritten notes an append to the family-1 stream at streamPath
// (relative to the stream root). It never blocks on I/O.
func (m *Manager) StreamWritten(_ context.Context, streamPath string) {
	m.enqueue(eventWrite, streamPath)
}

// StreamCreated notes the creation of the stream at streamPath.
func (m *Manager) StreamCreated(_ context.Context, streamPath string) {
	m.enqueue(eventCreate, streamPath)
}

// StreamDeleted notes the deletion of the stream at streamPath.
func (m *Manager) StreamDeleted(_ context.Context, streamPath string) {
	m.enqueue(eventDelete, streamPath)
}

func (m *Manager) enqueue(kind eventKind, streamPath string) {
	p := normalizePath(streamPath)
	if p == "" || p == "__ds" || strings.HasPrefix(p, "__ds/") {
		return
	}
	m.eventsMu.Lock()
	switch {
	case kind != eventDelete && m.queuedWrite[p]:
		// coalesced with a write already waiting
	case len(m.events) >= maxQueuedEvents:
		m.logger.Warn("subscription event queue full, dropping event", "stream", p)
	default:
		if kind == eventDelete {
			delete(m.queuedWrite, p)
		} else {
			m.queuedWrite[p] = true
		}
		m.events = append(m.events, streamEvent{kind: kind, path: p})
	}
	m.eventsMu.Unlock()
	select {
	case m.eventSignal <- struct{}{}:
	default:
	}
}

// processEvents applies observer events in order.
func (m *Manager) processEvents(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.eventSignal:
		}
		m.eventsMu.Lock()
		batch := m.events
		m.events = nil
		clear(m.queuedWrite)
		m.eventsMu.Unlock()
		for _, ev := range batch {
			if ctx.Err() != nil {
				return
			}
			m.handleEvent(ctx, ev)
		}
	}
}

func (m *Manager) track(path string, present bool) {
	m.eventsMu.Lock()
	defer m.eventsMu.Unlock()
	if !present {
		delete(m.known, path)
		return
	}
	if _, ok := m.known[path]; ok || m.cfg.MaxTrackedStreams == 0 {
		return
	}
	if len(m.known) >= m.cfg.MaxTrackedStreams {
		for k := range m.known {
			delete(m.known, k)
			break
		}
	}
	m.known[path] = struct{}{}
}

func (m *Manager) knownStreams() []string {
	m.eventsMu.Lock()
	defer m.eventsMu.Unlock()
	out := make([]string, 0, len(m.known))
	for k := range m.known {
		out = append(out, k)
	}
	return out
}

func (m *Manager) handleEvent(ctx context.Context, ev streamEvent) {
	m.track(ev.path, ev.kind != eventDelete)
	for _, s := range m.allSubs() {
		s.mu.Lock()
		if s.deleted {
			s.mu.Unlock()
			continue
		}
		if ev.kind == eventDelete {
			m.unlinkDeleted(ctx, s, ev.path)
		} else {
			m.onWrite(ctx, s, ev.path)
		}
		s.mu.Unlock()
	}
}

// schedule queues due webhook deliveries and expired leases.
func (m *Manager) schedule(ctx context.Context) {
	t := time.NewTicker(m.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
		now := m.now()
		for _, s := range m.allSubs() {
			if !s.mu.TryLock() {
				continue // busy; look again next tick
			}
			var j *job
			switch {
			case s.deleted:
			case !s.deliverAt.IsZero() && !now.Before(s.deliverAt) && !s.delivering:
				j = &job{kind: jobDeliver, sub: s}
				s.delivering = true
				s.deliverAt = time.Time{}
			case !s.leaseUntil.IsZero() && !now.Before(s.leaseUntil) && !s.expiring:
				j = &job{kind: jobExpire, sub: s}
				s.expiring = true
			}
			s.mu.Unlock()
			if j == nil {
				continue
			}
			select {
			case m.jobs <- *j:
			default:
				s.mu.Lock()
				if j.kind == jobDeliver {
					s.delivering = false
					s.deliverAt = now
				} else {
					s.expiring = false
				}
				s.mu.Unlock()
			}
		}
	}
}

func (m *Manager) kickScheduler() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Manager) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-m.jobs:
			switch j.kind {
			case jobDeliver:
				m.deliver(ctx, j.sub)
			case jobExpire:
				m.expireLease(ctx, j.sub)
			case jobCheck:
				j.sub.mu.Lock()
				if !j.sub.deleted {
					m.maybeWake(ctx, j.sub)
				}
				j.sub.mu.Unlock()
			}
		}
	}
}
