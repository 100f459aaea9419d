package ursulactl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// ClusterStatus is what `ursulactl status` reports (its --json form).
type ClusterStatus struct {
	Nodes []NodeStatus `json:"nodes"`
	// GroupCount is the number of Raft groups the nodes report.
	GroupCount int `json:"group_count"`
	// Leaderships counts, per node id, the groups it leads.
	Leaderships map[uint64]int `json:"leaderships"`
	// GroupsWithoutLeader lists the groups no reachable node leads.
	GroupsWithoutLeader []uint32 `json:"groups_without_leader"`
}

// NodeStatus is one node's line of the status.
type NodeStatus struct {
	ID        uint64 `json:"id"`
	Name      string `json:"name,omitempty"`
	ClientURL string `json:"client_url"`
	AdminURL  string `json:"admin_url"`
	Reachable bool   `json:"reachable"`
	// Error is why the node is unreachable.
	Error              string `json:"error,omitempty"`
	Ready              bool   `json:"ready"`
	Reason             string `json:"reason,omitempty"`
	ClusterID          string `json:"cluster_id,omitempty"`
	ProcessIncarnation string `json:"process_incarnation,omitempty"`
	// ShedState is leadership_shed_state (normal, maintenance-drain).
	ShedState string `json:"shed_state,omitempty"`
	// Leaderships counts the groups this node names itself leader of.
	Leaderships int `json:"leaderships"`
}

// Status observes every node once.
func (c *Controller) Status(ctx context.Context) *ClusterStatus {
	return buildStatus(c.m, c.observe(ctx))
}

func buildStatus(m *Manifest, views []*NodeView) *ClusterStatus {
	counts, leaderless := leaderCounts(m, views)
	st := &ClusterStatus{GroupCount: groupCount(views), Leaderships: counts, GroupsWithoutLeader: leaderless}
	if st.GroupsWithoutLeader == nil {
		st.GroupsWithoutLeader = []uint32{}
	}
	for _, v := range views {
		ns := NodeStatus{ID: v.Node.ID, Name: v.Node.Name, ClientURL: v.Node.ClientURL, AdminURL: v.Node.AdminURL, Reachable: v.Reachable()}
		if !ns.Reachable {
			ns.Error = oneLine(v.Err.Error())
			ns.Reason = "unreachable"
			st.Nodes = append(st.Nodes, ns)
			continue
		}
		ns.Ready = v.IsReady()
		if !ns.Ready {
			ns.Reason = v.NotReadyReason()
		}
		ns.ClusterID = v.Metrics.ClusterID
		ns.ProcessIncarnation = v.Metrics.ProcessIncarnation
		ns.ShedState = v.Metrics.ShedState
		ns.Leaderships = len(v.Metrics.Led(v.Node.ID))
		st.Nodes = append(st.Nodes, ns)
	}
	return st
}

// Render writes the status as a table, then the leadership spread and
// the groups without a leader.
func (st *ClusterStatus) Render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCLIENT URL\tREACHABLE\tREADY\tREASON\tCLUSTER\tINCARNATION\tSHED\tLEADS")
	for _, n := range st.Nodes {
		name := fmt.Sprint(n.ID)
		if n.Name != "" {
			name += " (" + n.Name + ")"
		}
		if !n.Reachable {
			fmt.Fprintf(tw, "%s\t%s\tunreachable\t-\t%s\t-\t-\t-\t-\n", name, n.ClientURL, n.Error)
			continue
		}
		ready := "yes"
		if !n.Ready {
			ready = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\tyes\t%s\t%s\t%s\t%s\t%s\t%d\n", name, n.ClientURL, ready, dash(n.Reason), dash(n.ClusterID),
			dash(n.ProcessIncarnation), dash(n.ShedState), n.Leaderships)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var spread []string
	for _, n := range st.Nodes {
		spread = append(spread, fmt.Sprintf("node %d: %d", n.ID, st.Leaderships[n.ID]))
	}
	fmt.Fprintf(w, "\nleadership spread over %d groups: %s\n", st.GroupCount, strings.Join(spread, ", "))
	if len(st.GroupsWithoutLeader) == 0 {
		fmt.Fprintln(w, "groups without a leader: none")
	} else {
		fmt.Fprintf(w, "groups without a leader: %s\n", joinIDs(st.GroupsWithoutLeader))
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
