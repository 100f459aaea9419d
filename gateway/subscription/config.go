package subscription

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/ursula/ursula/services/platform/httpserver"
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
	// AllowPrivateWebhooks permits webhook URLs that resolve to private
	// addresses (RFC 1918, unique-local fc00::/7, carrier-grade NAT
	// 100.64.0.0/10, site-local), and plain http to any host. Loopback,
	// link-local (cloud metadata), unspecified, multicast and the other
	// special-purpose ranges stay refused unless AllowWebhookHosts lists
	// them. Default false.
	AllowPrivateWebhooks bool `toml:"allow_private_webhooks" yaml:"allow_private_webhooks"`
	// AllowWebhookHosts lists webhook destinations admitted despite the
	// address checks, for development and private deployments: CIDR
	// prefixes or addresses ("127.0.0.0/8", "::1", "10.1.0.0/16"), matched
	// against every address a delivery actually dials, and host names
	// ("localhost", "hooks.internal"), whose every address is admitted. A
	// listed destination may use plain http. Empty by default: webhooks to
	// loopback, private, link-local, unspecified, multicast, carrier-grade
	// NAT, unique-local and other special-purpose addresses (IPv4-mapped,
	// NAT64 and 6to4 forms included), and to names resolving to them at
	// delivery time, are refused.
	AllowWebhookHosts []string `toml:"allow_webhook_hosts" yaml:"allow_webhook_hosts"`
	// MaxSubscriptions bounds the subscriptions in all (they all live in
	// the data bucket, so this is also the bound per bucket); a create past
	// it answers 429 LIMIT_EXCEEDED. Default 10000.
	MaxSubscriptions int `toml:"max_subscriptions" yaml:"max_subscriptions"`
	// MaxSubscriptionsPerStream bounds the subscriptions that link one
	// stream explicitly (429 LIMIT_EXCEEDED past it). Default 100.
	MaxSubscriptionsPerStream int `toml:"max_subscriptions_per_stream" yaml:"max_subscriptions_per_stream"`
	// MaxStreamsPerSubscription bounds the streams one subscription links
	// explicitly (429 LIMIT_EXCEEDED past it). Default 1000.
	MaxStreamsPerSubscription int `toml:"max_streams_per_subscription" yaml:"max_streams_per_subscription"`
	// BodyBudget is the process's in-flight request-body budget, which
	// request bodies of the subscription APIs are charged against; nil
	// makes one of its own. Set by the application.
	BodyBudget *httpserver.Budget `toml:"-" yaml:"-"`
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

		MaxSubscriptions:          10000,
		MaxSubscriptionsPerStream: 100,
		MaxStreamsPerSubscription: 1000,
	}
}

// RegisterFlags registers the subscription flags, named by their keys in
// the [subscriptions] section, with the defaults of DefaultConfig
// (stream_root excepted: empty means the gateway's).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := DefaultConfig()
	fs.StringVar(&c.StreamRoot, "subscriptions.stream_root", "", "URL path prefix of the Durable Streams the manager serves under __ds/ (empty: gateway.stream_root)")
	fs.StringVar(&c.PublicURL, "subscriptions.public_url", "", "origin of callback_url and jwks_url, e.g. https://streams.example.com (empty: from the request)")
	fs.BoolVar(&c.AllowPrivateWebhooks, "subscriptions.allow_private_webhooks", false, "allow webhooks to private addresses (RFC 1918, fc00::/7, 100.64.0.0/10) and plain http")
	fs.Func("subscriptions.allow_webhook_hosts", "comma-separated CIDR prefixes, addresses and host names webhooks may be delivered to despite the address checks, e.g. 127.0.0.0/8,::1,localhost (development)", func(v string) error {
		c.AllowWebhookHosts = nil
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.AllowWebhookHosts = append(c.AllowWebhookHosts, e)
			}
		}
		return nil
	})
	fs.IntVar(&c.MaxSubscriptions, "subscriptions.max_subscriptions", d.MaxSubscriptions, "subscriptions in all")
	fs.IntVar(&c.MaxSubscriptionsPerStream, "subscriptions.max_subscriptions_per_stream", d.MaxSubscriptionsPerStream, "subscriptions linking one stream explicitly")
	fs.IntVar(&c.MaxStreamsPerSubscription, "subscriptions.max_streams_per_subscription", d.MaxStreamsPerSubscription, "streams one subscription links explicitly")
	fs.StringVar(&c.KeyFile, "subscriptions.key_file", "", "PEM Ed25519 key that signs webhooks, created (mode 600) when missing (empty: an ephemeral key)")
	fs.StringVar(&c.DataBucket, "subscriptions.data_bucket", d.DataBucket, "bucket holding the Durable Streams")
	fs.StringVar(&c.StateBucket, "subscriptions.state_bucket", d.StateBucket, "bucket of the stream persisting subscription state")
	fs.StringVar(&c.StateStream, "subscriptions.state_stream", d.StateStream, "stream persisting subscription state")
	fs.IntVar(&c.DeliveryWorkers, "subscriptions.delivery_workers", d.DeliveryWorkers, "goroutines that POST webhooks and expire leases")
	fs.DurationVar(&c.DeliveryTimeout, "subscriptions.delivery_timeout", d.DeliveryTimeout, "bound on one webhook POST")
	fs.DurationVar(&c.RetryInitialBackoff, "subscriptions.retry_initial_backoff", d.RetryInitialBackoff, "delay before the first webhook retry (doubled on each further one)")
	fs.DurationVar(&c.RetryMaxBackoff, "subscriptions.retry_max_backoff", d.RetryMaxBackoff, "largest webhook retry delay")
	fs.Float64Var(&c.RetryJitter, "subscriptions.retry_jitter", d.RetryJitter, "relative jitter of each retry delay (0.2 = ±20 %)")
	fs.IntVar(&c.MaxDeliveryAttempts, "subscriptions.max_delivery_attempts", d.MaxDeliveryAttempts, "webhook POSTs for one wake before it is dropped")
	fs.DurationVar(&c.TickInterval, "subscriptions.tick_interval", d.TickInterval, "how often due retries and expired leases are checked")
	fs.IntVar(&c.MaxTrackedStreams, "subscriptions.max_tracked_streams", d.MaxTrackedStreams, "streams remembered for linking new glob subscriptions")
	fs.DurationVar(&c.StorageTimeout, "subscriptions.storage_timeout", d.StorageTimeout, "bound on one storage call")
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
	if c.MaxSubscriptions == 0 {
		c.MaxSubscriptions = d.MaxSubscriptions
	}
	if c.MaxSubscriptionsPerStream == 0 {
		c.MaxSubscriptionsPerStream = d.MaxSubscriptionsPerStream
	}
	if c.MaxStreamsPerSubscription == 0 {
		c.MaxStreamsPerSubscription = d.MaxStreamsPerSubscription
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
	if c.MaxSubscriptions < 0 || c.MaxSubscriptionsPerStream < 0 || c.MaxStreamsPerSubscription < 0 {
		errs = append(errs, errors.New("max_subscriptions, max_subscriptions_per_stream and max_streams_per_subscription must not be negative"))
	}
	if _, err := newAddressPolicy(c.AllowPrivateWebhooks, c.AllowWebhookHosts); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("subscription config: %w", err)
	}
	return nil
}
