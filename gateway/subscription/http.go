package subscription

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/httpserver"
)

// Error codes of the subscription API (the contract's, errors.proto).
const (
	codeInvalidRequest   = errcode.InvalidRequest
	codeNotFound         = errcode.SubscriptionNotFound
	codeAlreadyExists    = errcode.SubscriptionAlreadyExists
	codeURLRejected      = errcode.WebhookURLRejected
	codeTokenInvalid     = errcode.TokenInvalid
	codeTokenExpired     = errcode.TokenExpired
	codeFenced           = errcode.Fenced
	codeAlreadyClaimed   = errcode.AlreadyClaimed
	codeNoPendingWork    = errcode.NoPendingWork
	codeInvalidOffset    = errcode.InvalidOffset
	codeRouteNotFound    = errcode.NotFound
	codeMethodNotAllowed = errcode.MethodNotAllowed
	codeUnavailable      = errcode.Unavailable
	codeLimitExceeded    = errcode.LimitExceeded
)

const (
	defaultLeaseTTLMS = 30_000
	minLeaseTTLMS     = 1_000
	maxLeaseTTLMS     = 10 * 60_000
	maxBodyBytes      = 1 << 20
	maxIDLength       = 256
)

// apiError is an error answer of the subscription API.
type apiError struct {
	Code          errcode.Code `json:"-"`
	Reason        string       `json:"code"`
	Message       string       `json:"message"`
	CurrentHolder string       `json:"current_holder,omitempty"`
	Generation    *uint64      `json:"generation,omitempty"`
}

func (e *apiError) Error() string { return errcode.Reason(e.Code) + ": " + e.Message }

func newAPIError(code errcode.Code, format string, args ...any) *apiError {
	return &apiError{Code: code, Message: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", jsonContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	e.Reason = errcode.Reason(e.Code)
	status := errcode.HTTPStatus(e.Code)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, map[string]*apiError{"error": e})
}

func writeNoContent(w http.ResponseWriter) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusNoContent)
}

func methodNotAllowed(w http.ResponseWriter, allow ...string) {
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, newAPIError(codeMethodNotAllowed, "method not allowed"))
}

// route is a parsed request path below <StreamRoot>__ds/.
type route struct {
	action string // jwks, base, streams, stream, callback, claim, ack, release
	id     string
	stream string
}

func (m *Manager) parseRoute(escapedPath string) (route, bool) {
	rest, ok := strings.CutPrefix(escapedPath, m.prefix)
	if !ok {
		return route{}, false
	}
	if rest == "jwks.json" {
		return route{action: "jwks"}, true
	}
	segs := strings.Split(rest, "/")
	if len(segs) < 2 || segs[0] != "subscriptions" || segs[1] == "" {
		return route{}, false
	}
	id, err := url.PathUnescape(segs[1])
	if err != nil || id == "" || len(id) > maxIDLength || strings.ContainsAny(id, "/\x00") || !utf8.ValidString(id) {
		return route{}, false
	}
	r := route{id: id}
	switch {
	case len(segs) == 2:
		r.action = "base"
	case segs[2] == "streams" && len(segs) == 3:
		r.action = "streams"
	case segs[2] == "streams":
		p, err := url.PathUnescape(strings.Join(segs[3:], "/"))
		if err != nil || normalizePath(p) == "" {
			return route{}, false
		}
		r.action, r.stream = "stream", normalizePath(p)
	case len(segs) == 3 && slices.Contains([]string{"callback", "claim", "ack", "release"}, segs[2]):
		r.action = segs[2]
	default:
		return route{}, false
	}
	return r, true
}

// ServeHTTP serves every request whose path starts with <StreamRoot>__ds/.
func (m *Manager) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, ok := m.parseRoute(r.URL.EscapedPath())
	if !ok {
		writeError(w, newAPIError(codeRouteNotFound, "durable streams control route not found"))
		return
	}
	if rt.action == "jwks" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, http.MethodGet, http.MethodHead)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "public, max-age=300")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(m.signer.jwks())
		}
		return
	}
	allowed := map[string]string{
		"base": "GET, PUT, DELETE", "streams": "POST", "stream": "DELETE",
		"callback": "POST", "claim": "POST", "ack": "POST", "release": "POST",
	}[rt.action]
	if !slices.Contains(strings.Split(allowed, ", "), r.Method) {
		methodNotAllowed(w, allowed)
		return
	}
	if err := m.ensureLoaded(r.Context()); err != nil {
		m.logger.Warn("subscription state unavailable", "err", err)
		writeError(w, newAPIError(codeUnavailable, "subscription state unavailable"))
		return
	}
	var err error
	switch rt.action {
	case "base":
		switch r.Method {
		case http.MethodPut:
			err = m.handlePut(w, r, rt.id)
		case http.MethodGet:
			err = m.handleGet(w, r, rt.id)
		default:
			err = m.handleDelete(w, r, rt.id)
		}
	case "streams":
		err = m.handleAddStreams(w, r, rt.id)
	case "stream":
		err = m.handleRemoveStream(w, r, rt.id, rt.stream)
	case "claim":
		err = m.handleClaim(w, r, rt.id)
	default:
		err = m.handleWakeCall(w, r, rt.id, rt.action)
	}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			m.logger.Warn("subscription request failed", "subscription_id", rt.id, "action", rt.action, "err", err)
			ae = newAPIError(codeUnavailable, "storage unavailable")
		}
		writeError(w, ae)
	}
}

// readBody reads a request body of at most maxBodyBytes, charged against
// the process's in-flight request-body budget while it is decoded; the
// caller releases it.
func (m *Manager) readBody(r *http.Request) (*httpserver.Body, error) {
	b, err := httpserver.ReadBody(r, maxBodyBytes, m.budget)
	if err == nil {
		return b, nil
	}
	var tooLarge *httpserver.BodyTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return nil, newAPIError(codeInvalidRequest, "read body: %s", tooLarge.Error())
	case errors.Is(err, httpserver.ErrBudgetExhausted):
		return nil, newAPIError(errcode.Overloaded, "the gateway holds its budget of in-flight request bodies; retry")
	case errors.Is(err, httpserver.ErrBodyStalled):
		return nil, newAPIError(errcode.RequestTimeout, "the request body made no progress")
	}
	return nil, newAPIError(codeInvalidRequest, "read body: %v", err)
}

// readJSONObject reads the body as a JSON object; an empty body is {}.
func (m *Manager) readJSONObject(r *http.Request) (map[string]json.RawMessage, error) {
	body, err := m.readBody(r)
	if err != nil {
		return nil, err
	}
	defer body.Release()
	data := body.Bytes()
	obj := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(data)) == 0 {
		return obj, nil
	}
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		return nil, newAPIError(codeInvalidRequest, "request body must be a JSON object")
	}
	return obj, nil
}

// field decodes obj[key] into v when present and not null; it reports
// whether the field was set.
func field(obj map[string]json.RawMessage, key string, v any) (bool, error) {
	raw, ok := obj[key]
	if !ok || string(raw) == "null" {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, newAPIError(codeInvalidRequest, "invalid %s", key)
	}
	return true, nil
}

// baseURL is the origin the client used, for absolute URLs in answers.
func (m *Manager) baseURL(r *http.Request) string {
	if m.cfg.PublicURL != "" {
		return strings.TrimRight(m.cfg.PublicURL, "/")
	}
	first := func(v string) string {
		v, _, _ = strings.Cut(v, ",")
		return strings.TrimSpace(v)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := first(r.Header.Get("X-Forwarded-Proto")); p == "http" || p == "https" {
		scheme = p
	}
	host := r.Host
	if h := first(r.Header.Get("X-Forwarded-Host")); h != "" {
		host = h
	}
	return scheme + "://" + host
}

// createInput is a validated PUT body.
type createInput struct {
	Type        string   `json:"type"`
	Pattern     string   `json:"pattern,omitempty"`
	Streams     []string `json:"streams"`
	WebhookURL  string   `json:"webhook_url,omitempty"`
	WakeStream  string   `json:"wake_stream,omitempty"`
	LeaseTTLMS  int64    `json:"lease_ttl_ms"`
	Description *string  `json:"description,omitempty"`
}

// hash is the SHA-256 of the canonical JSON of the input; an identical
// re-PUT has the same hash.
func (in createInput) hash() string {
	b, _ := json.Marshal(in)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func parseCreate(obj map[string]json.RawMessage) (createInput, error) {
	var in createInput
	if _, err := field(obj, "type", &in.Type); err != nil {
		return in, err
	}
	if in.Type != typeWebhook && in.Type != typePullWake {
		return in, newAPIError(codeInvalidRequest, `type must be "webhook" or "pull-wake"`)
	}
	if _, err := field(obj, "pattern", &in.Pattern); err != nil {
		return in, err
	}
	in.Pattern = normalizePath(in.Pattern)
	var streams []string
	if _, err := field(obj, "streams", &streams); err != nil {
		return in, newAPIError(codeInvalidRequest, "streams must be an array of strings")
	}
	in.Streams = []string{}
	for _, s := range streams {
		p := normalizePath(s)
		if p == "" {
			return in, newAPIError(codeInvalidRequest, "streams must contain non-empty paths")
		}
		if !slices.Contains(in.Streams, p) {
			in.Streams = append(in.Streams, p)
		}
	}
	slices.Sort(in.Streams)
	if in.Pattern == "" && len(in.Streams) == 0 {
		return in, newAPIError(codeInvalidRequest, "at least one of pattern or streams is required")
	}
	in.LeaseTTLMS = defaultLeaseTTLMS
	var ttl float64
	if set, err := field(obj, "lease_ttl_ms", &ttl); err != nil {
		return in, newAPIError(codeInvalidRequest, "lease_ttl_ms must be an integer from %d to %d", minLeaseTTLMS, maxLeaseTTLMS)
	} else if set {
		if ttl != math.Trunc(ttl) || ttl < minLeaseTTLMS || ttl > maxLeaseTTLMS {
			return in, newAPIError(codeInvalidRequest, "lease_ttl_ms must be an integer from %d to %d", minLeaseTTLMS, maxLeaseTTLMS)
		}
		in.LeaseTTLMS = int64(ttl)
	}
	var desc string
	if set, err := field(obj, "description", &desc); err != nil {
		return in, err
	} else if set {
		in.Description = &desc
	}
	switch in.Type {
	case typeWebhook:
		var wh struct {
			URL string `json:"url"`
		}
		if _, err := field(obj, "webhook", &wh); err != nil || wh.URL == "" {
			return in, newAPIError(codeInvalidRequest, "webhook subscriptions require webhook.url")
		}
		in.WebhookURL = wh.URL
	case typePullWake:
		if _, err := field(obj, "wake_stream", &in.WakeStream); err != nil {
			return in, err
		}
		in.WakeStream = normalizePath(in.WakeStream)
		if in.WakeStream == "" {
			return in, newAPIError(codeInvalidRequest, "pull-wake subscriptions require wake_stream")
		}
	}
	return in, nil
}

// subscriptionView is the JSON form of a subscription.
type subscriptionView struct {
	ID             string       `json:"id"`
	SubscriptionID string       `json:"subscription_id"`
	Type           string       `json:"type"`
	Pattern        string       `json:"pattern,omitempty"`
	Streams        []linkView   `json:"streams"`
	Webhook        *webhookView `json:"webhook,omitempty"`
	WakeStream     string       `json:"wake_stream,omitempty"`
	LeaseTTLMS     int64        `json:"lease_ttl_ms"`
	CreatedAt      string       `json:"created_at"`
	Status         string       `json:"status"`
	Description    *string      `json:"description,omitempty"`
}

type linkView struct {
	Path        string `json:"path"`
	LinkType    string `json:"link_type"`
	AckedOffset string `json:"acked_offset"`
}

type webhookView struct {
	URL     string      `json:"url"`
	Signing signingView `json:"signing"`
}

type signingView struct {
	Alg     string `json:"alg"`
	Kid     string `json:"kid"`
	JWKSURL string `json:"jwks_url"`
}

// view renders s; s.mu must be held.
func (m *Manager) view(s *subscription, base string) subscriptionView {
	v := subscriptionView{
		ID: s.def.ID, SubscriptionID: s.def.ID, Type: s.def.Type, Pattern: s.def.Pattern,
		Streams: []linkView{}, WakeStream: s.def.WakeStream, LeaseTTLMS: s.def.LeaseTTLMS,
		CreatedAt: s.def.CreatedAt, Status: s.status, Description: s.def.Description,
	}
	for _, p := range s.paths() {
		l := s.links[p]
		v.Streams = append(v.Streams, linkView{Path: p, LinkType: l.linkType(), AckedOffset: l.acked})
	}
	if s.def.Type == typeWebhook {
		v.Webhook = &webhookView{URL: s.def.WebhookURL, Signing: signingView{
			Alg: "ed25519", Kid: m.signer.kid, JWKSURL: base + m.prefix + "jwks.json",
		}}
	}
	return v
}

func (m *Manager) handlePut(w http.ResponseWriter, r *http.Request, id string) error {
	obj, err := m.readJSONObject(r)
	if err != nil {
		return err
	}
	in, err := parseCreate(obj)
	if err != nil {
		return err
	}
	if len(in.Streams) > m.cfg.MaxStreamsPerSubscription {
		return newAPIError(codeLimitExceeded, "a subscription links at most %d streams explicitly", m.cfg.MaxStreamsPerSubscription)
	}
	hash := in.hash()
	base := m.baseURL(r)

	m.adminMu.Lock()
	defer m.adminMu.Unlock()
	if s := m.getSub(id); s != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.def.ConfigHash != hash {
			return newAPIError(codeAlreadyExists, "subscription already exists with a different configuration")
		}
		writeJSON(w, http.StatusOK, m.view(s, base))
		return nil
	}
	if err := m.checkNewLinks(nil, in.Streams); err != nil {
		return err
	}
	ctx := r.Context()
	switch in.Type {
	case typeWebhook:
		if err := m.policy.validateWebhookURL(in.WebhookURL); err != nil {
			return newAPIError(codeURLRejected, "%s", err.Error())
		}
	case typePullWake:
		info, found, err := m.head(ctx, in.WakeStream)
		if err != nil {
			return err
		}
		if !found {
			return newAPIError(codeInvalidRequest, "wake_stream %q does not exist", in.WakeStream)
		}
		if !isJSONContentType(info.GetContentType()) {
			return newAPIError(codeInvalidRequest, "wake_stream %q is not an application/json stream", in.WakeStream)
		}
	}

	def := definition{
		ID: id, Type: in.Type, Pattern: in.Pattern, Streams: in.Streams, WebhookURL: in.WebhookURL,
		WakeStream: in.WakeStream, LeaseTTLMS: in.LeaseTTLMS, Description: in.Description,
		CreatedAt: m.now().UTC().Format(time.RFC3339Nano), BaseURL: base, ConfigHash: hash,
	}
	links, err := m.initialLinks(ctx, in)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.StorageTimeout)
	defer cancel()
	if err := m.store.append(pctx, record{Op: opCreate, ID: id, Def: &def, Links: links}); err != nil {
		return err
	}
	s := newSubscription(def)
	for _, l := range links {
		s.setLink(l)
	}
	m.mu.Lock()
	m.subs[id] = s
	m.mu.Unlock()
	m.logger.Info("subscription created", "subscription_id", id, "type", in.Type, "pattern", in.Pattern, "streams", len(links))
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusCreated, m.view(s, base))
	return nil
}

// initialLinks links the explicit streams and the known streams matching
// the pattern at their current tails.
func (m *Manager) initialLinks(ctx context.Context, in createInput) ([]linkState, error) {
	byPath := map[string]*linkState{}
	for _, p := range in.Streams {
		t, err := m.tail(ctx, p)
		if err != nil {
			return nil, err
		}
		byPath[p] = &linkState{Path: p, Explicit: true, Acked: t}
	}
	if in.Pattern != "" {
		for _, p := range m.knownStreams() {
			if !globMatch(in.Pattern, p) {
				continue
			}
			if l := byPath[p]; l != nil {
				l.Glob = true
				continue
			}
			info, found, err := m.head(ctx, p)
			if err != nil {
				return nil, err
			}
			if found {
				byPath[p] = &linkState{Path: p, Glob: true, Acked: info.GetNextOffset()}
			}
		}
	}
	out := make([]linkState, 0, len(byPath))
	for _, l := range byPath {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b linkState) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

func isJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), jsonContentType)
}

func (m *Manager) handleGet(w http.ResponseWriter, r *http.Request, id string) error {
	s := m.getSub(id)
	if s == nil {
		return newAPIError(codeNotFound, "subscription not found")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted {
		return newAPIError(codeNotFound, "subscription not found")
	}
	writeJSON(w, http.StatusOK, m.view(s, m.baseURL(r)))
	return nil
}

func (m *Manager) handleDelete(w http.ResponseWriter, r *http.Request, id string) error {
	m.adminMu.Lock()
	defer m.adminMu.Unlock()
	s := m.getSub(id)
	if s == nil {
		writeNoContent(w)
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), m.cfg.StorageTimeout)
	defer cancel()
	if err := m.store.append(ctx, record{Op: opDelete, ID: id}); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.subs, id)
	m.mu.Unlock()
	s.mu.Lock()
	s.deleted = true
	s.clearWake()
	s.mu.Unlock()
	m.logger.Info("subscription deleted", "subscription_id", id)
	writeNoContent(w)
	return nil
}

// lockSub returns the live subscription id with its mutex held.
func (m *Manager) lockSub(id string) (*subscription, error) {
	s := m.getSub(id)
	if s == nil {
		return nil, newAPIError(codeNotFound, "subscription not found")
	}
	s.mu.Lock()
	if s.deleted {
		s.mu.Unlock()
		return nil, newAPIError(codeNotFound, "subscription not found")
	}
	return s, nil
}

func (m *Manager) handleAddStreams(w http.ResponseWriter, r *http.Request, id string) error {
	obj, err := m.readJSONObject(r)
	if err != nil {
		return err
	}
	var streams []string
	if _, err := field(obj, "streams", &streams); err != nil || len(streams) == 0 {
		return newAPIError(codeInvalidRequest, "streams must be a non-empty string array")
	}
	for i, p := range streams {
		if streams[i] = normalizePath(p); streams[i] == "" {
			return newAPIError(codeInvalidRequest, "streams must be a non-empty string array")
		}
	}
	if len(streams) > m.cfg.MaxStreamsPerSubscription {
		return newAPIError(codeLimitExceeded, "a subscription links at most %d streams explicitly", m.cfg.MaxStreamsPerSubscription)
	}
	// Serialised with creates, so that the limits hold.
	m.adminMu.Lock()
	defer m.adminMu.Unlock()
	target := m.getSub(id)
	if target == nil {
		return newAPIError(codeNotFound, "subscription not found")
	}
	if err := m.checkNewLinks(target, streams); err != nil {
		return err
	}
	s, err := m.lockSub(id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	var changes []linkState
	for _, p := range streams {
		st := s.state(p)
		if st.Explicit || slices.ContainsFunc(changes, func(c linkState) bool { return c.Path == p }) {
			continue
		}
		if !st.Glob {
			t, err := m.tail(r.Context(), p)
			if err != nil {
				return err
			}
			st.Acked = t
		}
		st.Explicit = true
		changes = append(changes, st)
	}
	if len(changes) > 0 {
		if err := m.persistLinks(r.Context(), s, changes); err != nil {
			return err
		}
		for _, st := range changes {
			s.setLink(st)
		}
	}
	writeNoContent(w)
	return nil
}

// checkNewLinks enforces the subscription limits for explicit links to
// paths, by a new subscription (s nil) or by s: the number of
// subscriptions, the streams one subscription links, and the
// subscriptions linking one stream. m.adminMu is held (every change of
// explicit links but removals runs under it); no subscription's mutex is.
func (m *Manager) checkNewLinks(s *subscription, paths []string) error {
	subs := m.allSubs()
	if s == nil && len(subs) >= m.cfg.MaxSubscriptions {
		return newAPIError(codeLimitExceeded, "at most %d subscriptions", m.cfg.MaxSubscriptions)
	}
	want := make(map[string]int, len(paths)) // explicit links to each path, by other subscriptions
	for _, p := range paths {
		want[p] = 0
	}
	own := 0
	for _, o := range subs {
		o.mu.Lock()
		if o.deleted {
			o.mu.Unlock()
			continue
		}
		if o == s {
			for p, l := range o.links {
				if l.explicit {
					own++
					delete(want, p) // already linked: no change
				}
			}
		} else {
			for p := range want {
				if l := o.links[p]; l != nil && l.explicit {
					want[p]++
				}
			}
		}
		o.mu.Unlock()
	}
	if s != nil && own+len(want) > m.cfg.MaxStreamsPerSubscription {
		return newAPIError(codeLimitExceeded, "a subscription links at most %d streams explicitly", m.cfg.MaxStreamsPerSubscription)
	}
	for p, n := range want {
		if n >= m.cfg.MaxSubscriptionsPerStream {
			return newAPIError(codeLimitExceeded, "stream %s is linked by %d subscriptions, the most allowed", p, n)
		}
	}
	return nil
}

func (m *Manager) handleRemoveStream(w http.ResponseWriter, r *http.Request, id, path string) error {
	s, err := m.lockSub(id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	st := s.state(path)
	if st.Explicit {
		st.Explicit = false
		if err := m.persistLinks(r.Context(), s, []linkState{st}); err != nil {
			return err
		}
		s.setLink(st)
	}
	writeNoContent(w)
	return nil
}

// claimResponse answers a successful claim.
type claimResponse struct {
	WakeID     string       `json:"wake_id"`
	Generation uint64       `json:"generation"`
	Token      string       `json:"token"`
	Streams    []streamInfo `json:"streams"`
	LeaseTTLMS int64        `json:"lease_ttl_ms"`
}

func (m *Manager) handleClaim(w http.ResponseWriter, r *http.Request, id string) error {
	obj, err := m.readJSONObject(r)
	if err != nil {
		return err
	}
	var worker string
	if _, err := field(obj, "worker", &worker); err != nil || worker == "" {
		return newAPIError(codeInvalidRequest, "worker must be a non-empty string")
	}
	s, err := m.lockSub(id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.def.Type != typePullWake {
		return newAPIError(codeInvalidRequest, "subscription is not pull-wake")
	}
	now := m.now()
	if s.holder != "" {
		if now.Before(s.leaseUntil) {
			gen := s.generation
			return &apiError{Code: codeAlreadyClaimed, Message: "subscription is claimed by another worker", CurrentHolder: s.holder, Generation: &gen}
		}
		s.clearWake() // expired; the scheduler has not noticed yet
	}
	infos, err := m.streamInfos(r.Context(), s)
	if err != nil {
		return err
	}
	if s.wakeID == "" {
		first, ok := anyPending(infos)
		if !ok {
			return newAPIError(codeNoPendingWork, "subscription has no pending work")
		}
		m.createWake(r.Context(), s, infos, first, false)
	}
	s.snapshot = infos
	s.holder = worker
	s.leaseUntil = now.Add(time.Duration(s.def.LeaseTTLMS) * time.Millisecond)
	token := m.signer.issueToken(s.def.ID, s.generation, s.wakeID, now)
	m.logger.Debug("subscription claimed", "subscription_id", id, "worker", worker, "generation", s.generation)
	writeJSON(w, http.StatusOK, claimResponse{
		WakeID: s.wakeID, Generation: s.generation, Token: token, Streams: infos, LeaseTTLMS: s.def.LeaseTTLMS,
	})
	return nil
}

// wakeRequest is the body of callback, ack and release.
type wakeRequest struct {
	WakeID     string  `json:"wake_id"`
	Generation *uint64 `json:"generation"`
	Acks       []struct {
		Stream string `json:"stream"`
		Path   string `json:"path"`
		Offset string `json:"offset"`
	} `json:"acks"`
	Done bool `json:"done"`
}

// handleWakeCall serves the webhook callback and the pull-wake ack and
// release: token check, fencing, acks, lease extension and completion.
func (m *Manager) handleWakeCall(w http.ResponseWriter, r *http.Request, id, action string) error {
	auth := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return newAPIError(codeTokenInvalid, "missing or malformed Authorization header")
	}
	body, err := m.readBody(r)
	if err != nil {
		return err
	}
	data := body.Bytes()
	var req wakeRequest
	if len(bytes.TrimSpace(data)) > 0 {
		err = json.Unmarshal(data, &req)
	}
	body.Release()
	if err != nil {
		return newAPIError(codeInvalidRequest, "invalid JSON body")
	}
	s, err := m.lockSub(id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	wantType := typePullWake
	if action == "callback" {
		wantType = typeWebhook
	}
	if s.def.Type != wantType {
		return newAPIError(codeInvalidRequest, "%s is not supported by %s subscriptions", action, s.def.Type)
	}
	claims, code := m.signer.verifyToken(token, id, m.now())
	if code != 0 {
		return newAPIError(code, "token rejected")
	}
	if s.wakeID == "" || claims.Gen != s.generation || claims.Wake != s.wakeID ||
		req.Generation == nil || *req.Generation != s.generation || req.WakeID != s.wakeID ||
		(s.def.Type == typePullWake && s.holder == "") {
		gen := s.generation
		return &apiError{Code: codeFenced, Message: "wake generation is stale", Generation: &gen}
	}
	log := m.logger.With("subscription_id", id, "wake_id", s.wakeID, "generation", s.generation)

	if action == "release" {
		s.clearWake()
		m.maybeWake(r.Context(), s)
		log.Debug("subscription released")
		writeNoContent(w)
		return nil
	}

	var acks []linkState
	for _, a := range req.Acks {
		p := normalizePath(a.Stream)
		if p == "" {
			p = normalizePath(a.Path)
		}
		l := s.links[p]
		if p == "" || l == nil {
			return newAPIError(codeInvalidOffset, "ack references an unknown subscription stream")
		}
		if a.Offset == "" || a.Offset == beforeFirstOffset || a.Offset == "now" {
			return newAPIError(codeInvalidOffset, "ack offset %q is not a stream offset", a.Offset)
		}
		if a.Offset < l.acked {
			return newAPIError(codeInvalidOffset, "ack offset regresses the acked offset of %s", p)
		}
		t, err := m.tail(r.Context(), p)
		if err != nil {
			return err
		}
		if a.Offset > t {
			return newAPIError(codeInvalidOffset, "ack offset is beyond the tail of %s", p)
		}
		st := s.state(p)
		st.Acked = a.Offset
		acks = slices.DeleteFunc(acks, func(x linkState) bool { return x.Path == p })
		acks = append(acks, st)
	}
	if len(acks) > 0 {
		if err := m.persistLinks(r.Context(), s, acks); err != nil {
			return err
		}
		for _, st := range acks {
			s.setLink(st)
		}
	}
	s.leaseUntil = m.now().Add(time.Duration(s.def.LeaseTTLMS) * time.Millisecond)
	next := false
	if req.Done {
		s.clearWake()
		next = m.maybeWake(r.Context(), s)
		log.Debug("subscription wake done", "next_wake", next)
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true, "next_wake": next})
	return nil
}
