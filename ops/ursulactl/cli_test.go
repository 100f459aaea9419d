package ursulactl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/ursula/ursula/internal/buildinfo"
)

func TestVersion(t *testing.T) {
	want := buildinfo.Get().String("ursulactl") + "\n"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errs := runCLI(t, Env{}, args...)
		if code != 0 || out != want || errs != "" {
			t.Errorf("%v: exit %d, stdout %q (want %q), stderr %q", args, code, out, want, errs)
		}
	}
	code, out, _ := runCLI(t, Env{}, "--version", "--json")
	var info buildinfo.Info
	if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil || info != buildinfo.Get() {
		t.Errorf("--version --json: exit %d, %v: %q", code, err, out)
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		code, out, _ := runCLI(t, Env{}, "completion", shell)
		if code != 0 || !strings.Contains(out, "ursulactl") {
			t.Errorf("completion %s: exit %d, %d bytes", shell, code, len(out))
		}
	}
	// The script asks the binary for candidates; the binary offers the verbs.
	code, out, _ := runCLI(t, Env{}, "__complete", "")
	if code != 0 {
		t.Fatalf("__complete: exit %d", code)
	}
	for _, verb := range []string{"drain", "verify-cluster", "purge-bucket", "recover-group", "backup-create", "version"} {
		if !strings.Contains(out, verb) {
			t.Errorf("completions lack %q:\n%s", verb, out)
		}
	}
	c := newFakeCluster(t, 3, 2)
	m := c.manifest(t, "")
	code, out, _ = runCLI(t, Env{}, "__complete", "--manifest", m, "drain", "--node", "")
	if code != 0 || !strings.HasPrefix(out, "1\t") || !strings.Contains(out, "\n2\t") || !strings.Contains(out, "\n3\t") {
		t.Errorf("--node candidates: exit %d:\n%s", code, out)
	}
	code, out, _ = runCLI(t, Env{}, "__complete", "backup-verify", "--depth", "")
	if code != 0 || !strings.HasPrefix(out, "manifest\nobjects\ndeep\n") {
		t.Errorf("--depth candidates: exit %d:\n%s", code, out)
	}
}

// TestLineProgress: off a terminal, a wait prints its first state at
// once, a changed state at most every progressLineGap (the newest one
// then), and an unchanged one again every progressHeartbeat.
func TestLineProgress(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	l := &lineProgress{w: &out, now: func() time.Time { return now }}
	step := func(d time.Duration, state string) {
		now = now.Add(d)
		l.set(state)
	}
	step(0, "a")                    // first: printed
	step(100*time.Millisecond, "b") // within the gap: folded
	step(100*time.Millisecond, "c")
	step(progressLineGap, "c")     // gap passed, changed since "a": printed
	step(time.Second, "c")         // unchanged
	step(progressHeartbeat/2, "c") // unchanged, before the heartbeat
	step(progressHeartbeat/2, "c") // heartbeat: printed again
	for range 1000 {               // a change every poll for 100 s
		step(100*time.Millisecond, "x"+now.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !slices.Equal(lines[:3], []string{"ursulactl: a", "ursulactl: c", "ursulactl: c"}) {
		t.Errorf("first lines %q", lines[:3])
	}
	if n := len(lines) - 3; n < 45 || n > 51 {
		t.Errorf("%d lines for 100 s of changes every 100 ms, want about one per %v", n, progressLineGap)
	}
}

// TestProgressLinesOffTerminal: a wait without a terminal prints plain
// progress lines on stderr (none with --quiet), and only the result on
// stdout.
func TestProgressLinesOffTerminal(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	tty := false
	// Each reading of the clock is 10 s after the last: every state is
	// printed.
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { now = now.Add(10 * time.Second); return now }
	c.set(func() { c.nodes[2].ready, c.nodes[2].reason, c.nodes[2].notReady = false, "groups_not_ready", 3 })
	code, out, errs := runCLI(t, Env{TTY: &tty, Now: clock}, cli(m, "wait", "--node", "2")...)
	if code != 0 || out != "node 2: ready, a voter of all 4 groups and caught up\n" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	if !strings.Contains(errs, "ursulactl: node 2: not ready: groups_not_ready [4/4]\n") || strings.Contains(errs, "\r") {
		t.Errorf("stderr %q: want plain progress lines", errs)
	}
	// A wait without a count prints its state alone.
	c.set(func() { c.nodes[2].ready, c.nodes[2].notReady = false, 3 })
	code, _, errs = runCLI(t, Env{TTY: &tty, Now: clock}, cli(m, "wait-ready")...)
	if code != 0 || !strings.Contains(errs, "ursulactl: cluster: node 2: not ready: groups_not_ready\n") {
		t.Errorf("wait-ready: exit %d, stderr %q", code, errs)
	}
	c.set(func() { c.nodes[2].ready, c.nodes[2].notReady = false, 3 })
	code, _, errs = runCLI(t, Env{TTY: &tty, Now: clock}, cli(m, "--quiet", "wait", "--node", "2")...)
	if code != 0 || errs != "" {
		t.Errorf("--quiet: exit %d, stderr %q", code, errs)
	}
}

// jsonArgs are the arguments each runnable verb is tried with in
// TestJSONEveryVerb; ok says it must succeed against the fake cluster.
var jsonArgs = map[string]struct {
	args []string
	ok   bool
}{
	"version":                      {ok: true},
	"status":                       {ok: true},
	"verify-cluster":               {ok: true},
	"wait-ready":                   {ok: true},
	"wait":                         {args: []string{"--node", "2"}, ok: true},
	"drain":                        {args: []string{"--node", "1"}, ok: true},
	"undrain":                      {args: []string{"--node", "1"}, ok: true},
	"rollout":                      {ok: true},
	"snapshot":                     {args: []string{"--node", "1", "--group", "0"}, ok: true},
	"purge-log":                    {args: []string{"--node", "1", "--group", "0", "--upto", "5"}, ok: true},
	"transfer":                     {args: []string{"--node", "1", "--group", "0", "--to", "2"}, ok: true},
	"membership":                   {args: []string{"--node", "1", "--group", "0", "--voters", "1,2"}, ok: true},
	"flush-cold":                   {args: []string{"--node", "1", "--bucket", "b", "--stream", "s"}, ok: true},
	"purge-bucket":                 {args: []string{"--node", "1", "--bucket", "b"}}, // the fake's report proves nothing
	"cert init":                    {args: []string{"--dir", "@tmp"}, ok: true},
	"cert issue":                   {args: []string{"--dir", "@tmp", "--node", "1"}}, // no CA there
	"cert dev-cluster":             {args: []string{"--dir", "@tmp", "--nodes", "1"}, ok: true},
	"audit":                        {args: []string{"--node", "1"}},
	"recover-group diagnose":       {args: []string{"--group", "0"}},
	"recover-group plan":           {args: []string{"--group", "0"}},
	"recover-group apply":          {args: []string{"--group", "0", "--expect-proof", "00", "--journal-dir", "@tmp"}},
	"cluster feature-level":        {},
	"cluster enable-feature":       {args: []string{"--level", "2"}, ok: true},
	"backup-create":                {args: []string{"--location", "@tmp"}},
	"backup-verify":                {args: []string{"--location", "@tmp"}},
	"backup-list":                  {args: []string{"--location", "@tmp"}, ok: true},
	"restore":                      {args: []string{"--location", "@tmp"}},
	"probe":                        {args: []string{"http://127.0.0.1:1/__ursula/ready"}}, // nothing listens there
	"no manifest (bad invocation)": {args: []string{"--manifest", "@tmp/none.toml", "status"}},
}

// TestJSONEveryVerb runs every runnable verb of the command tree with
// --json against a fake cluster and checks that stdout holds exactly one
// JSON document: the verb's result, or {"error": ...} when it failed
// before it had one. A verb added without an entry in jsonArgs fails.
func TestJSONEveryVerb(t *testing.T) {
	var paths []string
	var walk func(c *cobra.Command, prefix string)
	walk = func(c *cobra.Command, prefix string) {
		for _, sub := range c.Commands() {
			name := strings.TrimSpace(prefix + " " + sub.Name())
			if sub.Hidden || name == "help" || strings.HasPrefix(name, "completion") {
				continue
			}
			if sub.Runnable() {
				paths = append(paths, name)
			}
			walk(sub, name)
		}
	}
	walk(newRootCommand(&app{env: &Env{}, o: &cliOptions{}}), "")
	for _, p := range paths {
		if _, ok := jsonArgs[p]; !ok {
			t.Errorf("verb %q has no case in jsonArgs: add one (and give it --json output)", p)
		}
	}
	for name, tc := range jsonArgs {
		t.Run(name, func(t *testing.T) {
			c := newFakeCluster(t, 3, 4)
			dir := t.TempDir()
			args := []string{"--json", "--yes"}
			if !strings.Contains(name, "(") {
				args = append(args, strings.Fields(name)...)
			}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "@tmp", dir))
			}
			restart := func(_ context.Context, n Node) error { c.restart(n.ID); return nil }
			code, out, errs := runCLI(t, Env{Restart: restart}, cli(c.manifest(t, ""), args...)...)
			if tc.ok && code != 0 {
				t.Errorf("exit %d", code)
			}
			doc := oneJSONDocument(t, out)
			_, isErr := doc["error"]
			if code == 0 && isErr {
				t.Errorf("exit 0 with an error document")
			}
			if code != 0 {
				checkErrLine(t, errs, "")
				if isErr {
					var e struct {
						Error struct {
							Message  string `json:"message"`
							ExitCode int    `json:"exit_code"`
						} `json:"error"`
					}
					_ = json.Unmarshal([]byte(out), &e)
					if e.Error.ExitCode != code || e.Error.Message == "" || !strings.Contains(errs, e.Error.Message) {
						t.Errorf("error document %q does not match exit %d and stderr %q", out, code, errs)
					}
				}
			}
		})
	}
}

// oneJSONDocument decodes out, which must hold exactly one JSON value; an
// object is returned as a map (an array as an empty map).
func oneJSONDocument(t *testing.T, out string) map[string]json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout is not a JSON document (%v): %q", err, out)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		t.Fatalf("stdout holds more than one JSON document: %q", out)
	}
	m := map[string]json.RawMessage{}
	if bytes.HasPrefix(bytes.TrimSpace(v), []byte("{")) {
		if err := json.Unmarshal(v, &m); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func TestJSONResults(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	code, out, errs := runCLI(t, Env{}, cli(m, "--json", "drain", "--node", "1")...)
	var d DrainResult
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || !d.Drained || d.Node != 1 || len(d.Transfers) != 2 {
		t.Errorf("drain --json: exit %d, %v: %+v", code, err, d)
	}
	// The progress and result lines went to stderr.
	if !strings.Contains(errs, "node 1: drained: it leads no group") {
		t.Errorf("stderr %q", errs)
	}
	code, out, errs = runCLI(t, Env{}, cli(m, "--json", "--quiet", "undrain", "--node", "1")...)
	if code != 0 || errs != "" || !strings.Contains(out, `"drained": false`) {
		t.Errorf("undrain --json --quiet: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// A safety abort: the error document says so, the exit code is kept.
	c.set(func() { c.nodes[3].ready = false })
	code, out, _ = runCLI(t, Env{}, cli(m, "--json", "drain", "--node", "1")...)
	if code != ExitAborted || !strings.Contains(out, `"aborted": true`) || !strings.Contains(out, `"exit_code": 2`) {
		t.Errorf("aborted drain --json: exit %d, stdout %q", code, out)
	}
}

// TestConfirmation: a destructive verb asks on a terminal and refuses off
// one without --yes; nothing is sent unless confirmed.
func TestConfirmation(t *testing.T) {
	c := newFakeCluster(t, 3, 4)
	m := c.manifest(t, "")
	complete := `{"bucket":"b","removed_streams":1,"groups_with_streams":[0],"cold_gc_entries_reclaimed":1,"cold_gc_pending_entries":0,"cold_gc_complete":true,"cold_gc_error":null,"bucket_prefix_absent":true}`
	yes, no := true, false
	tests := []struct {
		name     string
		args     []string
		stdinTTY *bool
		stdin    string
		code     int
		stderr   string
		mutation string // on node 1, "" for none
	}{
		{name: "purge-bucket off a terminal", args: []string{"purge-bucket", "--node", "1", "--bucket", "b"}, stdinTTY: &no,
			code: ExitError, stderr: "pass --yes to confirm"},
		{name: "purge-bucket --yes", args: []string{"purge-bucket", "--yes", "--node", "1", "--bucket", "b"}, stdinTTY: &no,
			mutation: "DELETE /__ursula/purge/b"},
		{name: "purge-bucket typed", args: []string{"purge-bucket", "--node", "1", "--bucket", "b"}, stdinTTY: &yes, stdin: "b\n",
			mutation: "DELETE /__ursula/purge/b"},
		{name: "purge-bucket wrong name", args: []string{"purge-bucket", "--node", "1", "--bucket", "b"}, stdinTTY: &yes, stdin: "yes\n",
			code: ExitAborted, stderr: `not confirmed (expected "b")`},
		{name: "purge-bucket no answer", args: []string{"purge-bucket", "--node", "1", "--bucket", "b"}, stdinTTY: &yes, stdin: "",
			code: ExitAborted, stderr: "no confirmation"},
		{name: "purge-log off a terminal", args: []string{"purge-log", "--node", "1", "--group", "0", "--upto", "9"}, stdinTTY: &no,
			code: ExitError, stderr: "pass --yes"},
		{name: "purge-log typed", args: []string{"purge-log", "--node", "1", "--group", "0", "--upto", "9"}, stdinTTY: &yes, stdin: "yes\n",
			mutation: "POST /__ursula/raft/0/purge?upto=9"},
		{name: "membership removing a voter", args: []string{"membership", "--node", "1", "--group", "0", "--voters", "1,2"}, stdinTTY: &no,
			code: ExitError, stderr: "remove voters [3] from group 0"},
		{name: "membership removing a voter, confirmed", args: []string{"membership", "--node", "1", "--group", "0", "--voters", "1,2"}, stdinTTY: &yes, stdin: "yes\n",
			mutation: "POST /__ursula/raft/0/membership?voters=1,2"},
		{name: "membership removing none", args: []string{"membership", "--node", "1", "--group", "0", "--voters", "1,2,3"}, stdinTTY: &no,
			mutation: "POST /__ursula/raft/0/membership?voters=1,2,3"},
		{name: "enable-feature off a terminal", args: []string{"cluster", "enable-feature", "--level", "2"}, stdinTTY: &no,
			code: ExitError, stderr: "pass --yes"},
		{name: "drain is not destructive", args: []string{"drain", "--node", "1"}, stdinTTY: &no,
			mutation: "POST /__ursula/leadership-shed/maintenance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.set(func() {
				c.leaders = []uint64{1, 2, 3, 1}
				for _, n := range c.nodes {
					n.mutations, n.draining = nil, false
					n.override = map[string][]fake{"DELETE /__ursula/purge/b": {{status: 200, body: complete}}}
				}
			})
			code, _, errs := runCLI(t, Env{Stdin: strings.NewReader(tt.stdin), StdinTTY: tt.stdinTTY}, cli(m, tt.args...)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if tt.stdinTTY == &yes {
				// The terminal echoes the answer and its newline; a
				// buffer does not.
				_, after, ok := strings.Cut(errs, "to confirm: ")
				if !ok {
					t.Errorf("no prompt on stderr: %q", errs)
				}
				errs = strings.TrimPrefix(after, "\n")
			}
			if tt.stderr != "" {
				checkErrLine(t, errs, tt.stderr)
			}
			muts := c.mutationsOf(1)
			if tt.mutation == "" && len(muts) > 0 {
				t.Errorf("mutations %v without confirmation", muts)
			}
			if tt.mutation != "" && !slices.Contains(muts, tt.mutation) {
				t.Errorf("mutations %v, want %q", muts, tt.mutation)
			}
		})
	}
}

// TestVerifyClusterGrouped: one node missing from every group's voters is
// one line naming the groups, not one line per group; --verbose and
// --json keep every finding.
func TestVerifyClusterGrouped(t *testing.T) {
	c := newFakeCluster(t, 3, 64)
	m := filepath.Join(t.TempDir(), "cluster.toml")
	// A fourth node in the manifest that no group has as a voter, and
	// that does not answer.
	base := c.manifest(t, "")
	writeFile(t, m, readFile(t, base)+"[[nodes]]\nid = 4\nclient_url = \"http://127.0.0.1:1\"\nadmin_url = \"http://127.0.0.1:1\"\n")
	code, out, errs := runCLI(t, Env{}, cli(m, "verify-cluster")...)
	if code != ExitError {
		t.Errorf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "problem: node 4: unreachable") ||
		lines[1] != "problem: node 4 is not a voter: 64 groups affected (groups 0-63)" ||
		lines[2] != "cluster unhealthy: 65 problems (2 distinct), 1 nodes and 64 groups affected" {
		t.Errorf("stdout:\n%s", out)
	}
	checkErrLine(t, errs, "verify-cluster: 65 problems: node 4: unreachable")
	code, out, _ = runCLI(t, Env{}, cli(m, "verify-cluster", "--verbose")...)
	if code != ExitError || strings.Count(out, "\n  group ") != 64 || !strings.Contains(out, "\n  group 17: node 4 is not a voter (leader ") {
		t.Errorf("--verbose: exit %d:\n%s", code, out)
	}
	code, out, _ = runCLI(t, Env{}, cli(m, "verify-cluster", "--json")...)
	var rep VerifyReport
	if err := json.Unmarshal([]byte(out), &rep); code != ExitError || err != nil || rep.OK || len(rep.Problems) != 65 || len(rep.Grouped) != 2 ||
		len(rep.Grouped[1].Groups) != 64 || rep.Grouped[1].Kind != "not_voter" || rep.Grouped[1].Node != 4 {
		t.Errorf("--json: exit %d, %v: %+v", code, err, rep)
	}
}

func TestCompactRanges(t *testing.T) {
	tests := []struct {
		ids  []uint32
		want string
	}{
		{nil, ""},
		{[]uint32{3}, "3"},
		{[]uint32{0, 1, 2, 3}, "0-3"},
		{[]uint32{1, 4, 5, 6, 9, 11, 12}, "1, 4-6, 9, 11-12"},
	}
	for _, tt := range tests {
		if got := compactRanges(tt.ids); got != tt.want {
			t.Errorf("compactRanges(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
