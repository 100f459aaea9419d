package ursulactl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// EnvManifest names the manifest file when --manifest is not given.
const EnvManifest = "URSULA_MANIFEST"

// Env is what Run takes from its caller besides the arguments.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
	// Stdin answers the confirmation prompts of destructive verbs; nil
	// reads nothing (a prompt then fails).
	Stdin io.Reader
	// TTY says whether Stderr is a terminal: progress is drawn as bars
	// there, and as plain lines otherwise. Nil detects it.
	TTY *bool
	// StdinTTY says whether Stdin is a terminal, so that a destructive
	// verb may ask for confirmation instead of requiring --yes. Nil
	// detects it.
	StdinTTY *bool
	// Now is the clock that paces progress lines; nil means time.Now.
	Now func() time.Time
	// Hooks are passed to the Controller (tests).
	Hooks Hooks
	// Restart, when set, is rollout's restart step and --restart-cmd is
	// not needed (tests restart nodes through their harness).
	Restart RestartFunc
}

// Main runs the ursulactl command (args as os.Args) and returns its exit
// status. SIGINT and SIGTERM cancel the running operation.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 {
		args = args[1:]
	}
	return Run(ctx, args, Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin})
}

// Run runs ursulactl with args (without the program name) and returns its
// exit status: ExitOK, ExitError, ExitAborted or a verb's own code. An
// error is printed to Stderr as one line starting with "ursulactl: error:
// "; with --json, a verb that failed before it had a result also prints
// {"error": {...}} on Stdout (see errorDocument).
func Run(ctx context.Context, args []string, env Env) int {
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	a := &app{env: &env, o: &cliOptions{}}
	defer func() {
		for _, c := range a.made {
			c.Close()
		}
	}()
	root := newRootCommand(a)
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.SetIn(stdinOrEmpty(env.Stdin))
	if err := root.ExecuteContext(ctx); err != nil {
		code := ExitCode(err)
		if (a.o.json || jsonRequested(args)) && !a.emitted {
			_ = printJSON(env.Stdout, errorDocument(err, code))
		}
		fmt.Fprintf(env.Stderr, "ursulactl: error: %s\n", oneLine(err.Error()))
		return code
	}
	return ExitOK
}

const rootLong = `ursulactl operates an Ursula cluster over the nodes' HTTP planes: it reads
GET /__ursula/metrics and /__ursula/ready on each node's client_url and sends
admin mutations to its admin_url, with the node's process incarnation (read
once per operation from its metrics) in x-ursula-process-incarnation.

The cluster is described by a manifest (--manifest, or $URSULA_MANIFEST,
default cluster.toml): see ops/README.md and deploy/local-cluster/manifest.toml.

Restarting a voter: drain --node N; restart it; wait --node N; undrain --node N
(rollout does all of it for every node, one at a time).

Output: results on stdout; progress on stderr (bars on a terminal, otherwise a
line per change, at most one every few seconds; --quiet silences it). With
--json every verb prints exactly one JSON document on stdout: its result, or
{"error": {"message", "exit_code"}} when it failed before it had one.

Destructive verbs (purge-bucket, purge-log, membership that removes a voter,
restore, recover-group apply, cluster enable-feature) ask for confirmation on
a terminal and, when stdin is not a terminal, refuse unless --yes is given.

Exit codes:
  0  done
  1  other errors (unreachable node, timeout, problems found, refused request, bad arguments,
     a destructive verb without --yes off a terminal)
  2  aborted by a safety check: a node answered 412 (it restarted since its
     incarnation was pinned) or 428, a target was not eligible, or a
     precondition did not hold (another node unready, a group would lose its quorum),
     or the operator declined the confirmation

Every error is one line on stderr starting with "ursulactl: error: ".`

// cliOptions are the root's flags.
type cliOptions struct {
	manifest string
	actor    string
	reason   string
	timeout  time.Duration
	maxLag   uint64
	poll     time.Duration
	json     bool
	quiet    bool
	yes      bool
	verbose  bool
	version  bool
}

// app is what every verb shares: the caller's Env, the root's flags, the
// Controllers made (Run closes them) and whether the verb printed its
// JSON document.
type app struct {
	env     *Env
	o       *cliOptions
	made    []*Controller
	emitted bool
}

// ctl loads the manifest and makes the verb's Controller: results to
// stdout (to stderr, as progress, with --json), progress to stderr unless
// --quiet.
func (a *app) ctl(cmd *cobra.Command, settle time.Duration) (*Controller, error) {
	m, err := LoadManifest(a.o.manifest)
	if err != nil {
		return nil, err
	}
	c, err := New(m, Options{
		Out: a.resultOut(), Progress: a.progressOut(), TTY: isTerminal(a.env.TTY, a.env.Stderr), Now: a.env.Now,
		Timeout: a.o.timeout, Settle: settle, MaxLag: a.o.maxLag, PollInterval: a.o.poll,
		Hooks: a.env.Hooks, Actor: a.o.actor, Reason: a.o.reason,
		Confirm: a.confirm,
	})
	if err == nil {
		a.made = append(a.made, c)
	}
	return c, err
}

// resultOut is where a verb's result lines go: stdout, or with --json
// (stdout holds the document) stderr unless --quiet.
func (a *app) resultOut() io.Writer {
	switch {
	case !a.o.json:
		return a.env.Stdout
	case a.o.quiet:
		return io.Discard
	default:
		return a.env.Stderr
	}
}

// progressOut is where progress goes: stderr, or nowhere with --quiet.
func (a *app) progressOut() io.Writer {
	if a.o.quiet {
		return nil
	}
	return a.env.Stderr
}

// emit prints v as the verb's one JSON document (only with --json).
func (a *app) emit(v any) error {
	a.emitted = true
	return printJSON(a.env.Stdout, v)
}

// newRootCommand builds the command tree.
func newRootCommand(a *app) *cobra.Command {
	o := a.o
	root := &cobra.Command{
		Use:           "ursulactl",
		Short:         "Operate an Ursula cluster: status, drain, wait, verify, rollout, recover, back up and restore",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.version {
				return printVersion(a)
			}
			return cmd.Help()
		},
	}
	defManifest := os.Getenv(EnvManifest)
	if defManifest == "" {
		defManifest = "cluster.toml"
	}
	pf := root.PersistentFlags()
	pf.StringVarP(&o.manifest, "manifest", "m", defManifest, "cluster manifest (TOML; $"+EnvManifest+")")
	pf.DurationVar(&o.timeout, "timeout", DefaultTimeout, "bound of each wait (drain handoffs, wait, wait-ready, retries of 503)")
	pf.Uint64Var(&o.maxLag, "max-lag", DefaultMaxLag, "entries a replica's applied index may trail its leader's commit index and count as caught up")
	pf.DurationVar(&o.poll, "poll", DefaultPollInterval, "pause between observations while waiting")
	pf.StringVar(&o.actor, "actor", os.Getenv("USER"), "who acts, recorded with every mutation in the nodes' audit trail (asserted, not verified)")
	pf.StringVar(&o.reason, "reason", "", "why, recorded with every mutation in the nodes' audit trail")
	pf.BoolVar(&o.json, "json", false, `print exactly one JSON document on stdout: the verb's result, or {"error": {...}}`)
	pf.BoolVarP(&o.quiet, "quiet", "q", false, "print no progress on stderr (results and errors still print)")
	pf.BoolVarP(&o.yes, "yes", "y", false, "confirm a destructive verb without a prompt (required when stdin is not a terminal)")
	pf.BoolVarP(&o.verbose, "verbose", "v", false, "print every finding (verify-cluster prints identical findings grouped otherwise)")
	root.Flags().BoolVar(&o.version, "version", false, "print ursulactl's version and exit")
	_ = root.RegisterFlagCompletionFunc("manifest", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"toml"}, cobra.ShellCompDirectiveFilterFileExt
	})

	root.AddCommand(
		versionCommand(a),
		statusCommand(a),
		verifyCommand(a),
		waitReadyCommand(a),
		waitCommand(a),
		drainCommand(a),
		undrainCommand(a),
		rolloutCommand(a),
		snapshotCommand(a),
		purgeLogCommand(a),
		transferCommand(a),
		membershipCommand(a),
		flushColdCommand(a),
		purgeBucketCommand(a),
		certCommand(a),
		auditCommand(a),
		recoverCommand(a),
		clusterCommand(a),
		probeCommand(a),
	)
	root.AddCommand(backupCommands(a)...)
	addCompletions(a, root)
	return root
}

func auditCommand(a *app) *cobra.Command {
	var (
		node  uint64
		limit int
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Print a node's audit trail: its newest admin mutations with actor, reason, proof, authentication and outcome (JSON lines; an array with --json)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			recs, err := c.Audit(cmd.Context(), node, limit)
			if err != nil {
				return err
			}
			if a.o.json {
				if recs == nil {
					recs = []json.RawMessage{}
				}
				return a.emit(recs)
			}
			for _, r := range recs {
				fmt.Fprintln(cmd.OutOrStdout(), string(r))
			}
			return nil
		},
	}
	nodeFlag(cmd, &node, "node whose trail to read")
	cmd.Flags().IntVar(&limit, "limit", 100, "newest records to print (at most 10000)")
	return cmd
}

func nodeFlag(cmd *cobra.Command, v *uint64, what string) {
	cmd.Flags().Uint64Var(v, "node", 0, what)
	_ = cmd.MarkFlagRequired("node")
}

func groupFlag(cmd *cobra.Command, v *uint32) {
	cmd.Flags().Uint32Var(v, "group", 0, "Raft group id")
	_ = cmd.MarkFlagRequired("group")
}

// printBody prints a node's answer: indented on stdout, or as the JSON
// document (a body that is not JSON becomes {"body": "..."}).
func (a *app) printBody(cmd *cobra.Command, body []byte) error {
	if a.o.json {
		return a.emit(bodyDocument(body))
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		fmt.Fprintln(cmd.OutOrStdout(), prettyJSON(body))
	}
	return nil
}

// bodyDocument is a node's answer as a JSON value.
func bodyDocument(body []byte) any {
	b := []byte(strings.TrimSpace(string(body)))
	if len(b) == 0 {
		return map[string]any{}
	}
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	return map[string]string{"body": string(b)}
}

func statusCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show every node: reachable, ready, incarnation, leaderships; the leadership spread; groups without a leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			st := c.Status(cmd.Context())
			if a.o.json {
				return a.emit(st)
			}
			return st.Render(cmd.OutOrStdout())
		},
	}
}

func waitReadyCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "wait-ready",
		Short: "Wait until verify-cluster passes: every node ready, every group led, every node a caught-up voter",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			if err := c.WaitReady(cmd.Context()); err != nil {
				return err
			}
			return a.done(map[string]any{"ready": true, "nodes": len(c.Manifest().Nodes)})
		},
	}
}

// done emits a verb's JSON result (with --json; nothing otherwise: the
// verb printed its result lines).
func (a *app) done(v any) error {
	if a.o.json {
		return a.emit(v)
	}
	return nil
}

func waitCommand(a *app) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "wait --node N",
		Short: "Wait until node N is ready, a voter of every group and caught up with each group's leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			groups, err := c.waitNode(cmd.Context(), node)
			if err != nil {
				return err
			}
			return a.done(map[string]any{"node": node, "ready": true, "groups": groups})
		},
	}
	nodeFlag(cmd, &node, "the node to wait for")
	return cmd
}

func drainCommand(a *app) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "drain --node N",
		Short: "Put node N in maintenance drain and move every leadership it holds to other ready voters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			_, res, err := c.drain(cmd.Context(), node)
			if err != nil {
				return err
			}
			return a.done(res)
		},
	}
	nodeFlag(cmd, &node, "the node to drain")
	return cmd
}

func undrainCommand(a *app) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "undrain --node N",
		Short: "Lift node N's maintenance drain",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.undrain(cmd.Context(), node)
			if err != nil {
				return err
			}
			return a.done(map[string]any{"node": node, "drained": false, "shed": bodyDocument(body)})
		},
	}
	nodeFlag(cmd, &node, "the node to undrain")
	return cmd
}

func rolloutCommand(a *app) *cobra.Command {
	var restartCmd string
	var settle time.Duration
	cmd := &cobra.Command{
		Use:   "rollout --restart-cmd 'CMD {node} {id}'",
		Short: "Restart every node, one at a time: check the cluster, drain, restart, wait, undrain",
		Long: `For each node of the manifest, in order: wait (up to --settle) until
verify-cluster passes, drain it, run --restart-cmd with {node} (the node's name,
else its id) and {id} replaced (sh -c), wait until it is a caught-up voter of
every group with a new process incarnation, undrain it. Stops at the first
failure (exit 2 for a safety abort). The restart command's output goes where
result lines go (stdout; stderr with --json).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			restart := a.env.Restart
			if restart == nil || restartCmd != "" {
				var err error
				if restart, err = CommandRestart(restartCmd, a.resultOut()); err != nil {
					return err
				}
			}
			c, err := a.ctl(cmd, settle)
			if err != nil {
				return err
			}
			res, err := c.rollout(cmd.Context(), restart)
			if err != nil {
				return err
			}
			return a.done(res)
		},
	}
	cmd.Flags().StringVar(&restartCmd, "restart-cmd", "", "command restarting one node ({node}: its name or id, {id}: its id), run with sh -c")
	cmd.Flags().DurationVar(&settle, "settle", DefaultSettle, "how long to wait, before each node, for verify-cluster to pass")
	return cmd
}

func snapshotCommand(a *app) *cobra.Command {
	var node uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "snapshot --node N --group G",
		Short: "Take a Raft snapshot of group G on node N",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.Snapshot(cmd.Context(), node, group)
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	nodeFlag(cmd, &node, "the node to snapshot on")
	groupFlag(cmd, &group)
	return cmd
}

func purgeLogCommand(a *app) *cobra.Command {
	var node, upto uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "purge-log --node N --group G --upto I",
		Short: "Purge group G's Raft log on node N through index I (at most through its last snapshot; destructive: asks for confirmation)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.confirm(cmd.Context(), Confirmation{
				Verb:   "purge-log",
				Action: fmt.Sprintf("purge group %d's Raft log on node %d through index %d (those entries can no longer be sent to a lagging replica)", group, node, upto),
			}); err != nil {
				return err
			}
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.PurgeLog(cmd.Context(), node, group, upto)
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	nodeFlag(cmd, &node, "the node whose log to purge")
	groupFlag(cmd, &group)
	cmd.Flags().Uint64Var(&upto, "upto", 0, "last log index to purge")
	_ = cmd.MarkFlagRequired("upto")
	return cmd
}

func transferCommand(a *app) *cobra.Command {
	var node, to uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "transfer --node N --group G --to M",
		Short: "Hand group G's leadership from node N (its leader) to node M and wait until it moved",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			leader, err := c.transfer(cmd.Context(), node, group, to)
			if err != nil {
				return err
			}
			return a.done(map[string]any{"group": group, "from": node, "to": to, "leader": leader})
		},
	}
	nodeFlag(cmd, &node, "the group's current leader")
	groupFlag(cmd, &group)
	cmd.Flags().Uint64Var(&to, "to", 0, "the voter to hand leadership to")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func membershipCommand(a *app) *cobra.Command {
	var node uint64
	var group uint32
	var voters string
	cmd := &cobra.Command{
		Use:   "membership --node N --group G --voters 1,2,3",
		Short: "Replace group G's voter set on its leader, node N (for repair: include every node that should stay a voter; removing a voter asks for confirmation)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ids, err := parseIDs(voters)
			if err != nil {
				return fmt.Errorf("--voters: %w", err)
			}
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.Membership(cmd.Context(), node, group, ids)
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	nodeFlag(cmd, &node, "the group's current leader")
	groupFlag(cmd, &group)
	cmd.Flags().StringVar(&voters, "voters", "", "the new voter set: node ids separated by commas")
	_ = cmd.MarkFlagRequired("voters")
	return cmd
}

func parseIDs(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, err := strconv.ParseUint(part, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("%q is not a node id", part)
		}
		out = append(out, id)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no node id in %q", s)
	}
	return out, nil
}

func flushColdCommand(a *app) *cobra.Command {
	var node uint64
	var bucket, stream string
	cmd := &cobra.Command{
		Use:   "flush-cold --node N --bucket B --stream S",
		Short: "Flush one stream's hot bytes to the cold store now, on node N (its group's leader)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.FlushCold(cmd.Context(), node, bucket, stream)
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	nodeFlag(cmd, &node, "the leader of the stream's group")
	cmd.Flags().StringVar(&bucket, "bucket", "", "the stream's bucket (__ds for the Durable Streams family)")
	cmd.Flags().StringVar(&stream, "stream", "", "the stream's name")
	_ = cmd.MarkFlagRequired("bucket")
	_ = cmd.MarkFlagRequired("stream")
	return cmd
}

func purgeBucketCommand(a *app) *cobra.Command {
	var node uint64
	var bucket string
	cmd := &cobra.Command{
		Use:   "purge-bucket --node N --bucket B",
		Short: "Erase bucket B for good through node N; fails unless the report proves completion (asks to type the bucket's name)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bucket == "" {
				return fmt.Errorf("purge-bucket: --bucket is required")
			}
			if err := a.confirm(cmd.Context(), Confirmation{
				Verb:   "purge-bucket",
				Action: fmt.Sprintf("erase bucket %q for good: every stream in it, on every node, and its cold objects", bucket),
				Token:  bucket,
			}); err != nil {
				return err
			}
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.PurgeBucket(cmd.Context(), node, bucket)
			if body != nil {
				if perr := a.printBody(cmd, body); perr != nil {
					return perr
				}
			}
			return err
		},
	}
	nodeFlag(cmd, &node, "any node")
	cmd.Flags().StringVar(&bucket, "bucket", "", "the bucket to purge")
	_ = cmd.MarkFlagRequired("bucket")
	return cmd
}

// printJSON prints v as indented JSON (the --json output of every verb).
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether out is a terminal: tty when set, else
// whether out is a terminal file.
func isTerminal(tty *bool, out any) bool {
	if tty != nil {
		return *tty
	}
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// VerifyReport is verify-cluster's --json document.
type VerifyReport struct {
	OK    bool `json:"ok"`
	Nodes int  `json:"nodes"`
	// Problems are every finding.
	Problems []Problem `json:"problems"`
	// Grouped are the findings with identical text but for their group
	// folded, as verify-cluster prints them.
	Grouped []ProblemGroup `json:"grouped"`
	// Summary is the last line verify-cluster prints.
	Summary string `json:"summary"`
}

// verifyReport folds problems into the report.
func verifyReport(nodes int, problems []Problem) *VerifyReport {
	r := &VerifyReport{OK: len(problems) == 0, Nodes: nodes, Problems: problems, Grouped: groupProblems(problems)}
	if r.Problems == nil {
		r.Problems = []Problem{}
	}
	if r.Grouped == nil {
		r.Grouped = []ProblemGroup{}
	}
	if r.OK {
		r.Summary = fmt.Sprintf("cluster healthy: %d nodes", nodes)
		return r
	}
	groups := map[uint32]bool{}
	nodeIDs := map[uint64]bool{}
	for _, p := range problems {
		if p.Group != nil {
			groups[*p.Group] = true
		}
		if p.Node != 0 {
			nodeIDs[p.Node] = true
		}
	}
	r.Summary = fmt.Sprintf("cluster unhealthy: %d problems (%d distinct), %d nodes and %d groups affected", len(problems), len(r.Grouped), len(nodeIDs), len(groups))
	return r
}

func verifyCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "verify-cluster",
		Short: "Check that every node is reachable and ready, of one cluster, every group has one agreed leader and every node is a caught-up voter of every group",
		Long: `verify-cluster observes every node once and prints one "problem:" line per
kind of finding: findings that differ only in their Raft group are folded into
one line naming how many groups, and which, are affected (--verbose adds every
finding under its line; --json holds both). The last line sums up. Exit 0 when
healthy, 1 when any problem was found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			rep := verifyReport(len(c.Manifest().Nodes), c.Verify(cmd.Context()))
			out := cmd.OutOrStdout()
			if a.o.json {
				if err := a.emit(rep); err != nil {
					return err
				}
			} else {
				for _, g := range rep.Grouped {
					fmt.Fprintf(out, "problem: %s\n", g.Line)
					if a.o.verbose && g.Count > 1 {
						for _, p := range g.Problems {
							fmt.Fprintf(out, "  %s\n", p.Message)
						}
					}
				}
				fmt.Fprintln(out, rep.Summary)
			}
			if !rep.OK {
				return fmt.Errorf("verify-cluster: %d problems: %s", len(rep.Problems), summarize(groupLines(rep.Grouped), 3))
			}
			return nil
		},
	}
}
