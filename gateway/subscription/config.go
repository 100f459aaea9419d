package subscription

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Config configures the subscription manager. Zero values take the defaults
// documented on each field (see DefaultConfig).
type Config struct {
	// StreamRoot is the URL path under which Durable Streams are served. The
	// manager owns every path below StreamRoot + "__ds/". Default "/v1/stream/".
	StreamRoot string `toml:"stream_root" yaml:"stream_root"`
	// PublicURL, when set (e.g. "https://streams.example.com"), is the origin
	// used to build callback_url and jwks_url. When empty the origin comes
	// from the incoming request (X-Forwarded-Proto / X-Forwarded-Host
	// honoured).
	PublicURL string `toml:"public_url" yaml:"public_url"`
	// AllowPrivateWebhooks permits webhook URLs that resolve to RFC 1918,
	// unique-local, link-local or carrier-grade NAT addresses, and plain
	// http to any host. Loopback (http://localhost, http://127.0.0.1) is
	// always allowed for development. Default false.
	AllowPrivateWebhooks bool `toml:"allow_private_webhooks" yaml:"allow_private_webhooks"`
	// KeyFile is the path of the PEM (PKCS #8) Ed25519 key that signs
	// webhooks. It is generated and saved with mode 0600 when missing. Empty
	// means an ephemeral key that changes on every start.
	KeyFile string `toml:"key_file" yaml:"key_file"`
	// DataBucket is the bucket holding Durable Streams (family 1). Default "__ds".
	DataBucket string `toml:"data_bucket" yaml:"data_bucket"`
	// StateBucket and StateStream name the internal JSON stream where
	// subscription definitions, links and acked offsets are persisted.
	// Defaults "__system" and "subscriptions".
	StateBucket string `toml:"state_bucket" yaml:"state_bucket"`
	StateStream string `toml:"state_stream" yaml:"state_stream"`
	// DeliveryWorkers is the number of goroutines that POST webhooks and
	// expire leases. Default 4.
	DeliveryWorkers int `toml:"delivery_workers" yaml:"delivery_workers"`
	// DeliveryTimeout bounds one webhook POST. Default 10s.
	DeliveryTimeout time.Duration `toml:"delivery_timeout" yaml:"delivery_timeout"`
	// RetryInitialBackoff is the delay before the first webhook retry; each
	// further retry doubles it. Default 1s.
	RetryInitialBackoff time.Duration `toml:"retry_initial_backoff" yaml:"retry_initial_backoff"`
	// RetryMaxBackoff caps the retry delay. Default 60s.
	RetryMaxBackoff time.Duration `toml:"retry_max_backoff" yaml:"retry_max_backoff"`
	// RetryJitter is the relative jitter applied to each retry delay
	// (0.2 = ±20 %). Default 0.2.
	RetryJitter float64 `toml:"retry_jitter" yaml:"retry_jitter"`
	// MaxDeliveryAttempts bounds the POSTs for one wake. When they are
	// exhausted the wake is dropped and the subscription stays "failed"
	// until a later write starts a new wake. Default 15.
	MaxDeliveryAttempts int `toml:"max_delivery_attempts" yaml:"max_delivery_attempts"`
	// TickInterval is how often due retries and expired leases are checked.
	// Default 100ms.
	TickInterval time.Duration `toml:"tick_interval" yaml:"tick_interval"`
	// MaxTrackedStreams bounds the in-memory set of streams seen through the
	// observer hooks; a new glob subscription links those that match at
	// their current tail. Default 10000.
	MaxTrackedStreams int `toml:"max_tracked_streams" yaml:"max_tracked_streams"`
	// StorageTimeout bounds one StreamService call. Default 5s.
	StorageTimeout time.Duration `toml:"storage_timeout" yaml:"storage_timeout"`
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{
		StreamRoot:          "/v1/stream/",
		DataBucket:          "__ds",
		StateBucket:         "__system",
		StateStream:         "subscriptions",
		DeliveryWorkers:     4,
		DeliveryTimeout:     10 * time.Second,
		RetryInitialBackoff: time.Second,
		RetryMaxBackoff:     60 * time.Second,
		RetryJitter:         0.2,
		MaxDeliveryAttempts: 15,
		TickInterval:        100 * time.Millisecond,
		MaxTrackedStreams:   10000,
		StorageTimeout:      5 * time.Second,
	}
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.StreamRoot == "" {
		c.StreamRoot = d.StreamRoot
	}
	if c.DataBucket == "" {
		c.DataBucket = d.DataBucket
	}
	if c.StateBucket == "" {
		c.StateBucket = d.StateBucket
	}
	if c.StateStream == "" {
		c.StateStream = d.StateStream
	}
	if c.DeliveryWorkers == 0 {
		c.DeliveryWorkers = d.DeliveryWorkers
	}
	if c.DeliveryTimeout == 0 {
		c.DeliveryTimeout = d.DeliveryTimeout
	}
	if c.RetryInitialBackoff == 0 {
		c.RetryInitialBackoff = d.RetryInitialBackoff
	}
	if c.RetryMaxBackoff == 0 {
		c.RetryMaxBackoff = d.RetryMaxBackoff
	}
	if c.RetryJitter == 0 {
		c.RetryJitter = d.RetryJitter
	}
	if c.MaxDeliveryAttempts == 0 {
		c.MaxDeliveryAttempts = d.MaxDeliveryAttempts
	}
	if c.TickInterval == 0 {
		c.TickInterval = d.TickInterval
	}
	if c.MaxTrackedStreams == 0 {
		c.MaxTrackedStreams = d.MaxTrackedStreams
	}
	if c.StorageTimeout == 0 {
		c.StorageTimeout = d.StorageTimeout
	}
	if !strings.HasSuffix(c.StreamRoot, "/") {
		c.StreamRoot += "/"
	}
	return c
}

// Validate reports the first invalid field, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if !strings.HasPrefix(c.StreamRoot, "/") {
		errs = append(errs, fmt.Errorf("stream_root %q must start with /", c.StreamRoot))
	}
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("public_url %q must be an absolute http(s) URL", c.PublicURL))
		}
	}
	if c.DeliveryWorkers < 1 {
		errs = append(errs, errors.New("delivery_workers must be at least 1"))
	}
	if c.DeliveryTimeout < 0 || c.RetryInitialBackoff < 0 || c.RetryMaxBackoff < 0 || c.TickInterval < 0 || c.StorageTimeout < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.RetryMaxBackoff < c.RetryInitialBackoff {
		errs = append(errs, errors.New("retry_max_backoff must be at least retry_initial_backoff"))
	}
	if c.RetryJitter < 0 || c.RetryJitter >= 1 {
		errs = append(errs, errors.New("retry_jitter must be in [0, 1)"))
	}
	if c.MaxDeliveryAttempts < 1 {
		errs = append(errs, errors.New("max_delivery_attempts must be at least 1"))
	}
	if c.MaxTrackedStreams < 0 {
		errs = append(errs, errors.New("max_tracked_streams must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("subscription config: %w", err)
	}
	return nil
}
