package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/internal/pki"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// EnvArtifacts names a directory where cluster tests copy the logs and
// configuration files of a failed test (they are printed too, in part).
const EnvArtifacts = "URSULA_TEST_ARTIFACTS"

// DSBucket is the built-in bucket of the Durable Streams URL family
// (gateway.BuiltinBucket; not imported, so that the harness does not build
// the gateway): a stream the gateway serves at /v1/stream/NAME is
// (DSBucket, NAME) on the nodes' StreamService.
const DSBucket = "__ds"

// NodeConfig is the TOML configuration of one ursula-node, the file a
// cluster test writes for it.
type NodeConfig struct {
	ClusterID     string
	NodeID        uint64
	Listen        string // client plane: StreamService gRPC + /__ursula/{ready,metrics}
	AdminListen   string
	ClusterListen string // Raft transport
	DataDir       string
	GroupCount    int
	CoreCount     int
	Fsync         string
	LogLevel      string
	Peers         []PeerConfig
	// Cold is the [storage.cold] section's body; empty means an fs store in
	// ColdDir, which every node of a cluster shares (a cold store is shared
	// by all replicas, as S3 is in production).
	Cold    string
	ColdDir string
	// ColdTuning is added to the [storage.cold] section of an fs store in
	// ColdDir (thresholds, one "key = value" per line), RuntimeTuning to
	// the [runtime] section.
	ColdTuning    string
	RuntimeTuning string
	// Extra is appended to the file verbatim (further keys or sections).
	Extra string
	// RaftTuning is added to the [raft] section ("key = value" lines),
	// WALTuning to its [raft.wal] table.
	RaftTuning string
	WALTuning  string
	// ClusterTLS is the node's cluster-plane certificate set; zero with
	// InsecurePlaintext runs the plane plaintext.
	ClusterTLS        pki.Files
	InsecurePlaintext bool
	// ClientTLS serves the client plane over TLS (client certificates of
	// the same CA prove roles); zero serves it plaintext and anonymously.
	ClientTLS pki.Files
}

// PeerConfig is one [[raft.peers]] entry.
type PeerConfig struct {
	ID         uint64
	ClusterURL string // may be a Proxy's address
	ClientURL  string
}

// addrs are the node's listeners, named as the harness names listen flags.
func (c NodeConfig) addrs() map[string]string {
	return map[string]string{"server.listen": c.Listen, "server.admin_listen": c.AdminListen, "server.cluster_listen": c.ClusterListen}
}

// TOML renders the configuration file.
func (c NodeConfig) TOML() string {
	var b strings.Builder
	q := strconv.Quote
	fmt.Fprintf(&b, "# Written by the ursula test harness for node %d of cluster %q.\n\n", c.NodeID, c.ClusterID)
	fmt.Fprintf(&b, "[server]\ncluster_id = %s\nlisten = %s\nadmin_listen = %s\ncluster_listen = %s\n",
		q(c.ClusterID), q(c.Listen), q(c.AdminListen), q(c.ClusterListen))
	if f := c.ClusterTLS; !f.IsZero() {
		fmt.Fprintf(&b, "cluster_tls = { ca_file = %s, cert_file = %s, key_file = %s }\n", q(f.CAFile), q(f.CertFile), q(f.KeyFile))
	}
	if c.InsecurePlaintext {
		b.WriteString("insecure_cluster_plaintext = true\n")
	}
	if f := c.ClientTLS; !f.IsZero() {
		fmt.Fprintf(&b, "client_tls = { ca_file = %s, cert_file = %s, key_file = %s }\n", q(f.CAFile), q(f.CertFile), q(f.KeyFile))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "[runtime]\ncore_count = %d\n%s\n\n", c.CoreCount, c.RuntimeTuning)
	fmt.Fprintf(&b, "[raft]\nnode_id = %d\ngroup_count = %d\n%s\n[raft.wal]\npath = %s\nfsync = %s\n%s\n",
		c.NodeID, c.GroupCount, c.RaftTuning, q(c.DataDir), q(c.Fsync), c.WALTuning)
	for _, p := range c.Peers {
		fmt.Fprintf(&b, "[[raft.peers]]\nid = %d\ncluster_url = %s\nclient_url = %s\n\n", p.ID, q(p.ClusterURL), q(p.ClientURL))
	}
	if c.LogLevel != "" {
		fmt.Fprintf(&b, "[log]\nlevel = %s\n\n", q(c.LogLevel))
	}
	switch {
	case c.Cold != "":
		fmt.Fprintf(&b, "[storage.cold]\n%s\n\n", c.Cold)
	case c.ColdDir != "":
		fmt.Fprintf(&b, "[storage.cold]\nbackend = \"fs\"\nroot = %s\n%s\n\n", q(c.ColdDir), c.ColdTuning)
	}
	if c.Extra != "" {
		b.WriteString(c.Extra)
		b.WriteString("\n")
	}
	return b.String()
}

// ClusterOptions describes a cluster of ursula-node processes on loopback.
type ClusterOptions struct {
	// Nodes is the number of voters (3 or 5); zero means 3.
	Nodes int
	// ClusterID is every node's server.cluster_id; empty means a fresh
	// "test-<random>".
	ClusterID string
	// GroupCount is raft.group_count; zero means 16.
	GroupCount int
	// CoreCount is runtime.core_count; zero means 2.
	CoreCount int
	// Fsync is raft.fsync; empty means "never" (a process crash loses
	// nothing; the tests kill processes, not hosts).
	Fsync string
	// Proxies routes every directed cluster-plane link through its own
	// Proxy: node i's [[raft.peers]] entry for node j names the proxy
	// i->j, which forwards to j's cluster_listen.
	Proxies bool
	// Gateway starts an ursula-gateway in front of every node.
	Gateway bool
	// GatewayArgs are extra flags of the gateway.
	GatewayArgs []string
	// LogLevel is every node's log.level; empty leaves the default.
	LogLevel string
	// Cold is every node's [storage.cold] section body; empty means an fs
	// store in a directory of the cluster that every node shares, tuned by
	// ColdTuning; RuntimeTuning goes to every node's [runtime] section.
	Cold          string
	ColdTuning    string
	RuntimeTuning string
	// Extra is appended to every node's configuration file, RaftTuning
	// to its [raft] section and WALTuning to its [raft.wal] table.
	Extra      string
	RaftTuning string
	WALTuning  string
	// ReadyTimeout bounds the wait for readiness at start; zero means 120 s.
	ReadyTimeout time.Duration
	// Plaintext runs the cluster plane without TLS (loopback only);
	// otherwise every node gets a certificate of the cluster's own CA.
	Plaintext bool
}

// Cluster is a cluster of spawned ursula-node processes, optionally behind
// an ursula-gateway, with free loopback ports and one data directory per
// node under the test's temporary directory. Every process is killed and
// every proxy closed at the end of the test, pass or fail; on failure the
// tail of each log is printed.
type Cluster struct {
	ID      string
	Dir     string
	Nodes   []*Node
	Gateway *Server // nil unless ClusterOptions.Gateway

	tb      testing.TB
	opts    ClusterOptions
	nodeBin string
	proxies map[[2]uint64]*Proxy // [from, to]
	// CA issues the cluster's certificates (in PKIDir).
	CA     *pki.CA
	PKIDir string

	mu    sync.Mutex
	extra []*Node // nodes added by AddNode
	roles map[string]pki.Files
}

// Node is one ursula-node of a Cluster: its configuration file and its
// process. Its addresses and data directory stay the same across restarts.
type Node struct {
	*Server
	ID         uint64
	Config     NodeConfig
	ConfigPath string

	tb testing.TB
	// clientPlane is how StreamClient proves itself (as a gateway, which
	// may reach the reserved buckets the tests use).
	clientPlane pki.ClientPlane
	connMu      sync.Mutex
	conn        *grpc.ClientConn
}

// StartCluster writes the configuration files, starts every node, waits
// until each answers 200 on /__ursula/ready and every group has a leader
// that every node agrees on, then starts the gateway (if asked) and waits
// for it too. It fails tb if any of that does not happen within
// ReadyTimeout.
func StartCluster(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	c := NewCluster(tb, opts)
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.ReadyTimeout)
	defer cancel()
	for _, n := range c.Nodes {
		if err := n.Start(); err != nil {
			tb.Fatalf("start node %d: %v", n.ID, err)
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		tb.Fatalf("cluster %s not ready: %v", c.ID, err)
	}
	if err := c.WaitGroupsLed(ctx); err != nil {
		tb.Fatalf("cluster %s: %v", c.ID, err)
	}
	if opts.Gateway {
		c.StartGateway(ctx)
	}
	tb.Logf("cluster %s: %d nodes ready (%s)%s", c.ID, len(c.Nodes), c.Dir, c.gatewayNote())
	return c
}

func (c *Cluster) gatewayNote() string {
	if c.Gateway == nil {
		return ""
	}
	return ", gateway at " + c.Gateway.URL()
}

// NewCluster prepares a cluster (configuration files, proxies, processes)
// and registers its cleanup, but starts nothing.
func NewCluster(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.ClusterID == "" {
		opts.ClusterID = fmt.Sprintf("test-%08x", rand.Uint32())
	}
	if opts.GroupCount == 0 {
		opts.GroupCount = 16
	}
	if opts.CoreCount == 0 {
		opts.CoreCount = 2
	}
	if opts.Fsync == "" {
		opts.Fsync = "never"
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 120 * time.Second
	}
	nodeBin, err := Binary("ursula-node")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{
		ID:      opts.ClusterID,
		Dir:     tb.TempDir(),
		tb:      tb,
		opts:    opts,
		nodeBin: nodeBin,
		proxies: map[[2]uint64]*Proxy{},
	}
	tb.Cleanup(c.cleanup)
	if c.CA, err = pki.NewCA(opts.ClusterID, 24*time.Hour); err != nil {
		tb.Fatal(err)
	}
	c.PKIDir = filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(c.PKIDir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := c.CA.Save(c.PKIDir); err != nil {
		tb.Fatal(err)
	}

	addrs, err := freeport.Addrs(3 * opts.Nodes)
	if err != nil {
		tb.Fatal(err)
	}
	type planes struct{ client, admin, cluster string }
	ps := make([]planes, opts.Nodes)
	for i := range ps {
		ps[i] = planes{addrs[3*i], addrs[3*i+1], addrs[3*i+2]}
	}
	if opts.Proxies {
		for i := range ps {
			for j := range ps {
				if i == j {
					continue
				}
				from, to := uint64(i+1), uint64(j+1)
				p, err := NewProxy(fmt.Sprintf("%d->%d", from, to), ps[j].cluster)
				if err != nil {
					tb.Fatal(err)
				}
				c.proxies[[2]uint64{from, to}] = p
			}
		}
	}
	for i := range ps {
		id := uint64(i + 1)
		cfg := NodeConfig{
			ClusterID:     opts.ClusterID,
			NodeID:        id,
			Listen:        ps[i].client,
			AdminListen:   ps[i].admin,
			ClusterListen: ps[i].cluster,
			DataDir:       filepath.Join(c.Dir, fmt.Sprintf("node%d", id), "data"),
			GroupCount:    opts.GroupCount,
			CoreCount:     opts.CoreCount,
			Fsync:         opts.Fsync,
			LogLevel:      opts.LogLevel,
			Cold:          opts.Cold,
			ColdTuning:    opts.ColdTuning,
			RuntimeTuning: opts.RuntimeTuning,
			RaftTuning:    opts.RaftTuning,
			WALTuning:     opts.WALTuning,
			ColdDir:       filepath.Join(c.Dir, "cold"),
			Extra:         opts.Extra,
		}
		c.secure(&cfg)
		for j := range ps {
			peer := PeerConfig{ID: uint64(j + 1), ClusterURL: ps[j].cluster, ClientURL: ps[j].client}
			if p := c.proxies[[2]uint64{id, peer.ID}]; p != nil {
				peer.ClusterURL = p.Addr()
			}
			cfg.Peers = append(cfg.Peers, peer)
		}
		n, err := c.newNode(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	return c
}

// secure gives cfg its cluster-plane security: a certificate of the
// cluster's CA for its node id, or loopback plaintext.
func (c *Cluster) secure(cfg *NodeConfig) {
	if c.opts.Plaintext {
		cfg.ClusterTLS, cfg.ClientTLS, cfg.InsecurePlaintext = pki.Files{}, pki.Files{}, true
		return
	}
	cfg.ClusterTLS = c.Issue(pki.NodeIdentity(cfg.NodeID), fmt.Sprintf("node%d", cfg.NodeID))
	cfg.ClientTLS = cfg.ClusterTLS
	cfg.InsecurePlaintext = false
}

// ClientPlane is how a process of role proves itself to the nodes' client
// plane: a certificate of the cluster's CA (issued once per role), or
// nothing on a plaintext cluster.
func (c *Cluster) ClientPlane(role string) pki.ClientPlane {
	c.tb.Helper()
	if c.opts.Plaintext {
		return pki.ClientPlane{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.roles[role]; ok {
		return pki.ClientPlane{TLS: f}
	}
	f := c.Issue(pki.RoleIdentity(role), "role-"+role)
	if c.roles == nil {
		c.roles = map[string]pki.Files{}
	}
	c.roles[role] = f
	return pki.ClientPlane{TLS: f}
}

// httpsConfig is the client TLS configuration of a node's client-plane
// HTTP endpoints (nil when it serves plain HTTP): the cluster's CA, and
// any node identity.
func (c *Cluster) httpsConfig(cfg NodeConfig) *tls.Config {
	if cfg.ClientTLS.IsZero() {
		return nil
	}
	src, err := pki.Load(pki.Files{CAFile: cfg.ClientTLS.CAFile}, nil)
	if err != nil {
		c.tb.Fatal(err)
	}
	return src.ClientConfig(pki.ExpectAnyNode)
}

// ClientPlaneFlags are the upstream flags of a process of role.
func (c *Cluster) ClientPlaneFlags(role string) []string {
	cp := c.ClientPlane(role)
	if cp.TLS.IsZero() {
		return nil
	}
	return []string{"-upstream.tls.ca_file=" + cp.TLS.CAFile, "-upstream.tls.cert_file=" + cp.TLS.CertFile, "-upstream.tls.key_file=" + cp.TLS.KeyFile}
}

// ClientPlaneTOML is the [upstream] keys of a process of role.
func (c *Cluster) ClientPlaneTOML(role string) string {
	cp := c.ClientPlane(role)
	if cp.TLS.IsZero() {
		return ""
	}
	q := strconv.Quote
	return fmt.Sprintf("tls = { ca_file = %s, cert_file = %s, key_file = %s }\n", q(cp.TLS.CAFile), q(cp.TLS.CertFile), q(cp.TLS.KeyFile))
}

// Issue writes a certificate of the cluster's CA proving id as
// <PKIDir>/<name>.{crt,key} and returns its files.
func (c *Cluster) Issue(id pki.Identity, name string) pki.Files {
	c.tb.Helper()
	is, err := c.CA.Issue(id, []string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		c.tb.Fatal(err)
	}
	f, err := is.Save(c.PKIDir, name, filepath.Join(c.PKIDir, "ca.crt"))
	if err != nil {
		c.tb.Fatal(err)
	}
	return f
}

// newNode writes cfg to <Dir>/node<id>/node.toml (node<id>-<k> when that
// directory exists: a second node with the same id) and prepares its
// process (not started). An empty DataDir is the directory's "data".
func (c *Cluster) newNode(cfg NodeConfig) (*Node, error) {
	dir := filepath.Join(c.Dir, fmt.Sprintf("node%d", cfg.NodeID))
	for k := 2; ; k++ {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			break
		}
		dir = filepath.Join(c.Dir, fmt.Sprintf("node%d-%d", cfg.NodeID, k))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(dir, "data")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	n := &Node{ID: cfg.NodeID, Config: cfg, ConfigPath: filepath.Join(dir, "node.toml"), clientPlane: c.ClientPlane(pki.RoleGateway), tb: c.tb}
	if err := n.writeConfig(); err != nil {
		return nil, err
	}
	srv, err := NewServer(Options{
		Binary:       c.nodeBin,
		WorkDir:      dir,
		ListenFlags:  []string{},
		Addrs:        cfg.addrs(),
		ReadyFlag:    "server.listen",
		Args:         []string{"-config", n.ConfigPath},
		TLS:          c.httpsConfig(cfg),
		ReadyTimeout: c.opts.ReadyTimeout,
	})
	if err != nil {
		return nil, err
	}
	n.Server = srv
	return n, nil
}

// AddNode prepares (does not start) a node outside the cluster's voter set,
// with fresh addresses and data directory. Its configuration starts as a
// copy of node 1's with NodeID id, its own listeners and, in its peers
// list, the cluster's voters (dialed directly, not through proxies) plus
// itself; mutate may change anything before the file is written. The node
// is killed at cleanup and its log printed on failure like the others.
func (c *Cluster) AddNode(id uint64, mutate func(*NodeConfig)) *Node {
	c.tb.Helper()
	addrs, err := freeport.Addrs(3)
	if err != nil {
		c.tb.Fatal(err)
	}
	cfg := c.Nodes[0].Config
	cfg.NodeID = id
	cfg.Listen, cfg.AdminListen, cfg.ClusterListen = addrs[0], addrs[1], addrs[2]
	cfg.DataDir = ""
	cfg.Peers = nil
	for _, n := range c.Nodes {
		cfg.Peers = append(cfg.Peers, PeerConfig{ID: n.ID, ClusterURL: n.Config.ClusterListen, ClientURL: n.Config.Listen})
	}
	cfg.Peers = append(cfg.Peers, PeerConfig{ID: id, ClusterURL: cfg.ClusterListen, ClientURL: cfg.Listen})
	c.secure(&cfg)
	if mutate != nil {
		mutate(&cfg)
	}
	n, err := c.newNode(cfg)
	if err != nil {
		c.tb.Fatal(err)
	}
	c.mu.Lock()
	c.extra = append(c.extra, n)
	c.mu.Unlock()
	return n
}

// StartGateway starts ursula-gateway with every node's client plane as
// upstream.nodes and waits until its /__ursula/ready answers 200.
func (c *Cluster) StartGateway(ctx context.Context) *Server {
	c.tb.Helper()
	if c.Gateway != nil {
		return c.Gateway
	}
	bin, err := Binary("ursula-gateway")
	if err != nil {
		c.tb.Fatal(err)
	}
	var ups []string
	for _, n := range c.Nodes {
		ups = append(ups, n.Config.Listen)
	}
	gw, err := NewServer(Options{
		Binary:       bin,
		WorkDir:      filepath.Join(c.Dir, "gateway"),
		ListenFlags:  []string{"gateway.listen"},
		Args:         append(append([]string{"-upstream.nodes=" + strings.Join(ups, ",")}, c.ClientPlaneFlags(pki.RoleGateway)...), c.opts.GatewayArgs...),
		ReadyTimeout: c.opts.ReadyTimeout,
	})
	if err != nil {
		c.tb.Fatal(err)
	}
	c.Gateway = gw
	if err := gw.Start(); err != nil {
		c.tb.Fatalf("start gateway: %v", err)
	}
	if err := gw.WaitReady(ctx); err != nil {
		c.tb.Fatalf("gateway not ready: %v", err)
	}
	return gw
}

// GatewayURL is the gateway's base URL (http://127.0.0.1:port).
func (c *Cluster) GatewayURL() string {
	if c.Gateway == nil {
		c.tb.Fatal("the cluster has no gateway")
	}
	return c.Gateway.URL()
}

// Client is a Durable Streams client of the gateway.
func (c *Cluster) Client() *Client { return NewClient(c.GatewayURL()) }

// Node returns the node with the given id (a voter or an added node).
func (c *Cluster) Node(id uint64) *Node {
	for _, n := range c.allNodes() { // voters first
		if n.ID == id {
			return n
		}
	}
	c.tb.Fatalf("cluster %s has no node %d", c.ID, id)
	return nil
}

func (c *Cluster) allNodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(slices.Clone(c.Nodes), c.extra...)
}

// Running returns the voters whose process runs and whose configuration
// names this cluster (a voter reconfigured with another server.cluster_id
// is left out).
func (c *Cluster) Running() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if n.Running() && n.Config.ClusterID == c.ID {
			out = append(out, n)
		}
	}
	return out
}

// GroupCount is raft.group_count.
func (c *Cluster) GroupCount() int { return c.opts.GroupCount }

// GroupOf is the Raft group of a Durable Streams stream.
func (c *Cluster) GroupOf(name string) uint32 {
	return stream.GroupOf(DSBucket, name, c.opts.GroupCount)
}

// Proxy returns the proxy of the link from -> to, nil without proxies.
func (c *Cluster) Proxy(from, to uint64) *Proxy { return c.proxies[[2]uint64{from, to}] }

// Links returns every proxy from or to node id.
func (c *Cluster) Links(id uint64) []*Proxy {
	var out []*Proxy
	for k, p := range c.proxies {
		if k[0] == id || k[1] == id {
			out = append(out, p)
		}
	}
	return out
}

// Isolate blackholes every cluster-plane link from and to node id: the node
// keeps running and its client plane stays reachable, but it neither hears
// nor reaches its peers. It needs ClusterOptions.Proxies.
func (c *Cluster) Isolate(id uint64) {
	c.tb.Helper()
	links := c.Links(id)
	if len(links) == 0 {
		c.tb.Fatalf("isolate node %d: the cluster has no proxies", id)
	}
	for _, p := range links {
		p.Blackhole()
	}
}

// Heal passes traffic again on every link and removes every delay.
func (c *Cluster) Heal() {
	for _, p := range c.proxies {
		p.Heal()
	}
}

// WaitReady waits until every running voter (see Running) answers 200 on
// /__ursula/ready.
func (c *Cluster) WaitReady(ctx context.Context) error {
	var wg sync.WaitGroup
	running := c.Running()
	errs := make([]error, len(running))
	for i, n := range running {
		wg.Go(func() {
			if err := n.WaitReady(ctx); err != nil {
				errs[i] = fmt.Errorf("node %d: %w", n.ID, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// GroupLeaders asks every running voter for its metrics and returns, for
// each group, the node that claims to lead it at the highest term (0 when
// no node does), and the metrics by node id.
func (c *Cluster) GroupLeaders(ctx context.Context) (map[uint32]uint64, map[uint64]*Metrics, error) {
	all := map[uint64]*Metrics{}
	var errs []error
	for _, n := range c.Running() {
		m, err := n.Metrics(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", n.ID, err))
			continue
		}
		all[n.ID] = m
	}
	leaders := map[uint32]uint64{}
	terms := map[uint32]uint64{}
	for id, m := range all {
		for _, g := range m.RaftGroups {
			if g.LeaderID == id && (leaders[g.GroupID] == 0 || g.Term > terms[g.GroupID]) {
				leaders[g.GroupID], terms[g.GroupID] = id, g.Term
			}
		}
	}
	return leaders, all, errors.Join(errs...)
}

// WaitBalanced waits until every group has a leader and no running node
// leads more than its share: the balancer moves no leadership after that
// (only a drain, a failure or the commit-stall watchdog does), so a test
// that addresses a group's leader finds it still leading.
func (c *Cluster) WaitBalanced(ctx context.Context) error {
	var last map[uint64]int
	ok := await.Until(await.DefaultTimeout, func() bool {
		leaders, _, err := c.GroupLeaders(ctx)
		if err != nil || len(leaders) < c.opts.GroupCount {
			return false
		}
		last = map[uint64]int{}
		for _, id := range leaders {
			last[id]++
		}
		running := len(c.Running())
		share := (c.opts.GroupCount + running - 1) / running
		for _, n := range last {
			if n > share {
				return false
			}
		}
		return true
	})
	if !ok {
		return fmt.Errorf("leaderships not balanced after %v: %v", await.DefaultTimeout, last)
	}
	return nil
}

// WaitGroupsLed waits until every group has a leader that every running
// voter names in its metrics.
func (c *Cluster) WaitGroupsLed(ctx context.Context) error {
	last := "no metrics yet"
	for {
		leaders, all, err := c.GroupLeaders(ctx)
		if err == nil {
			last = agreeOnLeaders(c.opts.GroupCount, leaders, all)
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not every group has an agreed leader: %s", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// agreeOnLeaders returns "" when every group has a leader all nodes name,
// else what is missing.
func agreeOnLeaders(groups int, leaders map[uint32]uint64, all map[uint64]*Metrics) string {
	for g := range uint32(groups) {
		l := leaders[g]
		if l == 0 {
			return fmt.Sprintf("group %d has no leader", g)
		}
		for id, m := range all {
			gm := m.Group(g)
			if gm == nil {
				return fmt.Sprintf("node %d reports no group %d", id, g)
			}
			if gm.LeaderID != l {
				return fmt.Sprintf("group %d: node %d follows %d, node %d leads", g, id, gm.LeaderID, l)
			}
		}
	}
	return ""
}

// Leader returns the node leading group g, waiting until one does.
func (c *Cluster) Leader(ctx context.Context, g uint32) (*Node, error) {
	for {
		leaders, _, _ := c.GroupLeaders(ctx)
		if id := leaders[g]; id != 0 {
			for _, n := range c.Nodes {
				if n.ID == id {
					return n, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("group %d has no leader: %w", g, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitVoter waits until, on every running voter, every group lists node id
// among its voters and not among its learners.
func (c *Cluster) WaitVoter(ctx context.Context, id uint64) error {
	last := "no metrics yet"
	for {
		_, all, err := c.GroupLeaders(ctx)
		if err == nil {
			last = ""
		check:
			for nid, m := range all {
				for g := range uint32(c.opts.GroupCount) {
					gm := m.Group(g)
					switch {
					case gm == nil:
						last = fmt.Sprintf("node %d reports no group %d", nid, g)
					case !slices.Contains(gm.Voters, id) || slices.Contains(gm.Learners, id):
						last = fmt.Sprintf("node %d: group %d has voters %v, learners %v", nid, g, gm.Voters, gm.Learners)
					default:
						continue
					}
					break check
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d is not a voter of every group on every node: %s", id, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) cleanup() {
	if c.Gateway != nil {
		c.Gateway.Close()
	}
	nodes := c.allNodes()
	for _, n := range nodes {
		n.Close()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	if !c.tb.Failed() {
		return
	}
	for _, n := range nodes {
		c.tb.Logf("node %d (%s) configuration %s:\n%s\nlast lines of %s:\n%s",
			n.ID, n.Config.ClusterID, n.ConfigPath, readFile(n.ConfigPath), n.LogPath, n.LogTail(150))
	}
	if c.Gateway != nil {
		c.tb.Logf("last lines of the gateway log %s:\n%s", c.Gateway.LogPath, c.Gateway.LogTail(80))
	}
	// A CI report keeps only the last lines of a failed test: they name
	// each node's last warnings, not the gateway's last requests.
	for _, n := range nodes {
		c.tb.Logf("node %d's last warnings:\n%s", n.ID, n.LogWarnings(3))
	}
	KeepArtifacts(c.tb, c.Dir)
}

// KeepArtifacts copies the *.log and *.toml files (and *.html, *.json) under
// dir into $URSULA_TEST_ARTIFACTS/<test name>/ when that variable is set.
func KeepArtifacts(tb testing.TB, dir string) {
	root := os.Getenv(EnvArtifacts)
	if root == "" {
		return
	}
	dst := filepath.Join(root, strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()))
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(p) {
		case ".log", ".toml", ".html", ".json", ".txt":
		default:
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		tb.Logf("keep artifacts in %s: %v", dst, err)
		return
	}
	tb.Logf("logs and configuration kept in %s", dst)
}

func readFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}

func (n *Node) writeConfig() error {
	return os.WriteFile(n.ConfigPath, []byte(n.Config.TOML()), 0o644)
}

// Reconfigure changes the node's configuration file; it takes effect at
// the next start. The node must not be running.
func (n *Node) Reconfigure(mutate func(*NodeConfig)) error {
	if n.Running() {
		return fmt.Errorf("node %d: reconfigure while running", n.ID)
	}
	mutate(&n.Config)
	n.ID = n.Config.NodeID
	n.Server.opts.Addrs = n.Config.addrs()
	n.Server.Addrs = maps.Clone(n.Server.opts.Addrs)
	if err := os.MkdirAll(n.Config.DataDir, 0o755); err != nil {
		return err
	}
	return n.writeConfig()
}

// Wipe deletes the node's data directory and leaves an empty one, as after
// a lost disk. The node must not be running.
func (n *Node) Wipe() error {
	if n.Running() {
		return fmt.Errorf("node %d: wipe while running", n.ID)
	}
	if err := os.RemoveAll(n.Config.DataDir); err != nil {
		return err
	}
	return os.MkdirAll(n.Config.DataDir, 0o755)
}

// AdminTokenFile is the admin token file the node created in its data
// directory.
func (n *Node) AdminTokenFile() string { return filepath.Join(n.Config.DataDir, "admin.token") }

// AdminAuth is the Authorization header value of the node's admin
// mutations.
func (n *Node) AdminAuth(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(n.AdminTokenFile())
	if err != nil {
		tb.Fatalf("node %d: read the admin token: %v", n.ID, err)
	}
	return "Bearer " + strings.TrimSpace(string(b))
}

// ClientAddr is the node's client plane (gRPC and HTTP).
func (n *Node) ClientAddr() string { return n.Config.Listen }

// StreamClient returns a StreamService client of the node's client plane.
// The connection is made once and reconnects across restarts; it is
// closed with the node.
func (n *Node) StreamClient() (streamv1.StreamServiceClient, error) {
	n.connMu.Lock()
	defer n.connMu.Unlock()
	if n.conn == nil {
		creds, err := n.clientPlane.DialOptions(nil)
		if err != nil {
			return nil, err
		}
		conn, err := grpc.NewClient(n.ClientAddr(), append(creds, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))...)
		if err != nil {
			return nil, fmt.Errorf("node %d: dial %s: %w", n.ID, n.ClientAddr(), err)
		}
		n.conn = conn
	}
	return streamv1.NewStreamServiceClient(n.conn), nil
}

// Close kills the process if it runs and closes the gRPC connection.
func (n *Node) Close() {
	n.Server.Close()
	n.connMu.Lock()
	defer n.connMu.Unlock()
	if n.conn != nil {
		n.conn.Close()
		n.conn = nil
	}
}

func (n *Node) String() string { return fmt.Sprintf("node %d", n.ID) }
