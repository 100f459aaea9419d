package ursulactl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ursula/ursula/internal/pki"
)

// IncarnationHeader carries the pinned process incarnation on every
// admin mutation.
const IncarnationHeader = "x-ursula-process-incarnation"

// Headers recorded in a node's audit trail with each mutation, as
// asserted by the caller.
const (
	ActorHeader  = "x-ursula-actor"
	ReasonHeader = "x-ursula-reason"
)

// observeTimeout bounds one GET of metrics, readiness or shed state.
const observeTimeout = 5 * time.Second

// maxBody bounds the answers ursulactl reads.
const maxBody = 64 << 20

// nodeClient talks to one node: observations on its client plane, shed
// state and mutations on its admin plane.
type nodeClient struct {
	node          Node
	http          *http.Client
	actor, reason string

	tokenOnce sync.Once
	token     string
	tokenErr  error
}

// adminToken reads the node's admin token file once.
func (c *nodeClient) adminToken() (string, error) {
	c.tokenOnce.Do(func() {
		if c.node.AdminTokenFile == "" {
			return
		}
		b, err := pki.ReadTokenFile(c.node.AdminTokenFile)
		if err != nil {
			c.tokenErr = fmt.Errorf("read admin_token_file %s: %w", c.node.AdminTokenFile, err)
			return
		}
		c.token = string(b)
	})
	return c.token, c.tokenErr
}

// request sends one request and reads the whole answer.
func (c *nodeClient) request(ctx context.Context, method, url string, header http.Header, admin bool) (int, http.Header, []byte, error) {
	return c.requestBody(ctx, method, url, header, admin, nil)
}

// requestBody is request with a JSON body (nil: none).
func (c *nodeClient) requestBody(ctx context.Context, method, url string, header http.Header, admin bool, payload []byte) (int, http.Header, []byte, error) {
	if payload == nil {
		return c.requestRaw(ctx, method, url, header, admin, nil)
	}
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "application/json")
	return c.requestRaw(ctx, method, url, h, admin, bytes.NewReader(payload))
}

// requestRaw sends one request with a body (nil: none) whose Content-Type
// header says what it is, and reads the whole answer.
func (c *nodeClient) requestRaw(ctx context.Context, method, url string, header http.Header, admin bool, body io.Reader) (int, http.Header, []byte, error) {
	if body == nil {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return 0, nil, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	if admin {
		tok, err := c.adminToken()
		if err != nil {
			return 0, nil, nil, err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	return resp.StatusCode, resp.Header, rb, nil
}

// statusError builds the error of an unexpected answer.
func statusError(method, url string, status int, h http.Header, body []byte) *StatusError {
	e := &StatusError{Method: method, URL: url, Status: status}
	var eb struct {
		Code     string          `json:"code"`
		Message  string          `json:"message"`
		LeaderID json.RawMessage `json:"leader_id"`
	}
	if json.Unmarshal(body, &eb) == nil && (eb.Code != "" || eb.Message != "") {
		e.Code, e.Message = eb.Code, eb.Message
		if len(eb.LeaderID) > 0 {
			var f float64
			if json.Unmarshal(eb.LeaderID, &f) == nil && f > 0 {
				e.LeaderID = uint64(f)
			}
		}
	} else {
		s := strings.TrimSpace(string(body))
		if len(s) > 200 {
			s = s[:200] + "…"
		}
		e.Body = s
	}
	if ra := h.Get("Retry-After"); ra != "" {
		if secs, err := strconv.Atoi(ra); err == nil && secs >= 0 {
			e.RetryAfter, e.HasRetryAfter = time.Duration(secs)*time.Second, true
		}
	}
	return e
}

// Metrics fetches and decodes GET /__ursula/metrics on the client plane.
func (c *nodeClient) Metrics(ctx context.Context) (*Metrics, error) {
	var m Metrics
	if err := c.metricsInto(ctx, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// metricsInto decodes GET /__ursula/metrics on the client plane into v
// (callers read different parts of the document).
func (c *nodeClient) metricsInto(ctx context.Context, v any) error {
	ctx, cancel := context.WithTimeout(ctx, observeTimeout)
	defer cancel()
	url := c.node.ClientURL + "/__ursula/metrics"
	status, h, body, err := c.request(ctx, http.MethodGet, url, nil, false)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return statusError(http.MethodGet, url, status, h, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// Readiness fetches GET /__ursula/ready on the client plane: 200 or 503
// with the documented JSON body.
func (c *nodeClient) Readiness(ctx context.Context) (*Readiness, error) {
	ctx, cancel := context.WithTimeout(ctx, observeTimeout)
	defer cancel()
	url := c.node.ClientURL + "/__ursula/ready"
	status, h, body, err := c.request(ctx, http.MethodGet, url, nil, false)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK && status != http.StatusServiceUnavailable {
		return nil, statusError(http.MethodGet, url, status, h, body)
	}
	r := Readiness{Status: status}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("GET %s: %d answer: %w", url, status, err)
	}
	return &r, nil
}

// Shed fetches GET /__ursula/leadership-shed on the admin plane.
func (c *nodeClient) Shed(ctx context.Context) (*ShedState, error) {
	ctx, cancel := context.WithTimeout(ctx, observeTimeout)
	defer cancel()
	url := c.node.AdminURL + "/__ursula/leadership-shed"
	status, h, body, err := c.request(ctx, http.MethodGet, url, nil, true)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, statusError(http.MethodGet, url, status, h, body)
	}
	var s ShedState
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return &s, nil
}

// Audit reads a node's audit trail: its newest records, at most limit,
// oldest first, as the node wrote them.
func (c *Controller) Audit(ctx context.Context, id uint64, limit int) ([]json.RawMessage, error) {
	nc := c.clients[id]
	if nc == nil {
		return nil, fmt.Errorf("node %d is not in the manifest (nodes %v)", id, c.m.IDs())
	}
	url := fmt.Sprintf("%s/__ursula/audit?limit=%d", nc.node.AdminURL, limit)
	status, rh, body, err := nc.request(ctx, http.MethodGet, url, nil, true)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if status != http.StatusOK {
		return nil, statusError(http.MethodGet, url, status, rh, body)
	}
	var doc struct {
		Records []json.RawMessage `json:"records"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return doc.Records, nil
}

// Pinned is a node whose process incarnation an operation read once. Every
// mutation of the operation carries it, and it is never refreshed: a node
// that restarted answers 412 and the operation stops.
type Pinned struct {
	client      *nodeClient
	Incarnation string
}

// Node is the pinned node.
func (p *Pinned) Node() Node { return p.client.node }

// Do sends one admin mutation (path with its query) and returns the 2xx
// answer's body. 412 and 428 are safety aborts; any other answer is a
// *StatusError.
func (p *Pinned) Do(ctx context.Context, method, pathAndQuery string) ([]byte, error) {
	body, _, err := p.send(ctx, method, pathAndQuery, http.Header{}, nil)
	return body, err
}

// send is Do with headers and a body (nil: none), returning the answer's
// headers too.
func (p *Pinned) send(ctx context.Context, method, pathAndQuery string, h http.Header, reqBody io.Reader) ([]byte, http.Header, error) {
	n := p.client.node
	url := n.AdminURL + pathAndQuery
	h.Set(IncarnationHeader, p.Incarnation)
	if a := p.client.actor; a != "" {
		h.Set(ActorHeader, a)
	}
	if r := p.client.reason; r != "" {
		h.Set(ReasonHeader, r)
	}
	status, rh, body, err := p.client.requestRaw(ctx, method, url, h, true, reqBody)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	switch {
	case status >= 200 && status < 300:
		return body, rh, nil
	case status == http.StatusPreconditionFailed:
		var now struct {
			Incarnation string `json:"process_incarnation"`
		}
		_ = json.Unmarshal(body, &now)
		return nil, nil, &abortError{
			msg: fmt.Sprintf("node %d answered 412: its process restarted since process incarnation %s was pinned (now %q); nothing was changed by %s %s; check the cluster and start the operation again",
				n.ID, p.Incarnation, now.Incarnation, method, pathAndQuery),
			cause: statusError(method, url, status, rh, body),
		}
	case status == http.StatusPreconditionRequired:
		return nil, nil, &abortError{
			msg:   fmt.Sprintf("node %d answered 428 (incarnation required) to %s %s", n.ID, method, pathAndQuery),
			cause: statusError(method, url, status, rh, body),
		}
	default:
		return nil, nil, statusError(method, url, status, rh, body)
	}
}

// DoRetry is Do, sent again (same incarnation) while the node answers 503
// with Retry-After, until ctx ends.
func (p *Pinned) DoRetry(ctx context.Context, method, pathAndQuery string) ([]byte, error) {
	for {
		body, err := p.Do(ctx, method, pathAndQuery)
		var se *StatusError
		if err == nil || !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || !se.HasRetryAfter || errors.Is(err, ErrAborted) {
			return body, err
		}
		wait := min(max(se.RetryAfter, 100*time.Millisecond), 5*time.Second)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (still answering 503 when the timeout ended)", err)
		case <-time.After(wait):
		}
	}
}

// prettyJSON indents a JSON body for printing (as is when it is not JSON).
func prettyJSON(body []byte) string {
	var b bytes.Buffer
	if json.Indent(&b, bytes.TrimSpace(body), "", "  ") != nil {
		return strings.TrimSpace(string(body))
	}
	return b.String()
}
