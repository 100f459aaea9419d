package gateway

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ursula/ursula/services/platform/httpserver"
)

// Defaults for Config.
const (
	DefaultListen               = "127.0.0.1:4437"
	DefaultStreamRoot           = "/v1/stream/"
	DefaultLongPollTimeout      = 3 * time.Second
	DefaultSSEReconnectInterval = 60 * time.Second
	DefaultMaxBodyBytes         = 32 << 20
	DefaultReadChunkBytes       = 1 << 20
	DefaultStatusPage           = StatusPageLoopback
	DefaultMaxConnections       = 16384
)

// Values of Config.StatusPage.
const (
	// StatusPageOff serves no status page (404).
	StatusPageOff = "off"
	// StatusPageLoopback serves it to clients that connect from a
	// loopback address, name a loopback host and carry no forwarding
	// header (a proxy in front would otherwise hand it to everyone).
	StatusPageLoopback = "loopback"
	// StatusPageOn serves it to every client that reaches the listener.
	StatusPageOn = "on"
)

// Config configures the gateway.
type Config struct {
	// Listen is the HTTP listen address.
	Listen string `yaml:"listen" toml:"listen"`
	// StreamRoot is the path prefix of the Durable Streams URL family; it must
	// start and end with "/". The rest of the path names the stream.
	StreamRoot string `yaml:"stream_root" toml:"stream_root"`
	// LongPollTimeout is how long a long-poll read waits at the tail before
	// answering 204.
	LongPollTimeout time.Duration `yaml:"long_poll_timeout" toml:"long_poll_timeout"`
	// SSEReconnectInterval ends SSE connections after this long so that
	// clients reconnect (and CDNs can collapse them).
	SSEReconnectInterval time.Duration `yaml:"sse_reconnect_interval" toml:"sse_reconnect_interval"`
	// MaxBodyBytes is the largest request body accepted (appends, creates,
	// append batches, snapshots and staged snapshot parts); larger ones get
	// 413. At most 33554432 (32 MiB, the seed's --max-request-body-bytes
	// bound): a gateway configured above it refuses to start, and larger
	// snapshots go up in parts.
	MaxBodyBytes int64 `yaml:"max_body_bytes" toml:"max_body_bytes"`
	// ReadChunkBytes bounds the data returned by one catch-up read (clients
	// paginate with Stream-Next-Offset).
	ReadChunkBytes int64 `yaml:"read_chunk_bytes" toml:"read_chunk_bytes"`
	// MaxConnections is the most client connections the gateway holds at
	// once (kept-alive, long-polling and SSE ones included); one accepted
	// beyond it is answered 503 OVERLOADED and closed. Each costs a
	// goroutine and its buffers (about 10-20 KiB idle), so the cap bounds
	// what clients alone can make the process hold.
	MaxConnections int `yaml:"max_connections" toml:"max_connections"`
	// HTTP holds the HTTP server's timeouts: read_header_timeout,
	// body_read_timeout (request-body progress), write_timeout (progress
	// of each response write), idle_timeout and max_header_bytes (see
	// services/platform/httpserver).
	HTTP httpserver.Config `yaml:"http" toml:"http"`
	// BodyBudget is the process's in-flight request-body budget
	// (server.http_inflight_body_size); nil makes one of
	// httpserver.DefaultInflightBodyBytes. Set by the application.
	BodyBudget *httpserver.Budget `yaml:"-" toml:"-"`
	// Subscriptions serves the reserved subscription APIs under
	// "<StreamRoot>__ds/"; nil answers 404. Set by the application.
	Subscriptions http.Handler `yaml:"-" toml:"-"`
	// Observer is told about successful creates, writes and deletes of
	// streams in the Durable Streams family; nil means none. Set by the
	// application.
	Observer StreamObserver `yaml:"-" toml:"-"`
	// Prometheus serves GET /__ursula/prometheus (the process's metrics in
	// the Prometheus text format); nil answers 404. Set by the application.
	Prometheus http.Handler `yaml:"-" toml:"-"`
	// StatusPage says who may open the cluster status page
	// (/__ursula/ui/) on this listener, which shows the cluster's
	// internals (nodes, addresses, groups, readiness): "off", "loopback"
	// (the default: clients connecting from a loopback address that name a
	// loopback host and carry no Forwarded or X-Forwarded-For header) or
	// "on" (every client: put an authenticating proxy in front).
	StatusPage string `yaml:"status_page" toml:"status_page"`
	// StatusUI serves the status page; nil answers 404. Set by the
	// application.
	StatusUI http.Handler `yaml:"-" toml:"-"`
	// PprofListen, when set, is a loopback address where the process
	// serves its Go profiles (/debug/pprof/) on a listener of its own,
	// never on Listen; empty (the default) serves none.
	PprofListen string `yaml:"pprof_listen" toml:"pprof_listen"`
}

// RegisterFlags registers the gateway flags on fs with "gateway." prefixes,
// using the current values of c as defaults. Zero values are replaced by the
// package defaults first.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.applyDefaults()
	fs.StringVar(&c.Listen, "gateway.listen", c.Listen, "HTTP listen address of the gateway.")
	fs.StringVar(&c.StreamRoot, "gateway.stream_root", c.StreamRoot, "Path prefix of the Durable Streams URL family.")
	fs.DurationVar(&c.LongPollTimeout, "gateway.long_poll_timeout", c.LongPollTimeout, "How long a long-poll read waits at the tail before answering 204.")
	fs.DurationVar(&c.SSEReconnectInterval, "gateway.sse_reconnect_interval", c.SSEReconnectInterval, "SSE connections are ended after this long.")
	fs.Int64Var(&c.MaxBodyBytes, "gateway.max_body_bytes", c.MaxBodyBytes, "Largest accepted request body in bytes (larger gets 413).")
	fs.Int64Var(&c.ReadChunkBytes, "gateway.read_chunk_bytes", c.ReadChunkBytes, "Largest data returned by one catch-up read in bytes.")
	fs.IntVar(&c.MaxConnections, "gateway.max_connections", c.MaxConnections, "Most client connections held at once (SSE and long-polls included); one beyond it gets 503 and is closed.")
	fs.StringVar(&c.StatusPage, "gateway.status_page", c.StatusPage, `Who may open the cluster status page /__ursula/ui/: "off", "loopback" (clients on this host) or "on" (everyone).`)
	fs.StringVar(&c.PprofListen, "gateway.pprof_listen", c.PprofListen, "Loopback address (host:port) where the process serves /debug/pprof/; empty: none.")
	c.HTTP.RegisterFlags(fs, "gateway.http.")
}

// applyDefaults fills zero fields with the package defaults.
func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.StreamRoot == "" {
		c.StreamRoot = DefaultStreamRoot
	}
	if c.LongPollTimeout == 0 {
		c.LongPollTimeout = DefaultLongPollTimeout
	}
	if c.SSEReconnectInterval == 0 {
		c.SSEReconnectInterval = DefaultSSEReconnectInterval
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ReadChunkBytes == 0 {
		c.ReadChunkBytes = DefaultReadChunkBytes
	}
	if c.StatusPage == "" {
		c.StatusPage = DefaultStatusPage
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	c.HTTP.ApplyDefaults()
}

// Validate reports the first invalid field. Zero fields are valid: they take
// the defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.StreamRoot != "" {
		if !strings.HasPrefix(c.StreamRoot, "/") || !strings.HasSuffix(c.StreamRoot, "/") || len(c.StreamRoot) < 2 {
			errs = append(errs, fmt.Errorf("gateway: stream_root %q must start and end with \"/\" and not be \"/\"", c.StreamRoot))
		} else if strings.HasPrefix(c.StreamRoot, "/__ursula/") {
			errs = append(errs, fmt.Errorf("gateway: stream_root %q is reserved", c.StreamRoot))
		}
	}
	if c.LongPollTimeout < 0 {
		errs = append(errs, fmt.Errorf("gateway: long_poll_timeout %v must not be negative", c.LongPollTimeout))
	}
	if c.SSEReconnectInterval < 0 {
		errs = append(errs, fmt.Errorf("gateway: sse_reconnect_interval %v must not be negative", c.SSEReconnectInterval))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("gateway: max_body_bytes %d must not be negative", c.MaxBodyBytes))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("gateway: max_connections %d must not be negative", c.MaxConnections))
	}
	if c.MaxBodyBytes > httpserver.MaxRequestBodyBytes {
		errs = append(errs, fmt.Errorf("gateway: max_body_bytes %d is above %d: larger snapshots go up in parts", c.MaxBodyBytes, httpserver.MaxRequestBodyBytes))
	}
	if err := c.HTTP.Validate("gateway.http"); err != nil {
		errs = append(errs, fmt.Errorf("gateway: %w", err))
	}
	if c.PprofListen != "" {
		host, _, err := net.SplitHostPort(c.PprofListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			errs = append(errs, fmt.Errorf("gateway: pprof_listen %q must be a loopback IP address and port", c.PprofListen))
		}
	}
	if c.ReadChunkBytes < 0 {
		errs = append(errs, fmt.Errorf("gateway: read_chunk_bytes %d must not be negative", c.ReadChunkBytes))
	}
	switch c.StatusPage {
	case "", StatusPageOff, StatusPageLoopback, StatusPageOn:
	default:
		errs = append(errs, fmt.Errorf("gateway: status_page %q must be %q, %q or %q", c.StatusPage, StatusPageOff, StatusPageLoopback, StatusPageOn))
	}
	return errors.Join(errs...)
}
