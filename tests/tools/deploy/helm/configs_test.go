package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestRenderedConfigsLoad passes every rendered configuration file to the
// product's loader: bin/<binary> -verify-config -config <file>.
func TestRenderedConfigsLoad(t *testing.T) {
	// make build's binaries, or those of $URSULA_BIN_DIR.
	bin := os.Getenv("URSULA_BIN_DIR")
	if bin == "" {
		var err error
		if bin, err = filepath.Abs("../../../../bin"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "ursula-node")); err != nil {
		t.Skipf("bin/ursula-node is absent (make build): %v", err)
	}
	// The certificates the chart's Secrets would hold: node 1 and the roles.
	pki := t.TempDir()
	if out, err := exec.Command(filepath.Join(bin, "ursulactl"), "cert", "dev-cluster", "--dir", pki, "--nodes", "1").CombinedOutput(); err != nil {
		t.Fatalf("ursulactl cert dev-cluster: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		vals map[string]any
	}{
		{"default", minimalValues()},
		{"three voters", threeVoters()},
		{"production", readValues(t, "ci/production-values.yaml")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := render(t, tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			r := decodeAll(t, manifest)
			// The helm test pod's manifest loads in ursulactl: wait-ready
			// gets as far as dialing the voters (unreachable here).
			m := strings.Replace(r.configMaps["prod-ursula-manifest"].Data["manifest.toml"], "/etc/ursula/tls/ca.crt", filepath.Join(pki, "ca.crt"), 1)
			mfile := filepath.Join(t.TempDir(), "manifest.toml")
			if err := os.WriteFile(mfile, []byte(m), 0o600); err != nil {
				t.Fatal(err)
			}
			out, _ := exec.Command(filepath.Join(bin, "ursulactl"), "--manifest", mfile, "--timeout", "1s", "wait-ready").CombinedOutput()
			if !bytes.Contains(out, []byte("not healthy")) || !bytes.Contains(out, []byte("unreachable")) {
				t.Errorf("ursulactl wait-ready with the rendered manifest: %s\n%s", out, m)
			}
			cm := r.configMaps["prod-ursula-config"]
			for _, key := range slices.Sorted(mapKeys(cm.Data)) {
				// The files a pod of the role mounts, owned by this process.
				checkConfig(t, podFS{bin: bin, pki: pki}, key, cm.Data[key])
				// And as the kubelet mounts them for the image's user.
				if os.Geteuid() == 0 {
					checkConfig(t, podFS{bin: bin, pki: pki, asImageUser: true}, key, cm.Data[key])
				}
			}
		})
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the files were not checked as the kubelet mounts them for user 65532")
	}
}

// imageUser is the user (and group, and fsGroup) the chart runs as.
const imageUser = 65532

// podFS lays out what a pod mounts, under a root directory of its own.
type podFS struct {
	bin, pki string
	// asImageUser lays the files out as the kubelet mounts Secrets for the
	// pod's fsGroup (owner root, group 65532, mode 0440; the data volume
	// group-writable) and runs the binary as user 65532; otherwise the
	// files are this process's, mode 600.
	asImageUser bool
}

// layout creates the root of one pod of role: its TLS Secret at
// etc/ursula/tls (node 1's for a node), the admin token Secret at
// etc/ursula/admin/token and the data volume at var/lib/ursula.
func (p podFS) layout(t *testing.T, role string) string {
	t.Helper()
	root, err := os.MkdirTemp("", "ursula-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	cert := role
	if role == "node" {
		cert = "node1"
	}
	dirMode, fileMode, gid := os.FileMode(0o700), os.FileMode(0o600), -1
	if p.asImageUser {
		dirMode, fileMode, gid = 0o755, 0o440, imageUser
	}
	if err := os.Chmod(root, dirMode); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"etc/ursula/admin/token": []byte(strings.Repeat("k", 48))}
	for dst, src := range map[string]string{"ca.crt": "ca.crt", "tls.crt": cert + ".crt", "tls.key": cert + ".key"} {
		b, err := os.ReadFile(filepath.Join(p.pki, src))
		if err != nil {
			t.Fatal(err)
		}
		files["etc/ursula/tls/"+dst] = b
	}
	for name, b := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, fileMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, -1, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(root, "var/lib/ursula")
	if err := os.MkdirAll(data, dirMode); err != nil {
		t.Fatal(err)
	}
	if p.asImageUser {
		if err := os.Chown(data, 0, imageUser); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(data, 0o2775); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// verify runs binary -verify-config on text in a pod root.
func (p podFS) verify(t *testing.T, root, binary, name, text string) ([]byte, error) {
	t.Helper()
	file := filepath.Join(root, name)
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(p.bin, binary), "-verify-config", "-config", file)
	if p.asImageUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: imageUser, Gid: imageUser, Groups: []uint32{imageUser}}}
	}
	return cmd.CombinedOutput()
}

// checkConfig passes one rendered file (key of the config ConfigMap) to
// its binary's -verify-config, with the files it names in place.
func checkConfig(t *testing.T, p podFS, key, rendered string) {
	t.Helper()
	role := strings.TrimSuffix(key, ".toml")
	binary := "ursula-" + role
	root := p.layout(t, role)
	text := strings.NewReplacer("/etc/ursula/", root+"/etc/ursula/", "/var/lib/ursula", root+"/var/lib/ursula").Replace(rendered)
	how := "as this process's files"
	if p.asImageUser {
		how = "as user 65532 with the kubelet's Secret modes"
	}
	if key == "node.toml" {
		// The binary knows raft.node_id_from_hostname: it refuses this
		// machine's host name for want of an ordinal...
		if out, err := p.verify(t, root, binary, key, text); err != nil && !bytes.Contains(out, []byte(`raft.node_id_from_hostname: the host name does not end in "-<n>"`)) {
			t.Errorf("%s -verify-config %s (%s): %v\n%s", binary, key, how, err, out)
		}
		// ...so check the rest as node 1.
		text = strings.Replace(text, "node_id_from_hostname = true", "node_id = 1", 1)
	}
	out, err := p.verify(t, root, binary, key, text)
	if err != nil {
		t.Errorf("%s -verify-config %s (%s): %v\n%s\n%s", binary, key, how, err, out, text)
	}
}
