package cluster

import (
	"time"

	"github.com/ursula/ursula/internal/pki"
)

// Peer is one voter of the cluster.
type Peer struct {
	// ID is the peer's raft.node_id.
	ID uint64 `toml:"id"`
	// ClusterURL is the host:port of the peer's cluster plane (Raft).
	ClusterURL string `toml:"cluster_url"`
	// ClientURL is the host:port of the peer's client plane (gRPC data API).
	ClientURL string `toml:"client_url"`
}

// Config configures the cluster side of one node.
type Config struct {
	// NodeID is this node's raft.node_id.
	NodeID uint64
	// ClusterID is server.cluster_id; the WAL is bound to it.
	ClusterID string
	// DataDir holds the WAL; the cluster id is recorded in it.
	DataDir string
	// Peers are every voter, this node included; empty or one means a
	// single-node cluster of NodeID.
	Peers []Peer
	// MaxMessageBytes bounds one cluster-plane gRPC message.
	MaxMessageBytes int
	// TLS is this node's cluster-plane certificate and the cluster CA
	// (mutual TLS between nodes; see transport.Config.TLS); nil runs the
	// plane plaintext, for a loopback development cluster only.
	TLS *pki.Source
	// LeadershipTick is the period of the leadership upkeep (balancer,
	// watchdog, membership, rebuilds); default 1s.
	LeadershipTick time.Duration
	// CommitStall is how long a leader's log may hold entries it cannot
	// commit before the watchdog hands leadership away; default 5s.
	CommitStall time.Duration
}

func (c *Config) setDefaults() {
	if c.LeadershipTick <= 0 {
		c.LeadershipTick = time.Second
	}
	if c.CommitStall <= 0 {
		c.CommitStall = 5 * time.Second
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 64 << 20
	}
}

// Voters returns the voter ids: the peers, or this node alone.
func (c *Config) Voters() []uint64 {
	if len(c.Peers) == 0 {
		return []uint64{c.NodeID}
	}
	ids := make([]uint64, 0, len(c.Peers))
	for _, p := range c.Peers {
		ids = append(ids, p.ID)
	}
	return ids
}

// MultiNode reports a cluster of more than one voter.
func (c *Config) MultiNode() bool { return len(c.Peers) > 1 }
