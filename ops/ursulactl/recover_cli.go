package ursulactl

import (
	"path/filepath"

	"github.com/spf13/cobra"
)

const recoverLong = `recover-group recovers one Raft group whose gated replicas stalled after a
host crash or power loss cost a majority of its voters the unsynced tail of
their journals (readiness recovery_stalled). Only an operator can accept
that writes acknowledged after the last fsync may be gone:

  diagnose   every replica's state, the gates, what is stalled and why (read-only)
  plan       the plan: consequences first, bindings, steps, whether apply is
             possible now, the apply command and, last, its proof (read-only)
  apply      recomputes the plan and applies it only if its proof is the one
             given; journaled before its first write; never retried by itself

Exit codes: 0 done, 1 error, 2 aborted by a safety check, 3 the proof
differs (nothing written), 4 the operation diverged (see its journal),
5 manual repair (no plan can prove what the group committed).`

func recoverCommand(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "recover-group",
		Short: "Recover a stalled Raft group after a host crash: diagnose, plan, apply (accept-unsynced-loss)",
		Long:  recoverLong,
	}
	var group uint32
	diagnose := &cobra.Command{
		Use:   "diagnose --group G",
		Short: "Print every replica's state of group G, what is stalled and why, and what answers it (read-only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			d, err := c.diagnose(cmd.Context(), group)
			if err != nil {
				return err
			}
			return a.done(d)
		},
	}
	plan := &cobra.Command{
		Use:   "plan --group G",
		Short: "Compute and print group G's recovery plan and its proof (read-only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			p, err := c.Plan(cmd.Context(), group)
			if err != nil {
				return err
			}
			if a.o.json {
				return a.emit(struct {
					*RecoveryPlan
					Proof string `json:"proof"`
				}{p, p.Proof})
			}
			c.PrintPlan(p)
			return nil
		},
	}
	var ao ApplyOptions
	apply := &cobra.Command{
		Use:   "apply --group G --expect-proof P --actor NAME --reason TEXT",
		Short: "Apply group G's recovery plan if its recomputed proof is P",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			if ao.JournalDir == "" {
				ao.JournalDir = filepath.Join(filepath.Dir(a.o.manifest), ".ursulactl", "recovery")
			}
			res, err := c.apply(cmd.Context(), group, ao)
			if err != nil {
				return err
			}
			return a.done(res)
		},
	}
	apply.Flags().StringVar(&ao.ExpectProof, "expect-proof", "", "the proof the reviewed plan printed")
	_ = apply.MarkFlagRequired("expect-proof")
	apply.Flags().IntVar(&ao.MaxPlans, "max-plans", 1, "plans to try in all: the first, and new ones when the plan's leader refuses or the plan wedges")
	apply.Flags().StringVar(&ao.JournalDir, "journal-dir", "", "where operations are journaled (default .ursulactl/recovery beside the manifest)")
	for _, c := range []*cobra.Command{diagnose, plan, apply} {
		groupFlag(c, &group)
		root.AddCommand(c)
	}
	return root
}
