package ursulactl

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Manifest is a cluster manifest: the nodes ursulactl acts on and where
// it reaches them. It is read from a TOML file (see LoadManifest and the
// package documentation for the format).
type Manifest struct {
	// ClusterID, when set, is the server.cluster_id every node must
	// report; ursulactl refuses to mutate a node that reports another.
	ClusterID string `toml:"cluster_id"`
	// AdminTokenFile is the default admin_token_file of the nodes that set
	// none.
	AdminTokenFile string `toml:"admin_token_file"`
	// CAFile is the PEM bundle of the CA the nodes' certificates chain to,
	// for https:// URLs: a node is verified by the node identity its
	// certificate proves (package pki), not by its host name. Relative to
	// the manifest's directory. Empty: the system's roots and host names.
	CAFile string `toml:"ca_file"`
	// Nodes are the cluster's voters, in rollout order.
	Nodes []Node `toml:"nodes"`

	// Path is the file the manifest was read from ("" when built in code).
	Path string `toml:"-"`
}

// Node is one node of a Manifest.
type Node struct {
	// ID is the node's raft.node_id.
	ID uint64 `toml:"id"`
	// Name is how --restart-cmd names the node ({node}): a host, pod or
	// unit name. Empty means the id.
	Name string `toml:"name"`
	// ClientURL is the node's client plane (server.listen), serving GET
	// /__ursula/metrics and /__ursula/ready: http://host:port.
	ClientURL string `toml:"client_url"`
	// AdminURL is the node's admin plane (server.admin_listen, loopback
	// or a tunnel to it): every mutation goes there.
	AdminURL string `toml:"admin_url"`
	// AdminTokenFile is a file holding the admin plane's bearer token,
	// sent as Authorization: Bearer <token>. Relative paths are relative
	// to the manifest's directory. Empty: no token (or the manifest's).
	AdminTokenFile string `toml:"admin_token_file"`
}

// DisplayName is the node's Name, or its id when it has none.
func (n Node) DisplayName() string {
	if n.Name != "" {
		return n.Name
	}
	return strconv.FormatUint(n.ID, 10)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// LoadManifest reads and validates a manifest file. Unknown keys are
// errors, so that a typo does not silently drop a setting.
func LoadManifest(path string) (*Manifest, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	m, err := ParseManifest(string(raw))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	m.Path = path
	dir := filepath.Dir(path)
	if m.CAFile != "" && !filepath.IsAbs(m.CAFile) {
		m.CAFile = filepath.Join(dir, m.CAFile)
	}
	for i := range m.Nodes {
		n := &m.Nodes[i]
		if n.AdminTokenFile != "" && !filepath.IsAbs(n.AdminTokenFile) {
			n.AdminTokenFile = filepath.Join(dir, n.AdminTokenFile)
		}
	}
	return m, nil
}

// ParseManifest parses and validates a manifest's TOML text. Relative
// token files stay as written (LoadManifest resolves them).
func ParseManifest(text string) (*Manifest, error) {
	var m Manifest
	md, err := toml.Decode(text, &m)
	if err != nil {
		return nil, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("unknown keys: %s", strings.Join(keys, ", "))
	}
	for i := range m.Nodes {
		if m.Nodes[i].AdminTokenFile == "" {
			m.Nodes[i].AdminTokenFile = m.AdminTokenFile
		}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks the manifest and normalizes its URLs (an address
// without a scheme gets http://, a trailing slash is dropped).
func (m *Manifest) Validate() error {
	if len(m.Nodes) == 0 {
		return errors.New("no [[nodes]]")
	}
	var errs []error
	ids := map[uint64]bool{}
	names := map[string]bool{}
	for i := range m.Nodes {
		n := &m.Nodes[i]
		where := fmt.Sprintf("nodes[%d]", i)
		if n.ID == 0 {
			errs = append(errs, fmt.Errorf("%s: id must be a positive raft.node_id", where))
		} else {
			where = fmt.Sprintf("node %d", n.ID)
			if ids[n.ID] {
				errs = append(errs, fmt.Errorf("%s: listed twice", where))
			}
			ids[n.ID] = true
		}
		if n.Name != "" {
			if !nameRE.MatchString(n.Name) {
				errs = append(errs, fmt.Errorf("%s: name %q: use letters, digits, '.', '_' and '-'", where, n.Name))
			}
			if names[n.Name] {
				errs = append(errs, fmt.Errorf("%s: name %q used twice", where, n.Name))
			}
			names[n.Name] = true
		}
		var err error
		if n.ClientURL, err = normalizeURL(n.ClientURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: client_url: %w", where, err))
		}
		if n.AdminURL, err = normalizeURL(n.AdminURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: admin_url: %w", where, err))
		}
	}
	return errors.Join(errs...)
}

func normalizeURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", errors.New("missing")
	}
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: want http://host:port", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Node returns the node with the given id.
func (m *Manifest) Node(id uint64) (Node, error) {
	i := slices.IndexFunc(m.Nodes, func(n Node) bool { return n.ID == id })
	if i < 0 {
		return Node{}, fmt.Errorf("node %d is not in the manifest (nodes %v)", id, m.IDs())
	}
	return m.Nodes[i], nil
}

// IDs lists the node ids in manifest order.
func (m *Manifest) IDs() []uint64 {
	out := make([]uint64, len(m.Nodes))
	for i, n := range m.Nodes {
		out[i] = n.ID
	}
	return out
}

// Has reports whether the manifest lists node id.
func (m *Manifest) Has(id uint64) bool {
	return slices.ContainsFunc(m.Nodes, func(n Node) bool { return n.ID == id })
}
