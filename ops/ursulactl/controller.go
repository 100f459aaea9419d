package ursulactl

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ursula/ursula/internal/pki"
)

// Defaults of Options.
const (
	DefaultTimeout      = 5 * time.Minute
	DefaultSettle       = time.Minute
	DefaultMaxLag       = 100
	DefaultPollInterval = 250 * time.Millisecond
)

// transferRetry is how long a drain waits for a leadership transfer it
// asked for before it asks again (a transfer the target does not complete
// is abandoned by the leader after about two election timeouts).
const transferRetry = 3 * time.Second

// transferWait bounds how long the transfer verb waits for the group to
// move.
const transferWait = 15 * time.Second

// Hooks are seams for tests. Production code leaves them nil.
type Hooks struct {
	// Pinned runs right after an operation read node's process
	// incarnation and before its first mutation of that node: a test can
	// restart the node here to check that the mutation answers 412 and the
	// operation stops.
	Pinned func(ctx context.Context, node uint64) error
}

// Options configure a Controller.
type Options struct {
	// Out receives result lines; nil discards them.
	Out io.Writer
	// Progress receives the progress of long waits (stderr); nil shows
	// none.
	Progress io.Writer
	// TTY draws progress as bars (Progress is a terminal) instead of
	// plain lines.
	TTY bool
	// Now paces progress lines; nil means time.Now.
	Now func() time.Time
	// Confirm is asked before a destructive step that only the
	// operation's own reads reveal (a membership change that removes a
	// voter); nil confirms everything (a library caller decided).
	Confirm func(ctx context.Context, cf Confirmation) error
	// Timeout bounds each wait (a drain's handoffs, wait, wait-ready,
	// retries of 503 answers); zero means DefaultTimeout.
	Timeout time.Duration
	// Settle bounds how long rollout waits, before each node, for the
	// cluster to pass verify-cluster; zero means DefaultSettle.
	Settle time.Duration
	// MaxLag is how many entries a replica's applied index may trail its
	// leader's commit index and still count as caught up; zero means
	// DefaultMaxLag.
	MaxLag uint64
	// PollInterval is the pause between observations; zero means
	// DefaultPollInterval.
	PollInterval time.Duration
	// Actor and Reason are sent with every admin mutation
	// (x-ursula-actor, x-ursula-reason) and recorded in the node's audit
	// trail as asserted, not verified.
	Actor  string
	Reason string
	// HTTP is the client for every request; nil means a fresh one.
	HTTP *http.Client
	// Hooks are test seams.
	Hooks Hooks
}

// Controller runs ursulactl's operations against the nodes of a manifest.
type Controller struct {
	m       *Manifest
	opts    Options
	out     io.Writer
	clients map[uint64]*nodeClient
	ownHTTP bool
}

// Close closes the idle connections of the HTTP client the controller
// made (not one given in Options.HTTP). It is idempotent.
func (c *Controller) Close() {
	if c.ownHTTP {
		c.opts.HTTP.CloseIdleConnections()
	}
}

// New returns a Controller for the manifest's nodes. It sends nothing.
func New(m *Manifest, opts Options) (*Controller, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Settle <= 0 {
		opts.Settle = DefaultSettle
	}
	if opts.MaxLag == 0 {
		opts.MaxLag = DefaultMaxLag
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	ownHTTP := opts.HTTP == nil
	if ownHTTP {
		tr := &http.Transport{
			Proxy:               nil, // admin planes are loopback or tunnels: never a system proxy
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
		}
		if m.CAFile != "" {
			src, err := pki.Load(pki.Files{CAFile: m.CAFile}, nil)
			if err != nil {
				return nil, fmt.Errorf("manifest ca_file: %w", err)
			}
			tr.TLSClientConfig = src.ClientConfig(pki.ExpectAnyNode)
		}
		opts.HTTP = &http.Client{Transport: tr}
	}
	c := &Controller{m: m, opts: opts, out: opts.Out, clients: map[uint64]*nodeClient{}, ownHTTP: ownHTTP}
	if c.out == nil {
		c.out = io.Discard
	}
	if c.opts.Now == nil {
		c.opts.Now = time.Now
	}
	for _, n := range m.Nodes {
		c.clients[n.ID] = &nodeClient{node: n, http: opts.HTTP, actor: opts.Actor, reason: opts.Reason}
	}
	return c, nil
}

// Manifest is the controller's manifest.
func (c *Controller) Manifest() *Manifest { return c.m }

// now is the clock of progress lines.
func (c *Controller) now() time.Time { return c.opts.Now() }

// confirm asks Options.Confirm, when set.
func (c *Controller) confirm(ctx context.Context, cf Confirmation) error {
	if c.opts.Confirm == nil {
		return nil
	}
	return c.opts.Confirm(ctx, cf)
}

func (c *Controller) printf(format string, args ...any) {
	fmt.Fprintf(c.out, format+"\n", args...)
}

// client returns node id's client, or an error when the manifest does not
// list it.
func (c *Controller) client(id uint64) (*nodeClient, error) {
	if cl, ok := c.clients[id]; ok {
		return cl, nil
	}
	_, err := c.m.Node(id)
	return nil, err
}

// pin takes the process incarnation of node id from m, the one metrics
// read the operation makes of it, after checking that the answer comes
// from that node of this cluster; then it runs the Pinned hook.
func (c *Controller) pin(ctx context.Context, id uint64, m *Metrics) (*Pinned, error) {
	cl, err := c.client(id)
	if err != nil {
		return nil, err
	}
	if err := c.checkIdentity(id, m); err != nil {
		return nil, err
	}
	if m.ProcessIncarnation == "" {
		return nil, fmt.Errorf("node %d: /__ursula/metrics reports no process_incarnation", id)
	}
	p := &Pinned{client: cl, Incarnation: m.ProcessIncarnation}
	if h := c.opts.Hooks.Pinned; h != nil {
		if err := h(ctx, id); err != nil {
			return nil, fmt.Errorf("pinned hook of node %d: %w", id, err)
		}
	}
	return p, nil
}

// pinNode reads node id's metrics once and pins its incarnation.
func (c *Controller) pinNode(ctx context.Context, id uint64) (*Pinned, *Metrics, error) {
	cl, err := c.client(id)
	if err != nil {
		return nil, nil, err
	}
	m, err := cl.Metrics(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("node %d: %w", id, err)
	}
	p, err := c.pin(ctx, id, m)
	return p, m, err
}

// checkIdentity refuses metrics that another node, or a node of another
// cluster than the manifest's, answered.
func (c *Controller) checkIdentity(id uint64, m *Metrics) error {
	if m.NodeID != 0 && m.NodeID != id {
		return abortf("the client_url of node %d is served by node %d; fix the manifest", id, m.NodeID)
	}
	if c.m.ClusterID != "" && m.ClusterID != c.m.ClusterID {
		return abortf("node %d reports cluster_id %q, the manifest names %q", id, m.ClusterID, c.m.ClusterID)
	}
	return nil
}

// checkSameProcess stops an operation whose node restarted while it ran.
func checkSameProcess(p *Pinned, m *Metrics) error {
	if m.ProcessIncarnation != p.Incarnation {
		return abortf("node %d restarted during the operation (process incarnation %s, pinned %s); check the cluster and start again",
			p.Node().ID, m.ProcessIncarnation, p.Incarnation)
	}
	return nil
}

// withTimeout bounds one wait by Options.Timeout.
func (c *Controller) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// sleep waits one poll interval; false when ctx ended.
func (c *Controller) sleep(ctx context.Context) bool {
	t := time.NewTimer(c.opts.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
