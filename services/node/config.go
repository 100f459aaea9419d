package node

import (
	"errors"
	"flag"
	"fmt"
	"net"

	"github.com/ursula/ursula/services/platform/httpserver"
)

// ErrInflightBodyBudgetTooSmall refuses a start whose in-flight
// request-body budget (server.http_inflight_body_size) cannot hold what it
// must: two of the largest request bodies for a node with a cold backend
// (64 MiB), and one for a gateway.
var ErrInflightBodyBudgetTooSmall = errors.New("InflightBodyBudgetTooSmall")

// Config configures a node's listeners.
type Config struct {
	// Listen is the client plane: StreamService gRPC plus HTTP
	// /__ursula/{metrics,ready}.
	Listen string `toml:"listen"`
	// AdminListen is the admin plane; it must be a loopback address unless
	// AllowNonLoopbackAdmin is set.
	AdminListen string `toml:"admin_listen"`
	// ClusterListen is the cluster plane (Raft transport, probes, shed
	// state); peers dial it at their [[raft.peers]] cluster_url.
	ClusterListen string `toml:"cluster_listen"`
	// AllowNonLoopbackAdmin permits a non-loopback admin address.
	AllowNonLoopbackAdmin bool `toml:"allow_non_loopback_admin"`
	// AdminTokenFile, when set, names a file holding the admin plane's
	// bearer token: every admin request must then carry "Authorization:
	// Bearer <token>" (else 401). The file must be a regular file (not a
	// symlink), not readable or writable by group or others, and hold one
	// token of at least 32 bytes with no CR, NUL, other control character,
	// inner newline or surrounding blank (one trailing newline allowed);
	// otherwise the node refuses to start. Empty leaves the admin plane
	// unauthenticated (a warning at startup).
	AdminTokenFile string `toml:"admin_token_file"`
	// ClusterID names the cluster; it is reported by readiness and metrics.
	ClusterID string `toml:"cluster_id"`
	// MaxMessageBytes bounds one gRPC message (appends up to the gateway's
	// body limit must fit).
	MaxMessageBytes int `toml:"max_message_bytes"`
	// HTTPInflightBodySize is the process's budget of request-body bytes
	// held in memory at once: the gateway of this process (all-in-one or
	// ursula-gateway) reads request bodies in pieces charged against it as
	// they arrive and answers 503 OVERLOADED with Retry-After when the next
	// piece does not fit. A node with a cold backend needs at least 64 MiB
	// (two of the largest bodies) or refuses to start with
	// InflightBodyBudgetTooSmall. Default (and zero) 128 MiB.
	HTTPInflightBodySize int64 `toml:"http_inflight_body_size"`
	// HTTP holds the timeouts of the node's HTTP servers (the client
	// plane's HTTP side, the admin plane, the cluster plane's HTTP side):
	// read_header_timeout, body_read_timeout, write_timeout, idle_timeout,
	// max_header_bytes (services/platform/httpserver).
	HTTP httpserver.Config `toml:"http"`
}

// RegisterFlags registers the node's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet, defaultListen, defaultClusterListen string) {
	fs.StringVar(&c.Listen, "node.listen", defaultListen, "client plane address (gRPC + HTTP)")
	fs.StringVar(&c.ClusterListen, "cluster.listen", defaultClusterListen, "cluster plane address (Raft transport)")
	fs.StringVar(&c.AdminListen, "admin.listen", "127.0.0.1:4438", "admin plane address (loopback only)")
	fs.BoolVar(&c.AllowNonLoopbackAdmin, "admin.allow-non-loopback", false, "allow a non-loopback admin address")
	fs.StringVar(&c.AdminTokenFile, "admin.token-file", "", "file holding the admin plane's bearer token (mode 600, one token of at least 32 bytes); empty: unauthenticated")
	fs.StringVar(&c.ClusterID, "server.cluster-id", "local", "cluster id")
	fs.IntVar(&c.MaxMessageBytes, "node.max-message-bytes", 64<<20, "maximum gRPC message size")
	fs.Int64Var(&c.HTTPInflightBodySize, "server.http-inflight-body-size", httpserver.DefaultInflightBodyBytes,
		"bytes of HTTP request bodies the process holds at once (at least 64 MiB on a node with a cold backend); beyond it requests get 503")
	c.HTTP.RegisterFlags(fs, "server.http.")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("node.listen %q: %w", c.Listen, err))
	}
	if c.AdminListen != "" {
		host, _, err := net.SplitHostPort(c.AdminListen)
		if err != nil {
			errs = append(errs, fmt.Errorf("admin.listen %q: %w", c.AdminListen, err))
		} else if !c.AllowNonLoopbackAdmin && !isLoopback(host) {
			errs = append(errs, fmt.Errorf("admin.listen %q is not a loopback address (set allow_non_loopback_admin to override)", c.AdminListen))
		}
	}
	if _, err := loadAdminToken(c.AdminTokenFile); err != nil {
		errs = append(errs, err)
	}
	if c.ClusterID == "" {
		errs = append(errs, errors.New("server.cluster_id is empty"))
	}
	if c.MaxMessageBytes < 1<<20 {
		errs = append(errs, errors.New("node.max_message_bytes must be at least 1 MiB"))
	}
	// Every node has a cold backend (objstore: fs, s3 or memory).
	if n := c.InflightBodySize(); n < httpserver.MinInflightBodyBytesColdBackend {
		errs = append(errs, fmt.Errorf("%w: server.http_inflight_body_size %d is below %d, what a node with a cold backend needs",
			ErrInflightBodyBudgetTooSmall, n, httpserver.MinInflightBodyBytesColdBackend))
	}
	if err := c.HTTP.Validate("server.http"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// InflightBodySize is HTTPInflightBodySize with the default for zero.
func (c Config) InflightBodySize() int64 {
	if c.HTTPInflightBodySize == 0 {
		return httpserver.DefaultInflightBodyBytes
	}
	return c.HTTPInflightBodySize
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
