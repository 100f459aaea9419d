package node

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"

	"github.com/ursula/ursula/internal/pki"
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
	// MetricsListen, when set (":4440"), serves the process's metrics to
	// a remote Prometheus on a plane that carries no mutation: GET
	// /__ursula/prometheus, /__ursula/metrics and /__ursula/ready, nothing
	// else (see metricsHandler). The coldgc target serves its worker's
	// /__ursula/prometheus and /__ursula/ready there, its only listener.
	// Empty: off.
	MetricsListen string `toml:"metrics_listen"`
	// AllowNonLoopbackAdmin permits a non-loopback admin address.
	AllowNonLoopbackAdmin bool `toml:"allow_non_loopback_admin"`
	// AdminTokenFile names the file holding the admin plane's bearer
	// token: every mutation must carry "Authorization: Bearer <token>"
	// (else 401), and so must every request when the admin listener is not
	// loopback. The file must be a regular file (not a symlink) owned by
	// the server's user, not readable or writable by group or others, in a
	// directory group and others cannot write, and hold one token of at
	// least 32 bytes with no CR, NUL, other control character, inner
	// newline or surrounding blank (one trailing newline allowed);
	// otherwise the node refuses to start. Empty means
	// <raft.wal.path>/admin.token, created (mode 600, a random token) on first
	// start.
	AdminTokenFile string `toml:"admin_token_file"`
	// AdminTLS serves the admin plane over TLS (required on a non-loopback
	// admin listener); a client certificate of ca_file proving the
	// operator role (urn:ursula:role:operator) authenticates like the
	// token.
	AdminTLS pki.Files `toml:"admin_tls"`
	// AdminAllowedHosts are the Host header values (without port) the
	// admin plane answers besides localhost, loopback addresses and the
	// listener's own host: any other Host is refused (DNS rebinding).
	AdminAllowedHosts []string `toml:"admin_allowed_hosts"`
	// GRPCReflection serves gRPC server reflection (grpc.reflection.v1 and
	// v1alpha) on the client and admin planes, so that grpcurl and other
	// tools list and call their services without the .proto files:
	// "loopback" (the default; empty means it) serves it to callers
	// connected over a loopback address (every caller of a loopback
	// listener, those reaching a listener of every address such as ":4437"
	// through 127.0.0.1 or ::1), "on" to every caller, "off" to none.
	// Reflection asks for what the plane asks for: a caller the plane
	// would refuse is refused (docs/grpc.md).
	GRPCReflection string `toml:"grpc_reflection"`
	// AdminPprof serves the Go profiles (/debug/pprof/) on the admin
	// plane, behind the token.
	AdminPprof bool `toml:"admin_pprof"`
	// ClientTLS serves the client plane (gRPC and HTTP) over TLS with this
	// node's certificate; callers may present a client certificate of the
	// CA in ca_file proving a role (urn:ursula:role:<role>, package pki).
	ClientTLS pki.Files `toml:"client_tls"`
	// ClientTokenFile names a file of bearer tokens for client-plane gRPC
	// callers: one "<role> <token>" per line (roles gateway, coldgc,
	// backup, client), mode 600, re-read when it changes.
	ClientTokenFile string `toml:"client_token_file"`
	// AllowAnonymousClients lets callers that prove no role in (as clients:
	// the stream service on user buckets). Without ClientTLS and
	// ClientTokenFile every caller is anonymous, and then a client plane on
	// a non-loopback address requires this to be set explicitly.
	AllowAnonymousClients bool `toml:"allow_anonymous_clients"`
	// ClusterTLS is the cluster plane's mutual TLS: the cluster CA, and this
	// node's certificate (proving urn:ursula:node:<raft.node_id>) and key,
	// reloaded when the files change. A multi-node cluster requires it
	// unless InsecureClusterPlaintext is set.
	ClusterTLS pki.Files `toml:"cluster_tls"`
	// InsecureClusterPlaintext runs the cluster plane of a multi-node
	// cluster without TLS, where any process that reaches it can act as a
	// node: allowed only when the cluster listener and every peer's
	// cluster_url are loopback addresses (a development cluster on one
	// machine), with a warning at startup.
	InsecureClusterPlaintext bool `toml:"insecure_cluster_plaintext"`
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
	// MaxConnections is the most connections each of the node's planes
	// (client, admin, metrics, cluster) holds at once, each its own count
	// so that a flood of one cannot take the others' room: one accepted
	// beyond it is closed before its TLS handshake or first byte is read.
	// Zero means DefaultMaxConnections.
	MaxConnections int `toml:"max_connections"`
	// HTTP holds the timeouts of the node's HTTP servers (the client
	// plane's HTTP side, the admin plane, the cluster plane's HTTP side):
	// read_header_timeout, body_read_timeout, write_timeout, idle_timeout,
	// max_header_bytes (services/platform/httpserver).
	HTTP httpserver.Config `toml:"http"`
}

// RegisterFlags registers the node's flags, named by their keys in the
// [server] section.
func (c *Config) RegisterFlags(fs *flag.FlagSet, defaultListen, defaultClusterListen string) {
	fs.StringVar(&c.Listen, "server.listen", defaultListen, "client plane address (gRPC + HTTP)")
	fs.StringVar(&c.ClusterListen, "server.cluster_listen", defaultClusterListen, "cluster plane address (Raft transport)")
	fs.StringVar(&c.AdminListen, "server.admin_listen", "127.0.0.1:4438", "admin plane address (loopback only unless server.allow_non_loopback_admin)")
	fs.StringVar(&c.MetricsListen, "server.metrics_listen", "", "metrics plane address (read-only: GET /__ursula/prometheus, /__ursula/metrics, /__ursula/ready; the coldgc target serves /__ursula/prometheus and /__ursula/ready), e.g. :4440; empty: off")
	fs.BoolVar(&c.AllowNonLoopbackAdmin, "server.allow_non_loopback_admin", false, "allow a non-loopback admin address (requires server.admin_tls)")
	fs.StringVar(&c.AdminTokenFile, "server.admin_token_file", "", "file holding the admin plane's bearer token (mode 600, one token of at least 32 bytes); empty: <raft.wal.path>/admin.token, created on first start")
	fs.StringVar(&c.AdminTLS.CAFile, "server.admin_tls.ca_file", "", "admin plane: PEM bundle of the CA of operator client certificates")
	fs.StringVar(&c.AdminTLS.CertFile, "server.admin_tls.cert_file", "", "admin plane: PEM certificate (serves TLS; required on a non-loopback address)")
	fs.StringVar(&c.AdminTLS.KeyFile, "server.admin_tls.key_file", "", "admin plane: PEM key (mode 600)")
	fs.Func("server.admin_allowed_hosts", "comma-separated Host header values (without port) the admin plane answers besides localhost, loopback addresses and its own host", func(v string) error {
		c.AdminAllowedHosts = splitList(v)
		return nil
	})
	fs.StringVar(&c.GRPCReflection, "server.grpc_reflection", ReflectionLoopback, "gRPC server reflection on the client and admin planes: loopback (to loopback callers), on or off")
	fs.BoolVar(&c.AdminPprof, "server.admin_pprof", false, "serve /debug/pprof/ on the admin plane (behind the token)")
	fs.StringVar(&c.ClientTLS.CAFile, "server.client_tls.ca_file", "", "client plane: PEM bundle of the CA of client certificates")
	fs.StringVar(&c.ClientTLS.CertFile, "server.client_tls.cert_file", "", "client plane: this node's PEM certificate (serves TLS)")
	fs.StringVar(&c.ClientTLS.KeyFile, "server.client_tls.key_file", "", "client plane: this node's PEM key (mode 600)")
	fs.StringVar(&c.ClientTokenFile, "server.client_token_file", "", "client plane: file of \"<role> <token>\" lines for gRPC callers")
	fs.BoolVar(&c.AllowAnonymousClients, "server.allow_anonymous_clients", false, "let callers without a certificate or token use the stream service on user buckets")
	fs.StringVar(&c.ClusterTLS.CAFile, "server.cluster_tls.ca_file", "", "cluster plane: PEM bundle of the cluster CA")
	fs.StringVar(&c.ClusterTLS.CertFile, "server.cluster_tls.cert_file", "", "cluster plane: this node's PEM certificate (urn:ursula:node:<id>)")
	fs.StringVar(&c.ClusterTLS.KeyFile, "server.cluster_tls.key_file", "", "cluster plane: this node's PEM key (mode 600)")
	fs.BoolVar(&c.InsecureClusterPlaintext, "server.insecure_cluster_plaintext", false, "run the cluster plane without TLS (every cluster address must be loopback)")
	fs.StringVar(&c.ClusterID, "server.cluster_id", "local", "cluster id")
	fs.IntVar(&c.MaxMessageBytes, "server.max_message_bytes", 64<<20, "maximum gRPC message size")
	fs.Int64Var(&c.HTTPInflightBodySize, "server.http_inflight_body_size", httpserver.DefaultInflightBodyBytes,
		"bytes of HTTP request bodies the process holds at once (at least 64 MiB on a node with a cold backend); beyond it requests get 503")
	fs.IntVar(&c.MaxConnections, "server.max_connections", DefaultMaxConnections,
		"most connections each plane (client, admin, metrics, cluster) holds at once; one beyond it is closed at once")
	c.HTTP.RegisterFlags(fs, "server.http.")
}

// DefaultMaxConnections is server.max_connections' default. A node's
// planes are called by gateways, services, peers and scrapers, which keep
// their connections (gRPC multiplexes its calls over one): a few thousand
// is far above what they need and far below a process's descriptors.
const DefaultMaxConnections = 4096

// maxConnections is MaxConnections with its default.
func (c *Config) maxConnections() int {
	if c.MaxConnections == 0 {
		return DefaultMaxConnections
	}
	return c.MaxConnections
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("server.listen %q: %w", c.Listen, err))
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("server.metrics_listen %q: %w", c.MetricsListen, err))
		}
	}
	if c.AdminListen != "" {
		host, _, err := net.SplitHostPort(c.AdminListen)
		if err != nil {
			errs = append(errs, fmt.Errorf("server.admin_listen %q: %w", c.AdminListen, err))
		} else if !isLoopback(host) {
			if !c.AllowNonLoopbackAdmin {
				errs = append(errs, fmt.Errorf("server.admin_listen %q is not a loopback address (set server.allow_non_loopback_admin to override)", c.AdminListen))
			} else if c.AdminTLS.IsZero() {
				errs = append(errs, fmt.Errorf("server.admin_listen %q is not a loopback address: server.admin_tls is required", c.AdminListen))
			}
		}
	}
	if !c.AdminTLS.IsZero() {
		errs = append(errs, c.AdminTLS.Validate("server.admin_tls", true))
	}
	if c.AdminTokenFile != "" {
		if _, err := loadAdminToken(c.AdminTokenFile); err != nil {
			errs = append(errs, err)
		}
	}
	if !c.ClientTLS.IsZero() {
		errs = append(errs, c.ClientTLS.Validate("server.client_tls", true))
	}
	if c.ClientTokenFile != "" {
		if _, err := loadTokenFile(c.ClientTokenFile); err != nil {
			errs = append(errs, err)
		}
	}
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && !isLoopback(host) &&
		c.ClientTLS.IsZero() && c.ClientTokenFile == "" && !c.AllowAnonymousClients {
		errs = append(errs, fmt.Errorf("server.listen %q is not a loopback address and the client plane authenticates nobody: "+
			"configure server.client_tls and/or server.client_token_file, or set allow_anonymous_clients = true", c.Listen))
	}
	switch c.GRPCReflection {
	case "", ReflectionLoopback, ReflectionOn, ReflectionOff:
	default:
		errs = append(errs, fmt.Errorf("server.grpc_reflection %q: want %q, %q or %q", c.GRPCReflection, ReflectionLoopback, ReflectionOn, ReflectionOff))
	}
	if c.ClusterID == "" {
		errs = append(errs, errors.New("server.cluster_id is empty"))
	}
	if c.MaxMessageBytes < 1<<20 {
		errs = append(errs, errors.New("server.max_message_bytes must be at least 1 MiB"))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("server.max_connections %d must not be negative", c.MaxConnections))
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

// ValidateClusterPlane checks the cluster plane of a multi-node cluster
// against the other peers' cluster addresses: mutual TLS, or plaintext
// confined to loopback.
func (c *Config) ValidateClusterPlane(peerClusterURLs []string) error {
	if !c.ClusterTLS.IsZero() {
		if c.InsecureClusterPlaintext {
			return errors.New("server: cluster_tls and insecure_cluster_plaintext exclude each other")
		}
		return c.ClusterTLS.Validate("server.cluster_tls", true)
	}
	if !c.InsecureClusterPlaintext {
		return errors.New("server.cluster_tls is required by a multi-node cluster: the cluster plane authenticates nodes by their certificates " +
			"(ursulactl cert creates a development CA); insecure_cluster_plaintext = true runs it plaintext on loopback addresses only")
	}
	var errs []error
	for _, a := range append([]string{c.ClusterListen}, peerClusterURLs...) {
		host, _, err := net.SplitHostPort(a)
		if err != nil || !isLoopback(host) {
			errs = append(errs, fmt.Errorf("server.insecure_cluster_plaintext: cluster address %q is not a loopback address; configure server.cluster_tls", a))
		}
	}
	return errors.Join(errs...)
}

// Values of server.grpc_reflection.
const (
	ReflectionLoopback = "loopback"
	ReflectionOn       = "on"
	ReflectionOff      = "off"
)

// reflectionScope says to whom a plane serves gRPC reflection.
type reflectionScope int

const (
	// reflectionNone: to nobody (the service is not registered).
	reflectionNone reflectionScope = iota
	// reflectionLoopbackCallers: to callers connected over a loopback
	// address, on a listener of every address (":4437", "0.0.0.0:4437");
	// others are answered UNIMPLEMENTED, as if it were not served.
	reflectionLoopbackCallers
	// reflectionAll: to every caller the plane authenticates.
	reflectionAll
)

func (r reflectionScope) String() string {
	switch r {
	case reflectionLoopbackCallers:
		return "loopback_callers"
	case reflectionAll:
		return "on"
	}
	return "off"
}

// reflection is the reflection scope of a plane listening on addr:
// "loopback" (or empty) serves it to loopback callers, so to everyone on
// a loopback listener, to those connecting through 127.0.0.1 or ::1 on a
// listener of every address, to nobody on another address.
func (c Config) reflection(addr string) reflectionScope {
	switch c.GRPCReflection {
	case ReflectionOn:
		return reflectionAll
	case ReflectionOff:
		return reflectionNone
	}
	host, _, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return reflectionNone
	case isLoopback(host):
		return reflectionAll
	case host == "" || net.ParseIP(host).IsUnspecified():
		return reflectionLoopbackCallers
	}
	return reflectionNone
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
