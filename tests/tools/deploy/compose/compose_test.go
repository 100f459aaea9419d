// Package compose_test checks deploy/compose/compose.yaml with the
// compose-spec loader Docker Compose itself uses (schema validation,
// interpolation, consistency of services, volumes and configs), then what
// the loader cannot know: that services, images, volumes, healthchecks,
// ports and the mounted Ursula configurations agree with each other, and
// that each configuration passes its binary's -verify-config.
// TestClusterOnLoopback (cluster_test.go) then runs the services as
// processes.
package compose_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/ursula/ursula/tests/tools/imagebuild"
)

// composeDir is the repository's deploy/compose.
const composeDir = "../../../../deploy/compose"

// configPath is where every Ursula service finds its configuration.
const configPath = "/etc/ursula/ursula.toml"

// The services of the cluster: the Ursula ones by the binary each runs.
var (
	nodes         = []string{"node1", "node2", "node3"}
	ursulaEntries = map[string]string{
		"pki": "ursulactl", "node1": "ursula-node", "node2": "ursula-node", "node3": "ursula-node",
		"gateway": "ursula-gateway", "coldgc": "ursula-coldgc", "backup": "ursula-backup",
	}
)

// load reads compose.yaml as `docker compose` does, with the environment
// env (none: every variable takes its default).
func load(t *testing.T, env ...string) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(composeDir)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
		cli.WithWorkingDirectory(dir),
		cli.WithEnv(env),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("load compose.yaml: %v", err)
	}
	return p
}

// serviceConfig is the file mounted as a service's configuration, and its
// decoded content.
func serviceConfig(t *testing.T, p *types.Project, s types.ServiceConfig) (string, map[string]any) {
	t.Helper()
	for _, c := range s.Configs {
		if c.Target != configPath {
			continue
		}
		file := p.Configs[c.Source].File
		var m map[string]any
		if _, err := toml.DecodeFile(file, &m); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return file, m
	}
	t.Fatalf("service %s mounts no configuration at %s", s.Name, configPath)
	return "", nil
}

// get returns the value at a dotted path of a decoded TOML document.
func get(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func str(m map[string]any, path string) string { s, _ := get(m, path).(string); return s }

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

func TestServices(t *testing.T) {
	p := load(t)
	var names []string
	for name := range p.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{"backup", "coldgc", "gateway", "node1", "node2", "node3", "pki", "s3"}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	for name, bin := range ursulaEntries {
		t.Run(name, func(t *testing.T) {
			s := p.Services[name]
			if s.Image != "ursula:latest" {
				t.Errorf("image %q, want ursula:latest (make image tags it)", s.Image)
			}
			if len(s.Entrypoint) != 1 || s.Entrypoint[0] != bin || !slices.Contains(imagebuild.Commands(), bin) {
				t.Errorf("entrypoint %q, want [%s], one of the image's commands", s.Entrypoint, bin)
			}
			if s.User != "" {
				t.Errorf("user %q: the image's non-root user is meant", s.User)
			}
			if !s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) || !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
				t.Errorf("not hardened: read_only %v, cap_drop %v, security_opt %v", s.ReadOnly, s.CapDrop, s.SecurityOpt)
			}
			if name == "pki" {
				return
			}
			if !slices.Equal(s.Command, []string{"-config", configPath}) {
				t.Errorf("command %q, want -config %s", s.Command, configPath)
			}
			if s.StopGracePeriod == nil || *s.StopGracePeriod < types.Duration(25e9) {
				t.Errorf("stop_grace_period %v: the graceful shutdown takes up to 20 s, then telemetry flushes", s.StopGracePeriod)
			}
			pki := false
			for _, v := range s.Volumes {
				if v.Source == "pki" {
					pki = v.Target == "/etc/ursula/pki" && v.ReadOnly
				}
			}
			if !pki {
				t.Errorf("volumes %v: want the pki volume read-only at /etc/ursula/pki", s.Volumes)
			}
			if _, ok := s.DependsOn["pki"]; !ok && !slices.Contains(nodes, name) {
				// Others reach pki through the nodes.
				if _, ok := s.DependsOn["node1"]; !ok {
					t.Errorf("depends_on %v: starts before the nodes", s.DependsOn)
				}
			}
		})
	}
}

func TestNodes(t *testing.T) {
	p := load(t)
	dataVolumes := map[string]string{}
	for i, name := range nodes {
		t.Run(name, func(t *testing.T) {
			s := p.Services[name]
			if s.Hostname != name {
				t.Errorf("hostname %q, want %q (the peers' addresses)", s.Hostname, name)
			}
			for _, v := range s.Volumes {
				if v.Target == "/data" {
					if other, ok := dataVolumes[v.Source]; ok {
						t.Errorf("data volume %s shared with %s", v.Source, other)
					}
					dataVolumes[v.Source] = name
				}
			}
			if dep := s.DependsOn["pki"]; dep.Condition != types.ServiceConditionCompletedSuccessfully {
				t.Errorf("depends on pki %q, want %s", dep.Condition, types.ServiceConditionCompletedSuccessfully)
			}
			if dep := s.DependsOn["s3"]; dep.Condition != types.ServiceConditionHealthy {
				t.Errorf("depends on s3 %q, want %s", dep.Condition, types.ServiceConditionHealthy)
			}
			for other := range s.DependsOn {
				if slices.Contains(nodes, other) {
					t.Errorf("depends on %s: a node waiting for a healthy peer never gets a quorum", other)
				}
			}
			if len(s.Ports) != 0 {
				t.Errorf("ports %v published: clients go through the gateway", s.Ports)
			}
			_, cfg := serviceConfig(t, p, s)
			if id, _ := get(cfg, "raft.node_id").(int64); id != int64(i+1) {
				t.Errorf("raft.node_id %v, want %d", get(cfg, "raft.node_id"), i+1)
			}
			listen, cluster := port(t, str(cfg, "server.listen")), port(t, str(cfg, "server.cluster_listen"))
			if admin := str(cfg, "server.admin_listen"); !strings.HasPrefix(admin, "127.0.0.1:") {
				t.Errorf("server.admin_listen %q: the admin plane stays on loopback", admin)
			}
			peers, _ := get(cfg, "raft.peers").([]map[string]any)
			if len(peers) != len(nodes) {
				t.Fatalf("%d raft.peers, want %d", len(peers), len(nodes))
			}
			for j, peer := range peers {
				if peer["cluster_url"] != nodes[j]+":"+cluster || peer["client_url"] != nodes[j]+":"+listen {
					t.Errorf("peer %d: %v, want %s:%s and %s:%s", j+1, peer, nodes[j], cluster, nodes[j], listen)
				}
			}
			checkHealthcheck(t, s, "https://127.0.0.1:"+listen+"/__ursula/ready")
			checkS3(t, p, s, cfg)
		})
	}
}

// checkHealthcheck wants a healthcheck that execs ursulactl probe of url:
// the image has no shell, so no CMD-SHELL.
func checkHealthcheck(t *testing.T, s types.ServiceConfig, url string) {
	t.Helper()
	hc := s.HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) < 3 {
		t.Fatalf("healthcheck %+v, want ursulactl probe %s", hc, url)
	}
	if hc.Test[0] != "CMD" || hc.Test[1] != "ursulactl" || hc.Test[2] != "probe" || hc.Test[len(hc.Test)-1] != url {
		t.Errorf("healthcheck %q, want [CMD ursulactl probe ... %s]", hc.Test, url)
	}
}

// checkS3 wants an s3 cold store on the s3 service, with its credentials.
func checkS3(t *testing.T, p *types.Project, s types.ServiceConfig, cfg map[string]any) {
	t.Helper()
	if str(cfg, "storage.cold.backend") != "s3" || str(cfg, "storage.cold.s3.endpoint") != "http://s3:7070" || str(cfg, "storage.cold.s3.bucket") != "ursula-cold" {
		t.Errorf("storage.cold %v, want the s3 service's bucket ursula-cold", get(cfg, "storage.cold"))
	}
	s3 := p.Services["s3"].Environment
	for key, server := range map[string]string{"AWS_ACCESS_KEY_ID": "ROOT_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY": "ROOT_SECRET_KEY"} {
		v, w := s.Environment[key], s3[server]
		if v == nil || w == nil || *v == "" || *v != *w {
			t.Errorf("%s=%v, the s3 service's %s=%v: want the same credential", key, v, server, w)
		}
	}
}

func TestFronts(t *testing.T) {
	p := load(t)
	gw := p.Services["gateway"]
	_, cfg := serviceConfig(t, p, gw)
	listen := port(t, str(cfg, "gateway.listen"))
	checkHealthcheck(t, gw, "http://127.0.0.1:"+listen+"/__ursula/ready")
	if len(gw.Ports) != 1 || gw.Ports[0].Target != 4437 || gw.Ports[0].Published != "4437" || gw.Ports[0].HostIP != "127.0.0.1" || listen != "4437" {
		t.Errorf("gateway ports %+v, listen %s: want 127.0.0.1:4437 -> 4437", gw.Ports, listen)
	}
	for _, name := range []string{"gateway", "backup", "coldgc"} {
		s := p.Services[name]
		_, cfg := serviceConfig(t, p, s)
		up, _ := get(cfg, "upstream.nodes").([]any)
		for _, n := range up {
			host, _, _ := strings.Cut(n.(string), ":")
			if !slices.Contains(nodes, host) {
				t.Errorf("%s: upstream node %v is not a node service", name, n)
			}
			if dep := s.DependsOn[host]; dep.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: depends on %s %q, want %s", name, host, dep.Condition, types.ServiceConditionHealthy)
			}
		}
		if len(up) == 0 {
			t.Errorf("%s: no upstream.nodes", name)
		}
		if name != "gateway" && len(s.Ports) != 0 {
			t.Errorf("%s publishes %v", name, s.Ports)
		}
	}
	_, ccfg := serviceConfig(t, p, p.Services["coldgc"])
	checkS3(t, p, p.Services["coldgc"], ccfg)
	// The cold-GC worker's only listener, its metrics plane, is its
	// healthcheck.
	checkHealthcheck(t, p.Services["coldgc"], "http://127.0.0.1:"+port(t, str(ccfg, "server.metrics_listen"))+"/__ursula/ready")

	b := p.Services["backup"]
	_, bcfg := serviceConfig(t, p, b)
	checkHealthcheck(t, b, "http://127.0.0.1:"+port(t, str(bcfg, "backup.listen"))+"/__ursula/ready")
	if loc := str(bcfg, "backup.location"); !strings.HasPrefix(loc, "s3://ursula-backups/") {
		t.Errorf("backup.location %q, want the s3 service's bucket ursula-backups", loc)
	}
	if ep := b.Environment["AWS_ENDPOINT_URL_S3"]; ep == nil || *ep != "http://s3:7070" {
		t.Errorf("backup: AWS_ENDPOINT_URL_S3=%v, want the s3 service", ep)
	}
	// The s3 service creates the buckets the configurations name.
	if ep := strings.Join(p.Services["s3"].Entrypoint, " "); !strings.Contains(ep, "/data/ursula-cold") || !strings.Contains(ep, "/data/ursula-backups") {
		t.Errorf("s3 entrypoint %q does not create the buckets ursula-cold and ursula-backups", ep)
	}
	if p.Services["s3"].HealthCheck == nil {
		t.Error("s3 has no healthcheck, and the nodes wait for it to be healthy")
	}
}

func TestManifest(t *testing.T) {
	var m struct {
		ClusterID string `toml:"cluster_id"`
		Nodes     []struct {
			ID        uint64 `toml:"id"`
			Name      string `toml:"name"`
			ClientURL string `toml:"client_url"`
		} `toml:"nodes"`
	}
	md, err := toml.DecodeFile(filepath.Join(composeDir, "manifest.toml"), &m)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Undecoded()) > 0 {
		// The fields above are what this test reads; the rest is
		// ursulactl's (admin_url, admin_token_file, ca_file).
		for _, k := range md.Undecoded() {
			if !slices.Contains([]string{"ca_file", "nodes.admin_url", "nodes.admin_token_file"}, k.String()) {
				t.Errorf("manifest: unexpected key %s", k)
			}
		}
	}
	p := load(t)
	_, cfg := serviceConfig(t, p, p.Services["node1"])
	if m.ClusterID != str(cfg, "server.cluster_id") {
		t.Errorf("manifest cluster_id %q, nodes' %q", m.ClusterID, str(cfg, "server.cluster_id"))
	}
	if len(m.Nodes) != len(nodes) {
		t.Fatalf("manifest lists %d nodes, want %d", len(m.Nodes), len(nodes))
	}
	for i, n := range m.Nodes {
		if want := "https://" + nodes[i] + ":" + port(t, str(cfg, "server.listen")); n.ID != uint64(i+1) || n.Name != nodes[i] || n.ClientURL != want {
			t.Errorf("manifest node %+v, want id %d, %s, %s", n, i+1, nodes[i], want)
		}
	}
}

// TestVerifyConfig runs each service's binary, from make image, on its
// configuration with -verify-config.
func TestVerifyConfig(t *testing.T) {
	binDir := os.Getenv("URSULA_IMAGE_BIN_DIR")
	if binDir == "" {
		t.Fatal("URSULA_IMAGE_BIN_DIR is not set: run these tests with make test-deploy (it builds the binaries first)")
	}
	p := load(t)
	for name, bin := range ursulaEntries {
		if name == "pki" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			file, _ := serviceConfig(t, p, p.Services[name])
			out, err := verify(filepath.Join(binDir, bin), file)
			if err != nil {
				t.Fatalf("%s -config %s -verify-config: %v\n%s", bin, file, err, out)
			}
		})
	}
}

func verify(bin, file string) (string, error) {
	out, err := exec.Command(bin, "-config", file, "-verify-config").CombinedOutput()
	return string(out), err
}

// The variables compose.yaml documents reach every service that needs them.
func TestVariables(t *testing.T) {
	p := load(t, "S3_ACCESS_KEY=access-1", "S3_SECRET_KEY=secret-1", "CLUSTER_IMAGE=registry.example/ursula:v9")
	for name, s := range p.Services {
		if _, ok := ursulaEntries[name]; ok && s.Image != "registry.example/ursula:v9" {
			t.Errorf("%s runs %q, want CLUSTER_IMAGE", name, s.Image)
		}
		if v := s.Environment["AWS_ACCESS_KEY_ID"]; v != nil && *v != "access-1" {
			t.Errorf("%s: AWS_ACCESS_KEY_ID=%s, want S3_ACCESS_KEY", name, *v)
		}
		if v := s.Environment["AWS_SECRET_ACCESS_KEY"]; v != nil && *v != "secret-1" {
			t.Errorf("%s: AWS_SECRET_ACCESS_KEY=%s, want S3_SECRET_KEY", name, *v)
		}
	}
	if v := p.Services["s3"].Environment["ROOT_SECRET_KEY"]; v == nil || *v != "secret-1" {
		t.Errorf("s3: ROOT_SECRET_KEY=%v, want S3_SECRET_KEY", v)
	}
}
