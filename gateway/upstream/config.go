package upstream

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ursula/ursula/internal/pki"
)

// Defaults for Config.
const (
	DefaultRefreshInterval = time.Second
	DefaultDialTimeout     = 2 * time.Second
	DefaultMaxMessageBytes = 64 << 20
	DefaultRetryAfter      = time.Second
	// DefaultLeaderWait covers an election after a leader's loss, split
	// vote included: the nodes' election timeout is randomized in 1-2 s by
	// default, so a lost leader is noticed up to 2 s after its last
	// heartbeat, and a split vote costs one more timeout. (It was 2 s, less
	// than one unlucky election: a write then failed with 503 although a
	// leader was about to be known.)
	DefaultLeaderWait       = 5 * time.Second
	DefaultKeepaliveTime    = 10 * time.Second
	DefaultKeepaliveTimeout = 5 * time.Second
)

// Config configures the Router.
type Config struct {
	// Nodes are seed client-plane addresses (host:port) of storage nodes.
	// The router learns the whole cluster, and each group's leader, from any
	// of them; with one seed that reports a one-node cluster, every call goes
	// straight to that seed.
	Nodes []string `yaml:"nodes" toml:"nodes"`
	// RefreshInterval is how often cluster info (nodes and group leaders) is
	// polled from the nodes. A refresh also runs right after a NOT_LEADER
	// answer or a connection failure.
	RefreshInterval time.Duration `yaml:"refresh_interval" toml:"refresh_interval"`
	// DialTimeout bounds one connection attempt to a node and one cluster
	// info poll.
	DialTimeout time.Duration `yaml:"dial_timeout" toml:"dial_timeout"`
	// MaxMessageBytes is the largest gRPC message sent to or accepted from a
	// node, in bytes.
	MaxMessageBytes int `yaml:"max_message_bytes" toml:"max_message_bytes"`
	// RetryAfter is the retry_after_ms hint attached to the Unavailable
	// error returned when a group has no known leader (the gateway turns it
	// into a Retry-After header).
	RetryAfter time.Duration `yaml:"retry_after" toml:"retry_after"`
	// LeaderWait is how long a call that finds no known leader for its
	// group (an election, a leadership handoff in flight) waits for one,
	// polling the nodes, before it fails Unavailable.
	LeaderWait time.Duration `yaml:"leader_wait" toml:"leader_wait"`
	// KeepaliveTime is the interval of client keepalive pings on node
	// connections (gRPC raises values below 10s to 10s; nodes accept pings
	// every 5s or slower).
	KeepaliveTime time.Duration `yaml:"keepalive_time" toml:"keepalive_time"`
	// KeepaliveTimeout is how long a keepalive ping may go unanswered before
	// the connection is considered dead.
	KeepaliveTimeout time.Duration `yaml:"keepalive_timeout" toml:"keepalive_timeout"`
	// ClientPlane is how this process proves itself to the nodes (TLS with
	// a role certificate, a bearer token); empty dials plaintext and
	// anonymously.
	pki.ClientPlane
}

// RegisterFlags registers the upstream flags on fs with "upstream."
// prefixes, using the current values of c as defaults. Zero values are
// replaced by the package defaults first.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.applyDefaults()
	fs.Func("upstream.nodes", "comma-separated client-plane addresses of storage nodes (seeds; the rest of the cluster is learned)", func(v string) error {
		c.Nodes = nil
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.Nodes = append(c.Nodes, a)
			}
		}
		return nil
	})
	fs.DurationVar(&c.RefreshInterval, "upstream.refresh_interval", c.RefreshInterval, "How often cluster info and group leaders are polled from the nodes.")
	fs.DurationVar(&c.DialTimeout, "upstream.dial_timeout", c.DialTimeout, "Bound on one connection attempt and one cluster info poll.")
	fs.IntVar(&c.MaxMessageBytes, "upstream.max_message_bytes", c.MaxMessageBytes, "Largest gRPC message exchanged with a node, in bytes.")
	fs.DurationVar(&c.RetryAfter, "upstream.retry_after", c.RetryAfter, "Retry-After hint when a group has no known leader.")
	fs.DurationVar(&c.LeaderWait, "upstream.leader_wait", c.LeaderWait, "How long a call waits for its group's leader to be known (an election or handoff in flight) before failing with 503.")
	fs.DurationVar(&c.KeepaliveTime, "upstream.keepalive_time", c.KeepaliveTime, "Interval of keepalive pings on node connections.")
	fs.DurationVar(&c.KeepaliveTimeout, "upstream.keepalive_timeout", c.KeepaliveTimeout, "How long a keepalive ping may go unanswered.")
	fs.StringVar(&c.TLS.CAFile, "upstream.tls.ca_file", c.TLS.CAFile, "Dial the nodes over TLS: PEM bundle of the CA their certificates chain to.")
	fs.StringVar(&c.TLS.CertFile, "upstream.tls.cert_file", c.TLS.CertFile, "This process's PEM certificate (proving its role) for the nodes.")
	fs.StringVar(&c.TLS.KeyFile, "upstream.tls.key_file", c.TLS.KeyFile, "This process's PEM key (mode 600).")
	fs.StringVar(&c.TokenFile, "upstream.token_file", c.TokenFile, "File holding this process's bearer token for the nodes (mode 600).")
}

// applyDefaults fills zero fields with the package defaults.
func (c *Config) applyDefaults() {
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.LeaderWait == 0 {
		c.LeaderWait = DefaultLeaderWait
	}
	if c.KeepaliveTime == 0 {
		c.KeepaliveTime = DefaultKeepaliveTime
	}
	if c.KeepaliveTimeout == 0 {
		c.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
}

// Validate reports every invalid field. Zero fields are valid: they take
// the defaults.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Nodes) == 0 {
		errs = append(errs, errors.New("upstream: nodes must name at least one storage node"))
	}
	if err := c.ClientPlane.Validate("upstream"); err != nil {
		errs = append(errs, err)
	}
	for _, a := range c.Nodes {
		if strings.TrimSpace(a) == "" {
			errs = append(errs, errors.New("upstream: nodes must not contain an empty address"))
			break
		}
	}
	durations := []struct {
		name string
		v    time.Duration
	}{
		{"refresh_interval", c.RefreshInterval},
		{"dial_timeout", c.DialTimeout},
		{"retry_after", c.RetryAfter},
		{"leader_wait", c.LeaderWait},
		{"keepalive_time", c.KeepaliveTime},
		{"keepalive_timeout", c.KeepaliveTimeout},
	}
	for _, d := range durations {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("upstream: %s %v must not be negative", d.name, d.v))
		}
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("upstream: max_message_bytes %d must not be negative", c.MaxMessageBytes))
	}
	return errors.Join(errs...)
}
