package subscription

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// Subscription types and statuses as they appear on the wire.
const (
	typeWebhook  = "webhook"
	typePullWake = "pull-wake"

	statusActive = "active"
	statusFailed = "failed"

	linkGlob     = "glob"
	linkExplicit = "explicit"
)

// maxWebhookResponse bounds how much of a webhook response is read.
const maxWebhookResponse = 64 << 10

// link is one stream attached to a subscription.
type link struct {
	glob     bool
	explicit bool
	acked    string
}

// streamInfo is a link as reported to clients and workers.
type streamInfo struct {
	Path        string `json:"path"`
	LinkType    string `json:"link_type"`
	AckedOffset string `json:"acked_offset"`
	TailOffset  string `json:"tail_offset"`
	HasPending  bool   `json:"has_pending"`
}

// subscription is the in-memory state of one subscription. mu guards every
// field except def, which never changes; it is held across storage calls so
// that the operations on one subscription are serialised.
type subscription struct {
	mu      sync.Mutex
	def     definition
	links   map[string]*link
	deleted bool
	status  string

	// The current wake. generation increases with every wake; it and the
	// wake id fence stale callbacks. None of this is persisted.
	generation uint64
	wakeID     string
	token      string // webhook callback token of the current wake
	snapshot   []streamInfo
	holder     string    // pull-wake worker holding the lease
	leaseUntil time.Time // zero when no lease runs

	attempts   int       // failed POSTs of the current wake
	deliverAt  time.Time // next webhook POST; zero when none is due
	delivering bool      // a delivery job is queued or in flight
	expiring   bool      // an expiry job is queued
}

func newSubscription(def definition) *subscription {
	return &subscription{def: def, links: make(map[string]*link), status: statusActive}
}

// setLink installs l, or removes the link when it has no type left.
func (s *subscription) setLink(l linkState) {
	if !l.Glob && !l.Explicit {
		delete(s.links, l.Path)
		return
	}
	s.links[l.Path] = &link{glob: l.Glob, explicit: l.Explicit, acked: l.Acked}
}

func (s *subscription) state(path string) linkState {
	if l := s.links[path]; l != nil {
		return linkState{Path: path, Glob: l.glob, Explicit: l.explicit, Acked: l.acked}
	}
	return linkState{Path: path}
}

func (s *subscription) paths() []string {
	out := make([]string, 0, len(s.links))
	for p := range s.links {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func (s *subscription) clearWake() {
	s.wakeID = ""
	s.token = ""
	s.snapshot = nil
	s.holder = ""
	s.leaseUntil = time.Time{}
	s.deliverAt = time.Time{}
	s.attempts = 0
}

func (l *link) linkType() string {
	if l.explicit {
		return linkExplicit
	}
	return linkGlob
}

// head returns a family-1 stream's metadata; found is false when the stream
// does not exist.
func (m *Manager) head(ctx context.Context, path string) (info *streamv1.StreamInfo, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StorageTimeout)
	defer cancel()
	resp, err := m.client.Head(ctx, &streamv1.HeadRequest{Ref: &streamv1.StreamRef{Bucket: m.cfg.DataBucket, Stream: path}})
	if err != nil {
		switch grpcerr.FromStatus(err).Code {
		case errcode.StreamNotFound, errcode.StreamGone, errcode.BucketNotFound:
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("head stream %s: %w", path, err)
	}
	return resp.GetInfo(), true, nil
}

// tail returns the stream's next offset, or zeroOffset when it does not exist.
func (m *Manager) tail(ctx context.Context, path string) (string, error) {
	info, found, err := m.head(ctx, path)
	if err != nil {
		return "", err
	}
	if !found || info.GetNextOffset() == "" {
		return zeroOffset, nil
	}
	return info.GetNextOffset(), nil
}

// headParallelism bounds concurrent Head calls for one subscription.
const headParallelism = 16

// streamInfos reports every link with its current tail. s.mu must be held.
func (m *Manager) streamInfos(ctx context.Context, s *subscription) ([]streamInfo, error) {
	paths := s.paths()
	tails := make([]string, len(paths))
	errs := make([]error, len(paths))
	sem := make(chan struct{}, headParallelism)
	var wg sync.WaitGroup
	for i, p := range paths {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			tails[i], errs[i] = m.tail(ctx, p)
		})
	}
	wg.Wait()
	out := make([]streamInfo, 0, len(paths))
	for i, p := range paths {
		if errs[i] != nil {
			return nil, errs[i]
		}
		l := s.links[p]
		t := tails[i]
		out = append(out, streamInfo{Path: p, LinkType: l.linkType(), AckedOffset: l.acked, TailOffset: t, HasPending: t > l.acked})
	}
	return out, nil
}

func anyPending(infos []streamInfo) (string, bool) {
	for _, i := range infos {
		if i.HasPending {
			return i.Path, true
		}
	}
	return "", false
}

// persistLinks writes link changes to the state stream.
func (m *Manager) persistLinks(ctx context.Context, s *subscription, links []linkState) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StorageTimeout)
	defer cancel()
	return m.store.append(ctx, record{Op: opLinks, ID: s.def.ID, Links: links})
}

// onWrite links a newly seen stream that matches the pattern and starts a
// wake if the subscription has pending work. s.mu must be held.
func (m *Manager) onWrite(ctx context.Context, s *subscription, path string) {
	l := s.links[path]
	if s.def.Pattern != "" && (l == nil || !l.glob) && globMatch(s.def.Pattern, path) {
		st := s.state(path)
		st.Glob = true
		if l == nil {
			// A stream we have not linked yet: all of it is new to us.
			st.Acked = zeroOffset
		}
		if err := m.persistLinks(ctx, s, []linkState{st}); err != nil {
			m.logger.Warn("persist subscription link failed", "subscription_id", s.def.ID, "stream", path, "err", err)
		}
		s.setLink(st)
		l = s.links[path]
	}
	if l == nil {
		return
	}
	m.maybeWake(ctx, s)
}

// unlinkDeleted drops a glob link to a deleted stream and rewinds an
// explicit one so a re-created stream is delivered from its start.
func (m *Manager) unlinkDeleted(ctx context.Context, s *subscription, path string) {
	l := s.links[path]
	if l == nil {
		return
	}
	st := s.state(path)
	if l.explicit {
		st.Acked = zeroOffset
	} else {
		st.Glob = false
	}
	if err := m.persistLinks(ctx, s, []linkState{st}); err != nil {
		m.logger.Warn("persist subscription unlink failed", "subscription_id", s.def.ID, "stream", path, "err", err)
	}
	s.setLink(st)
}

// maybeWake starts a wake when none is active and a linked stream has
// unacknowledged data. It reports whether a wake was started. s.mu must be
// held.
func (m *Manager) maybeWake(ctx context.Context, s *subscription) bool {
	if s.wakeID != "" || s.holder != "" || len(s.links) == 0 {
		return false
	}
	infos, err := m.streamInfos(ctx, s)
	if err != nil {
		m.logger.Warn("subscription pending check failed", "subscription_id", s.def.ID, "err", err)
		return false
	}
	first, ok := anyPending(infos)
	if !ok {
		return false
	}
	m.createWake(ctx, s, infos, first, true)
	return true
}

// createWake opens a new wake generation over infos. Webhook wakes are
// queued for delivery; pull-wake wakes are announced on the wake stream
// when announce is set. s.mu must be held.
func (m *Manager) createWake(ctx context.Context, s *subscription, infos []streamInfo, trigger string, announce bool) {
	s.generation++
	s.wakeID = newWakeID()
	s.snapshot = infos
	s.attempts = 0
	if s.def.Type == typeWebhook {
		s.token = m.signer.issueToken(s.def.ID, s.generation, s.wakeID, m.now())
		s.deliverAt = m.now()
		m.kickScheduler()
		return
	}
	if announce {
		m.writeWakeEvent(ctx, s, trigger)
	}
}

// wakeEvent is appended to a pull-wake subscription's wake stream.
type wakeEvent struct {
	Type           string `json:"type"`
	SubscriptionID string `json:"subscription_id"`
	Stream         string `json:"stream"`
	WakeID         string `json:"wake_id"`
	Generation     uint64 `json:"generation"`
	TS             int64  `json:"ts"`
}

func (m *Manager) writeWakeEvent(ctx context.Context, s *subscription, trigger string) {
	ws := s.def.WakeStream
	info, found, err := m.head(ctx, ws)
	if err != nil || !found {
		m.logger.Warn("wake stream unavailable", "subscription_id", s.def.ID, "wake_stream", ws, "err", err)
		return
	}
	body, _ := json.Marshal(wakeEvent{
		Type: "wake", SubscriptionID: s.def.ID, Stream: trigger,
		WakeID: s.wakeID, Generation: s.generation, TS: m.now().UnixMilli(),
	})
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StorageTimeout)
	defer cancel()
	_, err = m.client.Append(ctx, &streamv1.AppendRequest{
		Ref:         &streamv1.StreamRef{Bucket: m.cfg.DataBucket, Stream: ws},
		ContentType: info.GetContentType(),
		Body:        body,
	})
	if err != nil {
		m.logger.Warn("append wake event failed", "subscription_id", s.def.ID, "wake_stream", ws, "err", err)
	}
}

// expireLease ends a lease whose holder stopped heartbeating and starts a
// new wake if work is still pending.
func (m *Manager) expireLease(ctx context.Context, s *subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expiring = false
	if s.deleted || s.leaseUntil.IsZero() || m.now().Before(s.leaseUntil) {
		return
	}
	m.logger.Info("subscription lease expired", "subscription_id", s.def.ID, "generation", s.generation, "holder", s.holder)
	s.clearWake()
	m.maybeWake(ctx, s)
}

// webhookBody is the JSON POSTed to a webhook.
type webhookBody struct {
	SubscriptionID string       `json:"subscription_id"`
	WakeID         string       `json:"wake_id"`
	Generation     uint64       `json:"generation"`
	Streams        []streamInfo `json:"streams"`
	CallbackURL    string       `json:"callback_url"`
	CallbackToken  string       `json:"callback_token"`
}

// actionURL is the absolute URL of a subscription sub-resource.
func (m *Manager) actionURL(base, id, action string) string {
	if m.cfg.PublicURL != "" {
		base = m.cfg.PublicURL
	}
	for len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	return base + m.prefix + "subscriptions/" + url.PathEscape(id) + "/" + action
}

// deliver POSTs the current wake of a webhook subscription and handles the
// answer: a synchronous {"done":true} acks the snapshot, any other 2xx
// starts the lease, and a failure schedules a retry.
func (m *Manager) deliver(ctx context.Context, s *subscription) {
	s.mu.Lock()
	if s.deleted || s.wakeID == "" || s.def.Type != typeWebhook {
		s.delivering = false
		s.mu.Unlock()
		return
	}
	wakeID, gen := s.wakeID, s.generation
	body, err := json.Marshal(webhookBody{
		SubscriptionID: s.def.ID,
		WakeID:         wakeID,
		Generation:     gen,
		Streams:        s.snapshot,
		CallbackURL:    m.actionURL(s.def.BaseURL, s.def.ID, "callback"),
		CallbackToken:  s.token,
	})
	target := s.def.WebhookURL
	s.mu.Unlock()

	var done bool
	if err == nil {
		done, err = m.post(ctx, target, body)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivering = false
	if s.deleted || s.wakeID != wakeID || s.generation != gen {
		return // fenced by a callback, an expiry or a delete meanwhile
	}
	log := m.logger.With("subscription_id", s.def.ID, "wake_id", wakeID, "generation", gen)
	if err != nil {
		s.attempts++
		s.status = statusFailed
		if ctx.Err() != nil {
			return
		}
		if s.attempts >= m.cfg.MaxDeliveryAttempts {
			log.Warn("webhook delivery abandoned", "attempts", s.attempts, "err", err)
			s.clearWake()
			return
		}
		delay := m.backoff(s.attempts)
		s.deliverAt = m.now().Add(delay)
		log.Warn("webhook delivery failed", "attempt", s.attempts, "retry_in", delay, "err", err)
		return
	}
	s.status = statusActive
	s.attempts = 0
	if !done {
		s.leaseUntil = m.now().Add(time.Duration(s.def.LeaseTTLMS) * time.Millisecond)
		return
	}
	var acks []linkState
	for _, i := range s.snapshot {
		if l := s.links[i.Path]; l != nil && i.TailOffset > l.acked {
			st := s.state(i.Path)
			st.Acked = i.TailOffset
			acks = append(acks, st)
		}
	}
	if len(acks) > 0 {
		if err := m.persistLinks(ctx, s, acks); err != nil {
			// Keep the wake and deliver it again later: at least once.
			s.attempts++
			s.deliverAt = m.now().Add(m.backoff(s.attempts))
			log.Warn("persist webhook auto-ack failed", "err", err)
			return
		}
		for _, st := range acks {
			s.setLink(st)
		}
	}
	s.clearWake()
	m.maybeWake(ctx, s)
}

// post sends one signed webhook request and reports whether the receiver
// answered {"done":true}.
func (m *Manager) post(ctx context.Context, target string, body []byte) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("build webhook request: %w", err)
	}
	req.Header.Set("Content-Type", jsonContentType)
	req.Header.Set("User-Agent", "ursula-subscriptions/1")
	req.Header.Set("Webhook-Signature", m.signer.signatureHeader(body, m.now()))
	resp, err := m.httpClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("post webhook: %w", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxWebhookResponse))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return false, fmt.Errorf("post webhook: status %d", resp.StatusCode)
	}
	var answer struct {
		Done bool `json:"done"`
	}
	_ = json.Unmarshal(data, &answer) // any 2xx body is acceptable
	return answer.Done, nil
}

// backoff returns the delay before retry number attempt (1-based):
// RetryInitialBackoff doubled per attempt, capped at RetryMaxBackoff, with
// ±RetryJitter relative jitter.
func (m *Manager) backoff(attempt int) time.Duration {
	d := m.cfg.RetryInitialBackoff
	for i := 1; i < attempt && d < m.cfg.RetryMaxBackoff; i++ {
		d *= 2
	}
	d = min(d, m.cfg.RetryMaxBackoff)
	j := m.cfg.RetryJitter * (2*rand.Float64() - 1)
	return time.Duration(float64(d) * (1 + j))
}
