package ursulactl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
)

// Feature levels (ops/README.md, "Upgrading"): GET and POST
// /__ursula/feature-level on one node's admin plane. The node asks every
// member of the cluster itself, so one node answers for all.

// FeatureLevel reads node id's view of the feature levels (GET
// /__ursula/feature-level): its replicas' levels and what every member's
// build knows.
func (c *Controller) FeatureLevel(ctx context.Context, id uint64) ([]byte, error) {
	nc, err := c.client(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	url := nc.node.AdminURL + "/__ursula/feature-level"
	status, rh, body, err := nc.request(ctx, http.MethodGet, url, nil, true)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if status != http.StatusOK {
		return nil, statusError(http.MethodGet, url, status, rh, body)
	}
	return body, nil
}

// EnableFeature raises the cluster's feature level to level through node
// id (POST /__ursula/feature-level, pinned to the node's incarnation). The
// node refuses (409 FEATURE_LEVEL_UNSUPPORTED, the body naming the nodes)
// unless every member runs a release that knows the level; a raise that
// stopped part way is completed by running it again.
func (c *Controller) EnableFeature(ctx context.Context, id uint64, level uint32) ([]byte, error) {
	if level == 0 {
		return nil, errors.New("enable-feature: --level is required (a feature level, 1 or more)")
	}
	p, _, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("enable-feature: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	body, _, err := p.send(ctx, http.MethodPost, "/__ursula/feature-level", h, bytes.NewReader(fmt.Appendf(nil, `{"level":%d}`, level)))
	if err != nil {
		return nil, fmt.Errorf("enable-feature level %d through node %d: %w", level, id, err)
	}
	return body, nil
}

// clusterCommand groups the verbs about the cluster as a whole.
func clusterCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Cluster-wide settings: feature levels",
	}
	cmd.AddCommand(featureLevelCommand(a), enableFeatureCommand(a))
	return cmd
}

// firstNode is --node, or the manifest's first node.
func firstNode(c *Controller, node uint64) uint64 {
	if node == 0 && len(c.m.Nodes) > 0 {
		return c.m.Nodes[0].ID
	}
	return node
}

func featureLevelCommand(a *app) *cobra.Command {
	var node uint64
	cmd := &cobra.Command{
		Use:   "feature-level [--node N]",
		Short: "Show the cluster's feature level, the highest level each node's build knows, and groups a node stopped applying",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.FeatureLevel(cmd.Context(), firstNode(c, node))
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	cmd.Flags().Uint64Var(&node, "node", 0, "the node to ask (default: the manifest's first)")
	return cmd
}

func enableFeatureCommand(a *app) *cobra.Command {
	var node uint64
	var level uint32
	cmd := &cobra.Command{
		Use:   "enable-feature --level N [--node N]",
		Short: "Raise the cluster's feature level to N once every node runs a release that knows it (never lowered again; asks for confirmation)",
		Long: `Raise the cluster's feature level: the replicated behaviours (new commands,
new snapshot fields) a release may use. The node asked checks that every voter
runs a release that knows the level and refuses otherwise (409, naming the
nodes); then it raises every Raft group. After a raise, no node may run a
release that does not know the level: such a node stops applying the raised
groups and reports /__ursula/ready 503 feature_level_unsupported. As the raise
cannot be undone, it asks for confirmation (--yes off a terminal).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if level == 0 {
				return errors.New("enable-feature: --level is required (a feature level, 1 or more)")
			}
			if err := a.confirm(cmd.Context(), Confirmation{
				Verb:   "enable-feature",
				Action: fmt.Sprintf("raise the cluster's feature level to %d for good (it is never lowered; a node of an older release then stops applying)", level),
			}); err != nil {
				return err
			}
			c, err := a.ctl(cmd, 0)
			if err != nil {
				return err
			}
			body, err := c.EnableFeature(cmd.Context(), firstNode(c, node), level)
			if err != nil {
				return err
			}
			return a.printBody(cmd, body)
		},
	}
	cmd.Flags().Uint64Var(&node, "node", 0, "the node to send the raise to (default: the manifest's first)")
	cmd.Flags().Uint32Var(&level, "level", 0, "the feature level to raise to")
	_ = cmd.MarkFlagRequired("level")
	return cmd
}
