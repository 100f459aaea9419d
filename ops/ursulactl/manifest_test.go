package ursulactl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestParseManifest(t *testing.T) {
	const node = "[[nodes]]\nid = %d\nclient_url = %q\nadmin_url = %q\n"
	two := fmt.Sprintf(node, 1, "127.0.0.1:4441", "http://127.0.0.1:4451/") + fmt.Sprintf(node, 2, "https://n2:4437", "http://127.0.0.1:4452")
	tests := []struct {
		name string
		text string
		err  string
	}{
		{name: "valid", text: "cluster_id = \"c\"\nadmin_token_file = \"tok\"\n" + two},
		{name: "no nodes", text: "cluster_id = \"c\"\n", err: "no [[nodes]]"},
		{name: "id zero", text: fmt.Sprintf(node, 0, "a:1", "b:1"), err: "id must be a positive"},
		{name: "duplicate id", text: fmt.Sprintf(node, 1, "a:1", "b:1") + fmt.Sprintf(node, 1, "a:2", "b:2"), err: "node 1: listed twice"},
		{name: "missing admin url", text: "[[nodes]]\nid = 1\nclient_url = \"a:1\"\n", err: "admin_url: missing"},
		{name: "bad scheme", text: fmt.Sprintf(node, 1, "grpc://a:1", "b:1"), err: "scheme must be http or https"},
		{name: "query in url", text: fmt.Sprintf(node, 1, "http://a:1/?x=1", "b:1"), err: "want http://host:port"},
		{name: "unknown key", text: two + "tokn = \"x\"\n", err: "unknown keys: nodes.tokn"},
		{name: "bad name", text: "[[nodes]]\nid = 1\nname = \"a b\"\nclient_url = \"a:1\"\nadmin_url = \"b:1\"\n", err: "name \"a b\""},
		{name: "not toml", text: "[[nodes]\n", err: "toml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseManifest(tt.text)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n1, n2 := m.Nodes[0], m.Nodes[1]
			if n1.ClientURL != "http://127.0.0.1:4441" || n1.AdminURL != "http://127.0.0.1:4451" || n2.ClientURL != "https://n2:4437" {
				t.Errorf("URLs not normalized: %+v", m.Nodes)
			}
			if n1.AdminTokenFile != "tok" || n2.AdminTokenFile != "tok" {
				t.Errorf("the manifest's admin_token_file is not the nodes' default: %+v", m.Nodes)
			}
			if n1.DisplayName() != "1" {
				t.Errorf("DisplayName = %q", n1.DisplayName())
			}
		})
	}
}

func TestLoadManifestTokenPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.toml")
	text := "[[nodes]]\nid = 1\nclient_url = \"a:1\"\nadmin_url = \"b:1\"\nadmin_token_file = \"secrets/n1\"\n" +
		"[[nodes]]\nid = 2\nclient_url = \"a:2\"\nadmin_url = \"b:2\"\nadmin_token_file = \"/abs/n2\"\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Nodes[0].AdminTokenFile; got != filepath.Join(dir, "secrets/n1") {
		t.Errorf("relative token file resolved to %q", got)
	}
	if got := m.Nodes[1].AdminTokenFile; got != "/abs/n2" {
		t.Errorf("absolute token file became %q", got)
	}
}

// TestLocalClusterManifest keeps deploy/local-cluster/manifest.toml true to
// the node files of make run-cluster: same cluster id, and each node's
// client_url and admin_url are its server.listen and server.admin_listen.
func TestLocalClusterManifest(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "local-cluster")
	m, err := LoadManifest(filepath.Join(dir, "manifest.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(m.Nodes))
	}
	for i, n := range m.Nodes {
		var cfg struct {
			Server struct {
				ClusterID   string `toml:"cluster_id"`
				Listen      string `toml:"listen"`
				AdminListen string `toml:"admin_listen"`
				ClientTLS   struct {
					CAFile string `toml:"ca_file"`
				} `toml:"client_tls"`
			} `toml:"server"`
			Raft struct {
				NodeID uint64 `toml:"node_id"`
			} `toml:"raft"`
		}
		file := filepath.Join(dir, fmt.Sprintf("node%d.toml", i+1))
		if _, err := toml.DecodeFile(file, &cfg); err != nil {
			t.Fatal(err)
		}
		scheme := "http://"
		if cfg.Server.ClientTLS.CAFile != "" {
			scheme = "https://"
		}
		if n.ID != cfg.Raft.NodeID || n.ClientURL != scheme+cfg.Server.Listen || n.AdminURL != "http://"+cfg.Server.AdminListen {
			t.Errorf("manifest node %+v does not match %s (node_id %d, listen %s, admin_listen %s)",
				n, file, cfg.Raft.NodeID, cfg.Server.Listen, cfg.Server.AdminListen)
		}
		if m.ClusterID != cfg.Server.ClusterID {
			t.Errorf("manifest cluster_id %q, %s has %q", m.ClusterID, file, cfg.Server.ClusterID)
		}
	}
}
