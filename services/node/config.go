package node

import (
	"errors"
	"flag"
	"fmt"
	"net"
)

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
	return errors.Join(errs...)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
