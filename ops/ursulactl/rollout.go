package ursulactl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// RestartFunc restarts one node's process (through the platform: systemd,
// Helm, a test harness) and returns once the restart was issued or done;
// Rollout then waits for the node itself.
type RestartFunc func(ctx context.Context, n Node) error

// Rollout restarts the manifest's nodes one at a time, in manifest order.
// For each node it:
//
//  1. waits, up to Options.Settle, until verify-cluster finds no problem,
//     and aborts otherwise (so no other node is unready);
//  2. drains it (see Drain: its own precondition and pinned incarnation);
//  3. runs restart;
//  4. waits until it is back (see WaitNode) and checks that its process
//     incarnation changed (the restart happened);
//  5. lifts the drain (Undrain, with the new incarnation pinned).
//
// It stops at the first failure; a safety abort matches ErrAborted. A node
// whose rollout stopped after step 2 may be left drained: its error says
// so.
func (c *Controller) Rollout(ctx context.Context, restart RestartFunc) error {
	_, err := c.rollout(ctx, restart)
	return err
}

// RolloutResult is what a rollout did (rollout's --json document).
type RolloutResult struct {
	Nodes []RolloutNode `json:"nodes"`
	// Seconds is the whole rollout's duration.
	Seconds float64 `json:"seconds"`
}

// RolloutNode is one node's restart.
type RolloutNode struct {
	Node uint64 `json:"node"`
	// Incarnations before and after the restart.
	FromIncarnation string  `json:"from_incarnation"`
	ToIncarnation   string  `json:"to_incarnation"`
	Seconds         float64 `json:"seconds"`
}

// rollout is Rollout; it returns what it did.
func (c *Controller) rollout(ctx context.Context, restart RestartFunc) (*RolloutResult, error) {
	if restart == nil {
		return nil, errors.New("rollout: no restart command")
	}
	total := len(c.m.Nodes)
	start := time.Now()
	res := &RolloutResult{Nodes: []RolloutNode{}}
	for i, n := range c.m.Nodes {
		began := time.Now()
		c.printf("rollout: node %d (%d/%d): checking the cluster", n.ID, i+1, total)
		sctx, cancel := context.WithTimeout(ctx, c.opts.Settle)
		err := c.waitHealthy(sctx, fmt.Sprintf("rollout: before node %d", n.ID))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("rollout: %w", ctx.Err())
			}
			return nil, abortf("rollout stopped before node %d: the cluster is %s", n.ID, err.Error())
		}
		c.printf("rollout: node %d: draining", n.ID)
		p, _, err := c.drain(ctx, n.ID)
		if err != nil {
			return nil, fmt.Errorf("rollout: %w%s", err, leftDrained(p, n.ID))
		}
		c.printf("rollout: node %d: restarting", n.ID)
		if err := restart(ctx, n); err != nil {
			return nil, fmt.Errorf("rollout: restart node %d: %w%s", n.ID, err, leftDrained(p, n.ID))
		}
		c.printf("rollout: node %d: waiting until it is a caught-up voter of every group", n.ID)
		if err := c.WaitNode(ctx, n.ID); err != nil {
			return nil, fmt.Errorf("rollout: %w%s", err, leftDrained(p, n.ID))
		}
		m, err := c.clients[n.ID].Metrics(ctx)
		if err != nil {
			return nil, fmt.Errorf("rollout: node %d: %w", n.ID, err)
		}
		if m.ProcessIncarnation == p.Incarnation {
			return nil, fmt.Errorf("rollout: node %d was not restarted: its process incarnation is still %s after the restart command%s",
				n.ID, p.Incarnation, leftDrained(p, n.ID))
		}
		if err := c.Undrain(ctx, n.ID); err != nil {
			return nil, fmt.Errorf("rollout: %w", err)
		}
		took := time.Since(began)
		res.Nodes = append(res.Nodes, RolloutNode{Node: n.ID, FromIncarnation: p.Incarnation, ToIncarnation: m.ProcessIncarnation, Seconds: took.Seconds()})
		c.printf("rollout: node %d: done in %v", n.ID, took.Round(100*time.Millisecond))
	}
	res.Seconds = time.Since(start).Seconds()
	c.printf("rollout: all %d nodes restarted in %v", total, time.Since(start).Round(100*time.Millisecond))
	return res, nil
}

// leftDrained is the hint of an error after a drain was sent.
func leftDrained(p *Pinned, id uint64) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(" (node %d may be left in maintenance drain: run `ursulactl undrain --node %d` once it is healthy)", id, id)
}

// CommandRestart returns a RestartFunc that runs tmpl with sh -c, {node}
// replaced by the node's name (its id when it has none) and {id} by its
// id, with the command's output on out. A non-zero exit is an error.
func CommandRestart(tmpl string, out io.Writer) (RestartFunc, error) {
	if strings.TrimSpace(tmpl) == "" {
		return nil, errors.New("rollout needs --restart-cmd (how to restart one node, with {node} or {id})")
	}
	if !strings.Contains(tmpl, "{node}") && !strings.Contains(tmpl, "{id}") {
		return nil, fmt.Errorf("--restart-cmd %q names no node: use {node} or {id}", tmpl)
	}
	return func(ctx context.Context, n Node) error {
		line := ExpandRestart(tmpl, n)
		cmd := exec.CommandContext(ctx, "sh", "-c", line)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%q: %w", line, err)
		}
		return nil
	}, nil
}

// ExpandRestart replaces {node} and {id} in a --restart-cmd template.
// Names are restricted to letters, digits, '.', '_' and '-' (see
// Manifest.Validate), so the result needs no quoting.
func ExpandRestart(tmpl string, n Node) string {
	return strings.NewReplacer("{node}", n.DisplayName(), "{id}", strconv.FormatUint(n.ID, 10)).Replace(tmpl)
}
