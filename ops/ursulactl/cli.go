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
	// TTY turns progress bars on or off; nil detects whether Stdout is a
	// terminal.
	TTY *bool
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
	return Run(ctx, args, Env{Stdout: os.Stdout, Stderr: os.Stderr})
}

// Run runs ursulactl with args (without the program name) and returns its
// exit status: ExitOK, ExitError or ExitAborted. An error is printed to
// Stderr as one line starting with "ursulactl: error: ".
func Run(ctx context.Context, args []string, env Env) int {
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	var made []*Controller
	defer func() {
		for _, c := range made {
			c.Close()
		}
	}()
	root := newRootCommand(&env, func(c *Controller) { made = append(made, c) })
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(env.Stderr, "ursulactl: error: %s\n", oneLine(err.Error()))
		return ExitCode(err)
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

Exit codes:
  0  done
  1  other errors (unreachable node, timeout, problems found, refused request, bad arguments)
  2  aborted by a safety check: a node answered 412 (it restarted since its
     incarnation was pinned) or 428, a target was not eligible, or a
     precondition did not hold (another node unready, a group would lose its quorum)

Every error is one line on stderr starting with "ursulactl: error: ".`

// cliOptions are the root's flags.
type cliOptions struct {
	manifest string
	actor    string
	reason   string
	timeout  time.Duration
	maxLag   uint64
	poll     time.Duration
}

// newRootCommand builds the command tree; made sees every Controller a
// verb creates (Run closes them).
func newRootCommand(env *Env, made func(*Controller)) *cobra.Command {
	o := &cliOptions{}
	root := &cobra.Command{
		Use:           "ursulactl",
		Short:         "Operate an Ursula cluster: status, drain, wait, verify, rollout, recover, back up and restore",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
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

	ctl := func(cmd *cobra.Command, settle time.Duration) (*Controller, error) {
		m, err := LoadManifest(o.manifest)
		if err != nil {
			return nil, err
		}
		c, err := New(m, Options{
			Out: cmd.OutOrStdout(), TTY: isTerminal(env, env.Stdout), Timeout: o.timeout, Settle: settle,
			MaxLag: o.maxLag, PollInterval: o.poll, Hooks: env.Hooks, Actor: o.actor, Reason: o.reason,
		})
		if err == nil {
			made(c)
		}
		return c, err
	}

	root.AddCommand(
		statusCommand(ctl),
		verifyCommand(ctl),
		waitReadyCommand(ctl),
		waitCommand(ctl),
		drainCommand(ctl),
		undrainCommand(ctl),
		rolloutCommand(ctl, env),
		snapshotCommand(ctl),
		purgeLogCommand(ctl),
		transferCommand(ctl),
		membershipCommand(ctl),
		flushColdCommand(ctl),
		purgeBucketCommand(ctl),
		certCommand(env),
		auditCommand(ctl),
		recoverCommand(ctl, o),
		clusterCommand(ctl),
		probeCommand(env, o),
	)
	root.AddCommand(backupCommands(ctl, env, o)...)
	return root
}

func auditCommand(ctl ctlFunc) *cobra.Command {
	var (
		node  uint64
		limit int
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Print a node's audit trail: its newest admin mutations with actor, reason, proof, authentication and outcome (JSON lines)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			recs, err := c.Audit(cmd.Context(), node, limit)
			if err != nil {
				return err
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

type ctlFunc func(cmd *cobra.Command, settle time.Duration) (*Controller, error)

func nodeFlag(cmd *cobra.Command, v *uint64, what string) {
	cmd.Flags().Uint64Var(v, "node", 0, what)
	_ = cmd.MarkFlagRequired("node")
}

func groupFlag(cmd *cobra.Command, v *uint32) {
	cmd.Flags().Uint32Var(v, "group", 0, "Raft group id")
	_ = cmd.MarkFlagRequired("group")
}

func printBody(cmd *cobra.Command, body []byte) {
	if len(strings.TrimSpace(string(body))) > 0 {
		fmt.Fprintln(cmd.OutOrStdout(), prettyJSON(body))
	}
}

func statusCommand(ctl ctlFunc) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every node: reachable, ready, incarnation, leaderships; the leadership spread; groups without a leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			st := c.Status(cmd.Context())
			if asJSON {
				return printJSON(cmd.OutOrStdout(), st)
			}
			return st.Render(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

func verifyCommand(ctl ctlFunc) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify-cluster",
		Short: "Check that every node is reachable and ready, of one cluster, every group has one agreed leader and every node is a caught-up voter of every group",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			problems := c.Verify(cmd.Context())
			out := cmd.OutOrStdout()
			if asJSON {
				if problems == nil {
					problems = []string{}
				}
				if err := printJSON(out, map[string]any{"ok": len(problems) == 0, "problems": problems}); err != nil {
					return err
				}
			} else {
				for _, p := range problems {
					fmt.Fprintf(out, "problem: %s\n", p)
				}
			}
			if len(problems) > 0 {
				return fmt.Errorf("verify-cluster: %d problems: %s", len(problems), summarize(problems, 3))
			}
			if !asJSON {
				fmt.Fprintf(out, "cluster healthy: %d nodes\n", len(c.Manifest().Nodes))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"ok": bool, "problems": [...]} as JSON`)
	return cmd
}

func waitReadyCommand(ctl ctlFunc) *cobra.Command {
	return &cobra.Command{
		Use:   "wait-ready",
		Short: "Wait until verify-cluster passes: every node ready, every group led, every node a caught-up voter",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			return c.WaitReady(cmd.Context())
		},
	}
}

func waitCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "wait --node N",
		Short: "Wait until node N is ready, a voter of every group and caught up with each group's leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			return c.WaitNode(cmd.Context(), node)
		},
	}
	nodeFlag(cmd, &node, "the node to wait for")
	return cmd
}

func drainCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "drain --node N",
		Short: "Put node N in maintenance drain and move every leadership it holds to other ready voters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			return c.Drain(cmd.Context(), node)
		},
	}
	nodeFlag(cmd, &node, "the node to drain")
	return cmd
}

func undrainCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "undrain --node N",
		Short: "Lift node N's maintenance drain",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			return c.Undrain(cmd.Context(), node)
		},
	}
	nodeFlag(cmd, &node, "the node to undrain")
	return cmd
}

func rolloutCommand(ctl ctlFunc, env *Env) *cobra.Command {
	var restartCmd string
	var settle time.Duration
	cmd := &cobra.Command{
		Use:   "rollout --restart-cmd 'CMD {node} {id}'",
		Short: "Restart every node, one at a time: check the cluster, drain, restart, wait, undrain",
		Long: `For each node of the manifest, in order: wait (up to --settle) until
verify-cluster passes, drain it, run --restart-cmd with {node} (the node's name,
else its id) and {id} replaced (sh -c), wait until it is a caught-up voter of
every group with a new process incarnation, undrain it. Stops at the first
failure (exit 2 for a safety abort).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			restart := env.Restart
			if restart == nil || restartCmd != "" {
				var err error
				if restart, err = CommandRestart(restartCmd, cmd.OutOrStdout()); err != nil {
					return err
				}
			}
			c, err := ctl(cmd, settle)
			if err != nil {
				return err
			}
			return c.Rollout(cmd.Context(), restart)
		},
	}
	cmd.Flags().StringVar(&restartCmd, "restart-cmd", "", "command restarting one node ({node}: its name or id, {id}: its id), run with sh -c")
	cmd.Flags().DurationVar(&settle, "settle", DefaultSettle, "how long to wait, before each node, for verify-cluster to pass")
	return cmd
}

func snapshotCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "snapshot --node N --group G",
		Short: "Take a Raft snapshot of group G on node N",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.Snapshot(cmd.Context(), node, group)
			if err != nil {
				return err
			}
			printBody(cmd, body)
			return nil
		},
	}
	nodeFlag(cmd, &node, "the node to snapshot on")
	groupFlag(cmd, &group)
	return cmd
}

func purgeLogCommand(ctl ctlFunc) *cobra.Command {
	var node, upto uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "purge-log --node N --group G --upto I",
		Short: "Purge group G's Raft log on node N through index I (at most through its last snapshot)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.PurgeLog(cmd.Context(), node, group, upto)
			if err != nil {
				return err
			}
			printBody(cmd, body)
			return nil
		},
	}
	nodeFlag(cmd, &node, "the node whose log to purge")
	groupFlag(cmd, &group)
	cmd.Flags().Uint64Var(&upto, "upto", 0, "last log index to purge")
	_ = cmd.MarkFlagRequired("upto")
	return cmd
}

func transferCommand(ctl ctlFunc) *cobra.Command {
	var node, to uint64
	var group uint32
	cmd := &cobra.Command{
		Use:   "transfer --node N --group G --to M",
		Short: "Hand group G's leadership from node N (its leader) to node M and wait until it moved",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			return c.Transfer(cmd.Context(), node, group, to)
		},
	}
	nodeFlag(cmd, &node, "the group's current leader")
	groupFlag(cmd, &group)
	cmd.Flags().Uint64Var(&to, "to", 0, "the voter to hand leadership to")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func membershipCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	var group uint32
	var voters string
	cmd := &cobra.Command{
		Use:   "membership --node N --group G --voters 1,2,3",
		Short: "Replace group G's voter set on its leader, node N (for repair: include every node that should stay a voter)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ids, err := parseIDs(voters)
			if err != nil {
				return fmt.Errorf("--voters: %w", err)
			}
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.Membership(cmd.Context(), node, group, ids)
			if err != nil {
				return err
			}
			printBody(cmd, body)
			return nil
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

func flushColdCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	var bucket, stream string
	cmd := &cobra.Command{
		Use:   "flush-cold --node N --bucket B --stream S",
		Short: "Flush one stream's hot bytes to the cold store now, on node N (its group's leader)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.FlushCold(cmd.Context(), node, bucket, stream)
			if err != nil {
				return err
			}
			printBody(cmd, body)
			return nil
		},
	}
	nodeFlag(cmd, &node, "the leader of the stream's group")
	cmd.Flags().StringVar(&bucket, "bucket", "", "the stream's bucket (__ds for the Durable Streams family)")
	cmd.Flags().StringVar(&stream, "stream", "", "the stream's name")
	_ = cmd.MarkFlagRequired("bucket")
	_ = cmd.MarkFlagRequired("stream")
	return cmd
}

func purgeBucketCommand(ctl ctlFunc) *cobra.Command {
	var node uint64
	var bucket string
	cmd := &cobra.Command{
		Use:   "purge-bucket --node N --bucket B",
		Short: "Erase bucket B for good through node N; fails unless the report proves completion",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.PurgeBucket(cmd.Context(), node, bucket)
			if body != nil {
				printBody(cmd, body)
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

// isTerminal reports whether progress bars go to out: Env.TTY when set,
// else whether out is a terminal.
func isTerminal(env *Env, out io.Writer) bool {
	if env.TTY != nil {
		return *env.TTY
	}
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
