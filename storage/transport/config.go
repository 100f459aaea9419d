package transport

import (
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/ursula/ursula/internal/pki"
	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
)

// ProbeFunc answers a peer's Probe for the given groups (every group when
// groups is empty). It runs on a gRPC server goroutine and must not block
// for long.
type ProbeFunc func(groups []uint32) []*raftv1.ProbeResponse_GroupState

// ShedStateFunc answers a peer's GetShedState. The transport fills in
// cluster_id and node_id when the answer leaves them empty.
type ShedStateFunc func() *raftv1.ShedState

// Config configures a Transport.
type Config struct {
	// NodeID is this node's raft.node_id (non-zero); sent as ursula-node-id.
	NodeID uint64 `yaml:"node_id"`
	// ClusterID is server.cluster_id as the WAL holds it (non-empty); sent as
	// ursula-cluster-id and required of every inbound request.
	ClusterID string `yaml:"cluster_id"`
	// Peers maps every peer's node id to the host:port of its cluster
	// plane. An entry for NodeID itself is ignored.
	Peers map[uint64]string `yaml:"peers"`
	// QueueMessages bounds the messages waiting for one peer; a message
	// beyond it is dropped and reported unreachable. Default 4096.
	QueueMessages int `yaml:"queue_messages"`
	// QueueBytes bounds the entry bytes waiting for one peer (counted as
	// the entries' payload sizes); default 64 MiB.
	QueueBytes int `yaml:"queue_bytes"`
	// MaxBatchBytes bounds one MessageBatch on the wire; a single message
	// larger than it is sent alone. Default 8 MiB (at most MaxMessageBytes).
	MaxBatchBytes int `yaml:"max_batch_bytes"`
	// MaxMessageBytes is the largest gRPC message accepted or sent (the
	// server's MaxRecvMsgSize and the client's call limits); default 64 MiB.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// SnapshotChunkBytes is the data carried by one SnapshotChunk; default
	// 1 MiB (at most half of MaxMessageBytes).
	SnapshotChunkBytes int `yaml:"snapshot_chunk_bytes"`
	// MaxSnapshotsPerPeer bounds the snapshot sends in flight to one peer;
	// a MsgSnap beyond it is reported failed at once (Raft retries).
	// Default 4.
	MaxSnapshotsPerPeer int `yaml:"max_snapshots_per_peer"`
	// DialTimeout bounds a connection attempt and the stream handshake;
	// default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// BackoffMin is the first reconnect delay after a failed stream;
	// default 100ms. Each further failure doubles it up to BackoffMax.
	BackoffMin time.Duration `yaml:"backoff_min"`
	// BackoffMax caps the reconnect delay; default 5s.
	BackoffMax time.Duration `yaml:"backoff_max"`
	// RefusedRetry is the reconnect delay after a peer refused this node
	// (another cluster id or protocol); default 10s.
	RefusedRetry time.Duration `yaml:"refused_retry"`
	// KeepaliveTime is the interval of HTTP/2 pings on an idle connection,
	// which detect a dead peer; default 10s.
	KeepaliveTime time.Duration `yaml:"keepalive_time"`
	// MismatchWindow is how long a refusal keeps a configured peer listed
	// by PeerClusterMismatches; default 1 minute.
	MismatchWindow time.Duration `yaml:"mismatch_window"`
	// TLS secures the plane: peers are dialed over TLS and must present a
	// certificate proving the node id dialed, and every inbound call must
	// come over a connection whose client certificate proves the node id
	// its metadata names (ServerTLS, ServerOptions). Nil runs plaintext,
	// where the metadata is taken at its word: only for a loopback
	// development cluster.
	TLS *pki.Source `yaml:"-"`
	// DialOptions are added to every peer connection (stats handlers).
	DialOptions []grpc.DialOption `yaml:"-"`
	// Probe answers Probe requests; nil answers every group with no state.
	Probe ProbeFunc `yaml:"-"`
	// ShedState answers GetShedState requests; nil answers Unimplemented.
	ShedState ShedStateFunc `yaml:"-"`
}

// ErrInvalidConfig reports a configuration that cannot be used.
var ErrInvalidConfig = errors.New("transport: invalid config")

func (c *Config) setDefaults() {
	if c.QueueMessages <= 0 {
		c.QueueMessages = 4096
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 64 << 20
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 64 << 20
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = min(8<<20, c.MaxMessageBytes)
	}
	if c.SnapshotChunkBytes <= 0 {
		c.SnapshotChunkBytes = min(1<<20, c.MaxMessageBytes/2)
	}
	if c.MaxSnapshotsPerPeer <= 0 {
		c.MaxSnapshotsPerPeer = 4
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	if c.RefusedRetry <= 0 {
		c.RefusedRetry = 10 * time.Second
	}
	if c.KeepaliveTime <= 0 {
		c.KeepaliveTime = 10 * time.Second
	}
	if c.MismatchWindow <= 0 {
		c.MismatchWindow = time.Minute
	}
}

// Validate reports the first problem of a configuration (after defaults).
func (c *Config) Validate() error {
	switch {
	case c.NodeID == 0:
		return fmt.Errorf("%w: node_id must be non-zero", ErrInvalidConfig)
	case c.ClusterID == "":
		return fmt.Errorf("%w: cluster_id is empty", ErrInvalidConfig)
	case c.MaxBatchBytes > c.MaxMessageBytes:
		return fmt.Errorf("%w: max_batch_bytes %d exceeds max_message_bytes %d", ErrInvalidConfig, c.MaxBatchBytes, c.MaxMessageBytes)
	case c.SnapshotChunkBytes > c.MaxMessageBytes/2:
		return fmt.Errorf("%w: snapshot_chunk_bytes %d exceeds half of max_message_bytes %d", ErrInvalidConfig, c.SnapshotChunkBytes, c.MaxMessageBytes)
	}
	for id, addr := range c.Peers {
		if id == 0 {
			return fmt.Errorf("%w: peer id 0", ErrInvalidConfig)
		}
		if id == c.NodeID {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%w: peer %d address %q: %v", ErrInvalidConfig, id, addr, err)
		}
	}
	return nil
}
