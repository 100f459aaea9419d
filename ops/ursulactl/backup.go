package ursulactl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spf13/cobra"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/services/backup"
)

const backupLong = `Backups are self-contained, verifiable copies of the whole cluster, one
location (a directory, or s3://bucket/prefix with the AWS SDK credential
chain, AWS_REGION and, for S3-compatible stores, AWS_ENDPOINT_URL) holding
any number of them:

  backup-create   export every group from the replica with the highest commit
                  index, copy the cold objects they reference (only those the
                  location does not hold yet), write the manifest last
  backup-verify   check a backup at one of three depths; touches no cluster
  backup-list     the backups a location holds, oldest first
  restore         restore a backup into a fresh, empty cluster with the same
                  group count and cluster id (see ops/README.md); --plan prints
                  what it will do and its proof, --expect-proof P restores only
                  that plan (every node's process incarnation is bound in it)

Exit codes: 0 done, 1 error (a damaged backup, an unreachable node or store),
2 aborted by a safety check before anything was imported (another cluster id,
group count or format version; a group that holds data; cold objects missing
from the target; the location locked by another backup), 3 the restore plan's
proof differs from --expect-proof (nothing written).`

func backupCommands(a *app) []*cobra.Command {
	var (
		location string
		id       string
	)
	locFlag := func(cmd *cobra.Command) {
		cmd.Flags().StringVar(&location, "location", "", "the backup location: a directory or s3://bucket/prefix")
		_ = cmd.MarkFlagRequired("location")
		_ = cmd.MarkFlagDirname("location")
	}

	var co backup.CreateOptions
	var sourceCold string
	create := &cobra.Command{
		Use:   "backup-create --location L",
		Short: "Back up the whole cluster into a location (incremental, self-contained)",
		Long:  backupLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			loc, err := backup.OpenLocation(ctx, location)
			if err != nil {
				return err
			}
			if sourceCold != "" {
				if co.SourceColdStore, err = backup.OpenLocation(ctx, sourceCold); err != nil {
					return fmt.Errorf("--source-cold-store: %w", err)
				}
			}
			nodes, err := c.backupClients(ctx)
			if err != nil {
				return err
			}
			co.ID = id
			p := c.backupProgress("backup")
			co.Progress = p.update
			m, err := backup.Create(ctx, nodes, loc, co)
			p.finish()
			if err != nil {
				return backupError(err)
			}
			if a.o.json {
				return a.emit(m)
			}
			c.printf("backup %s complete in %s: %d groups, %d cold objects (%d copied, %s; %d already in the location)",
				m.ID, location, m.GroupCount, len(m.ColdObjects), m.Totals.CopiedObjects, byteSize(m.Totals.CopiedBytes), m.Totals.ReusedObjects)
			return nil
		},
	}
	locFlag(create)
	create.Flags().StringVar(&id, "id", "", "the backup's id (default: its UTC start time)")
	create.Flags().DurationVar(&co.HoldTTL, "hold-ttl", 0, "how long each hold on a group's cold GC lasts before it is renewed (default: the library's)")
	create.Flags().IntVar(&co.Concurrency, "concurrency", 0, "groups exported and copied at once (default: the library's)")
	create.Flags().StringVar(&sourceCold, "source-cold-store", "", "the cluster's cold store, when the nodes' own description of it does not reach it from here")

	var depthName string
	verify := &cobra.Command{
		Use:   "backup-verify --location L [--depth manifest|objects|deep]",
		Short: "Verify a backup (the latest, or --backup ID) without touching any cluster",
		Long:  backupLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			depth, err := backup.ParseDepth(depthName)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			loc, err := backup.OpenLocation(ctx, location)
			if err != nil {
				return err
			}
			p := newBackupProgress(a, "verify")
			rep, err := backup.Verify(ctx, loc, id, depth, p.update)
			p.finish()
			if a.o.json && rep != nil {
				if perr := a.emit(rep); perr != nil {
					return perr
				}
			}
			if err != nil {
				return backupError(err)
			}
			if !a.o.json {
				fmt.Fprintf(cmd.OutOrStdout(), "backup %s in %s verified at depth %s: %d groups, %d objects, %s\n",
					rep.ID, location, depthName, rep.Groups, rep.ColdObjects, byteSize(rep.Bytes))
			}
			return nil
		},
	}
	locFlag(verify)
	verify.Flags().StringVar(&id, "backup", "", "the backup to verify, by id or manifest key (backups/<id>/manifest.json; default: the latest complete one)")
	verify.Flags().StringVar(&depthName, "depth", "objects", "manifest (complete, sizes match), objects (every BLAKE3 digest), deep (every group decodes and validates, every cold object it references is present)")

	list := &cobra.Command{
		Use:   "backup-list --location L",
		Short: "List the complete backups a location holds, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			loc, err := backup.OpenLocation(ctx, location)
			if err != nil {
				return err
			}
			ms, err := backup.List(ctx, loc)
			if err != nil {
				return backupError(err)
			}
			if a.o.json {
				if ms == nil {
					return a.emit([]any{})
				}
				return a.emit(ms)
			}
			for _, m := range ms {
				fmt.Fprintf(cmd.OutOrStdout(), "%s  cluster %s  %d groups  %d cold objects  created %s\n",
					m.ID, m.ClusterID, m.GroupCount, len(m.ColdObjects), m.CreatedAt)
			}
			return nil
		},
	}
	locFlag(list)

	var ro backup.RestoreOptions
	var (
		targetCold, expectProof string
		planOnly                bool
	)
	restore := &cobra.Command{
		Use:   "restore --location L [--backup ID]",
		Short: "Restore a backup into the manifest's fresh, empty cluster (same group count and cluster id; asks for confirmation unless --plan)",
		Long:  backupLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			loc, err := backup.OpenLocation(ctx, location)
			if err != nil {
				return err
			}
			if targetCold != "" {
				if ro.ColdStore, err = backup.OpenLocation(ctx, targetCold); err != nil {
					return fmt.Errorf("--cold-store: %w", err)
				}
			}
			plan, nodes, err := c.planRestore(ctx, loc, id, targetCold)
			if err != nil {
				return backupError(err)
			}
			if planOnly {
				if a.o.json {
					return a.emit(struct {
						*RestorePlan
						Proof string `json:"proof"`
					}{plan, plan.Proof})
				}
				printRestorePlan(cmd.OutOrStdout(), plan, a.o.manifest)
				return nil
			}
			if expectProof != "" && expectProof != plan.Proof {
				return codedf(ExitProofMismatch, "the restore plan changed since it was reviewed: new proof %s (expected %s); nothing was written; review it with restore --plan", plan.Proof, expectProof)
			}
			if err := a.confirm(ctx, Confirmation{
				Verb: "restore",
				Action: fmt.Sprintf("import backup %s (%d groups, plan proof %s) into the cluster of %d nodes, starting a new history of every group (new Stream-Incarnation tokens, producer epochs closed)",
					plan.Backup, plan.GroupCount, plan.Proof, len(c.Manifest().Nodes)),
			}); err != nil {
				return err
			}
			p := c.backupProgress("restore")
			ro.Progress = p.update
			rep, err := backup.Restore(ctx, nodes, loc, plan.Backup, ro)
			p.finish()
			if err != nil {
				return backupError(err)
			}
			if a.o.json {
				return a.emit(struct {
					*backup.RestoreReport
					Proof string `json:"proof"`
				}{rep, plan.Proof})
			}
			c.printf("restored backup %s: %d groups imported, %d already imported; %d cold objects copied (%s), %d already in the cold store; proof %s",
				rep.ID, rep.Imported, rep.Already, rep.ObjectsCopied, byteSize(rep.BytesCopied), rep.ObjectsSkipped, plan.Proof)
			return nil
		},
	}
	locFlag(restore)
	restore.Flags().StringVar(&id, "backup", "", "the backup to restore, by id or manifest key (backups/<id>/manifest.json; default: the latest complete one)")
	restore.Flags().StringVar(&targetCold, "cold-store", "", "the target cluster's cold store (default: the one the nodes report)")
	restore.Flags().IntVar(&ro.Concurrency, "concurrency", 0, "objects copied and groups imported at once (default: the library's)")
	restore.Flags().BoolVar(&planOnly, "plan", false, "print the restore's plan (consequences, bindings, the apply command) and its proof, and change nothing")
	restore.Flags().StringVar(&expectProof, "expect-proof", "", "restore only if the plan's proof is this one (the one --plan printed)")
	return []*cobra.Command{create, verify, list, restore}
}

// backupClients pins every node of the manifest that answers and returns
// its BackupService over the admin plane: a backup needs one replica of
// each group.
func (c *Controller) backupClients(ctx context.Context) ([]backupv1.BackupServiceClient, error) {
	var out []backupv1.BackupServiceClient
	var errs []error
	for _, n := range c.m.Nodes {
		p, _, err := c.pinNode(ctx, n.ID)
		if err != nil {
			if errors.Is(err, ErrAborted) {
				return nil, err
			}
			errs = append(errs, err)
			c.printf("warning: node %d: %v (backing up from the others)", n.ID, err)
			continue
		}
		out = append(out, &adminBackupClient{p: p})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no node answered: %w", errors.Join(errs...))
	}
	return out, nil
}

// backupError maps the library's refusals to a safety abort (exit 2):
// nothing was imported or written.
func backupError(err error) error {
	switch {
	case errors.Is(err, backup.ErrPrecondition), errors.Is(err, backup.ErrMissingCold), errors.Is(err, backup.ErrLocked):
		return &abortError{msg: err.Error(), cause: err}
	}
	return err
}

// backupProgress shows a backup or restore's progress: a bar on a
// terminal, a plain line per step otherwise, nothing with --json.
type backupProgress struct {
	mu       sync.Mutex
	bar      *progress
	out      io.Writer
	quiet    bool
	verb     string
	last     backup.Progress
	lastLine time.Time
	// lastTenth is the tenth of the groups done at the last line.
	lastTenth int
	now       func() time.Time
}

func (c *Controller) backupProgress(verb string) *backupProgress {
	quiet := c.opts.Progress == nil
	p := &backupProgress{out: c.opts.Progress, quiet: quiet, verb: verb, now: c.now}
	if !quiet {
		p.bar = c.newProgress(verb, true)
	}
	return p
}

// newBackupProgress is backupProgress for a verb that reaches no node
// (backup-verify), so has no Controller.
func newBackupProgress(a *app, verb string) *backupProgress {
	c := &Controller{out: a.resultOut(), opts: Options{Progress: a.progressOut(), TTY: isTerminal(a.env.TTY, a.env.Stderr), Now: a.env.Now}}
	return c.backupProgress(verb)
}

func (p *backupProgress) update(pr backup.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	phaseChanged := pr.Phase != p.last.Phase
	groupDone := pr.GroupsDone != p.last.GroupsDone
	p.last = pr
	if p.quiet {
		return
	}
	line := describeProgress(pr, p.now())
	if p.bar.bar != nil {
		total := pr.Groups
		done := pr.GroupsDone
		if pr.TotalObjects > 0 && pr.Phase != "" && pr.Groups == 0 {
			total, done = int(pr.TotalObjects), int(pr.Objects)
		}
		p.bar.set(done, total, line)
		return
	}
	// Without a terminal: a line per phase, per tenth of the groups done,
	// and one every 5 s in between.
	tenth := 0
	if pr.Groups > 0 {
		tenth = pr.GroupsDone * 10 / pr.Groups
	}
	tenthDone := groupDone && tenth != p.lastTenth
	if now := p.now(); phaseChanged || tenthDone || now.Sub(p.lastLine) >= 5*time.Second {
		p.lastTenth = tenth
		p.lastLine = now
		fmt.Fprintf(p.out, "%s: %s\n", p.verb, line)
	}
}

func (p *backupProgress) finish() {
	if p.bar != nil {
		p.bar.finish()
	}
}

// describeProgress renders one progress report: phase, groups, objects,
// bytes, rate and, when the total is known, the time left.
func describeProgress(pr backup.Progress, now time.Time) string {
	s := pr.Phase
	if pr.Groups > 0 {
		s += fmt.Sprintf("  groups %d/%d", pr.GroupsDone, pr.Groups)
	}
	if pr.TotalObjects > 0 {
		s += fmt.Sprintf("  objects %d/%d", pr.Objects, pr.TotalObjects)
	} else if pr.Objects > 0 {
		s += fmt.Sprintf("  objects %d", pr.Objects)
	}
	s += "  " + byteSize(pr.Bytes)
	if pr.TotalBytes > 0 {
		s += "/" + byteSize(pr.TotalBytes)
	}
	if el := now.Sub(pr.Started); !pr.Started.IsZero() && el > time.Second && pr.Bytes > 0 {
		rate := float64(pr.Bytes) / el.Seconds()
		s += fmt.Sprintf("  %s/s", byteSize(int64(rate)))
		if pr.TotalBytes > pr.Bytes && rate > 0 {
			s += fmt.Sprintf("  ETA %s", time.Duration(float64(pr.TotalBytes-pr.Bytes)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	return s
}

// byteSize renders n bytes for a person.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
