// Package systemd_test checks the systemd units of deploy/: what the
// service manager is told (Type=notify, watchdog, credentials file, stop
// timeout) by reading them, and, where systemd-analyze exists, that
// systemd accepts them (verify) and that their exposure under
// `systemd-analyze security` is at most 3.0.
package systemd_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// deployDir is the repository's deploy/.
const deployDir = "../../../../deploy"

// maxExposure is the highest overall exposure `systemd-analyze security`
// may give a unit (0 is best, 10 worst).
const maxExposure = 3.0

// units are the units shipped, by the binary each runs.
var units = []string{"ursula-node", "ursula-gateway", "ursula-coldgc", "ursula-backup"}

// unitFile is a parsed unit: section -> key -> values in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// one returns the single value of a key, failing when it is missing or
// set more than once.
func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s: %d values %q, want one", section, key, len(vs), vs)
	}
	return vs[0]
}

func TestUnits(t *testing.T) {
	for _, name := range units {
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, filepath.Join(deployDir, name+".service"))
			want := map[string]string{
				"Type":          "notify",
				"NotifyAccess":  "main",
				"User":          "ursula",
				"KillSignal":    "SIGTERM",
				"ProtectSystem": "strict",
				"UMask":         "0077",
			}
			for k, v := range want {
				if got := u.one(t, "Service", k); got != v {
					t.Errorf("%s=%s, want %s", k, got, v)
				}
			}
			exec := strings.Fields(u.one(t, "Service", "ExecStart"))
			if exec[0] != "/usr/local/bin/"+name {
				t.Errorf("ExecStart runs %s, want /usr/local/bin/%s", exec[0], name)
			}
			if env := u.one(t, "Service", "EnvironmentFile"); !regexp.MustCompile(`^-/etc/ursula/[a-z]+\.env$`).MatchString(env) {
				t.Errorf("EnvironmentFile=%s, want an optional -/etc/ursula/<role>.env", env)
			}
			wd := duration(t, u.one(t, "Service", "WatchdogSec"))
			if wd < 10*time.Second {
				t.Errorf("WatchdogSec=%v: too short for a process pausing under load", wd)
			}
			// The process bounds its graceful shutdown at 20 s and then
			// flushes telemetry for at most 5 s: systemd must not kill
			// it sooner.
			if stop := duration(t, u.one(t, "Service", "TimeoutStopSec")); stop < 25*time.Second {
				t.Errorf("TimeoutStopSec=%v, want at least 25s", stop)
			}
			if caps := u.one(t, "Service", "CapabilityBoundingSet"); caps != "" {
				t.Errorf("CapabilityBoundingSet=%s, want none", caps)
			}
			if name != "ursula-node" && !strings.Contains(strings.Join(u["Unit"]["After"], " "), "ursula-node.service") {
				t.Errorf("After=%q does not order it after a node on the same host", u["Unit"]["After"])
			}
		})
	}
}

// duration parses a systemd time span of one unit ("30s", "10min").
func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`^(\d+)(s|min)?$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("time span %q: want <n>s or <n>min", s)
	}
	n, _ := strconv.Atoi(m[1])
	if m[2] == "min" {
		return time.Duration(n) * time.Minute
	}
	return time.Duration(n) * time.Second
}

// analyze returns systemd-analyze's path, or skips the test.
func analyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the units are not checked by systemd (apt-get install systemd)")
	}
	return p
}

// stage copies the units into a directory with ExecStart pointing at a
// stand-in executable: verify checks that the binary exists, and this
// machine has none under /usr/local/bin. edit, when set, changes each
// unit's text.
func stage(t *testing.T, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range units {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(deployDir, name+".service"))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "/usr/local/bin/", bin+"/")
		if edit != nil {
			s = edit(s)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".service"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runAnalyze runs systemd-analyze without colours or a pager.
func runAnalyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(analyze(t), args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=cat", "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestSystemdVerify(t *testing.T) {
	dir := stage(t, nil)
	var paths []string
	for _, name := range units {
		paths = append(paths, filepath.Join(dir, name+".service"))
	}
	out, err := runAnalyze(t, append([]string{"verify"}, paths...)...)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The same check finds a broken unit, so its silence above means
	// something.
	broken := stage(t, func(s string) string { return strings.Replace(s, "Type=notify", "Type=notifyy", 1) })
	out, err = runAnalyze(t, "verify", filepath.Join(broken, "ursula-node.service"))
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) && !strings.Contains(out, "notifyy") {
		t.Fatalf("systemd-analyze verify accepted Type=notifyy: %v\n%s", err, out)
	}
}

// exposureLine is the last line of `systemd-analyze security UNIT`.
var exposureLine = regexp.MustCompile(`Overall exposure level for \S+: (\d+(?:\.\d+)?)`)

func TestSystemdSecurityExposure(t *testing.T) {
	dir := stage(t, nil)
	for _, name := range units {
		t.Run(name, func(t *testing.T) {
			exposure := securityExposure(t, filepath.Join(dir, name+".service"))
			t.Logf("%s: overall exposure %.1f", name, exposure)
			if exposure > maxExposure {
				t.Errorf("%s: overall exposure %.1f, want at most %.1f", name, exposure, maxExposure)
			}
		})
	}
	// Without its hardening a unit scores far worse: the parse above reads
	// the number systemd computes, not a constant.
	bare := stage(t, func(s string) string {
		return s[:strings.Index(s, "CapabilityBoundingSet=")] + "[Install]\nWantedBy=multi-user.target\n"
	})
	if exposure := securityExposure(t, filepath.Join(bare, "ursula-node.service")); exposure <= maxExposure {
		t.Fatalf("an unhardened unit scores %.1f: the check cannot fail", exposure)
	}
}

func securityExposure(t *testing.T, path string) float64 {
	t.Helper()
	out, err := runAnalyze(t, "security", "--offline=yes", "--no-pager", path)
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := exposureLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure in the output of systemd-analyze security:\n%s", out)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
