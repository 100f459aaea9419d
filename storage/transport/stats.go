package transport

import (
	"slices"
	"sync/atomic"
)

// counters are the transport's cumulative figures.
type counters struct {
	peerClusterRefusals      atomic.Uint64
	unidentifiedRefusals     atomic.Uint64
	unauthenticatedRefusals  atomic.Uint64
	tlsHandshakeRefusals     atomic.Uint64
	protocolRefusalsReceived atomic.Uint64

	messagesSent, batchesSent, bytesSent             atomic.Uint64
	messagesReceived, batchesReceived, bytesReceived atomic.Uint64
	dropped, badMessages, stepErrors                 atomic.Uint64

	snapshotsSent, snapshotsFailed, snapshotsReceived atomic.Uint64
	snapshotBytesSent, snapshotBytesReceived          atomic.Uint64
}

// Stats is a point-in-time view of the transport's counters (cumulative
// since New) and peers.
type Stats struct {
	// PeerClusterRefusals counts refusals for another cluster id, both ways
	// (raft_grpc_peer_cluster_refusals).
	PeerClusterRefusals uint64 `json:"raft_grpc_peer_cluster_refusals"`
	// UnidentifiedPeerRefusals counts requests refused for naming no
	// cluster id (raft_grpc_unidentified_peer_refusals).
	UnidentifiedPeerRefusals uint64 `json:"raft_grpc_unidentified_peer_refusals"`
	// UnauthenticatedPeerRefusals counts requests refused because the
	// sender's certificate does not prove the node id it names, or names
	// no configured peer (raft_grpc_unauthenticated_peer_refusals).
	UnauthenticatedPeerRefusals uint64 `json:"raft_grpc_unauthenticated_peer_refusals"`
	// TLSHandshakeRefusals counts connections to the cluster plane closed
	// in their TLS handshake: no client certificate, one of another CA,
	// an expired one (raft_grpc_tls_handshake_refusals).
	TLSHandshakeRefusals uint64 `json:"raft_grpc_tls_handshake_refusals"`
	// ProtocolRefusalsReceived counts peers refusing this node's requests
	// as a protocol mismatch.
	ProtocolRefusalsReceived uint64 `json:"raft_grpc_protocol_refusals_received"`

	MessagesSent     uint64 `json:"raft_messages_sent"`
	BatchesSent      uint64 `json:"raft_batches_sent"`
	BytesSent        uint64 `json:"raft_bytes_sent"`
	MessagesReceived uint64 `json:"raft_messages_received"`
	BatchesReceived  uint64 `json:"raft_batches_received"`
	BytesReceived    uint64 `json:"raft_bytes_received"`
	// MessagesDropped counts messages not sent (queue full, no stream,
	// unknown peer); each was reported unreachable.
	MessagesDropped uint64 `json:"raft_messages_dropped"`
	// BadMessages counts inbound messages that could not be decoded or
	// were addressed to another node.
	BadMessages uint64 `json:"raft_bad_messages_received"`
	// StepErrors counts inbound messages the host refused.
	StepErrors uint64 `json:"raft_step_errors"`

	SnapshotsSent         uint64 `json:"raft_snapshots_sent"`
	SnapshotsFailed       uint64 `json:"raft_snapshots_failed"`
	SnapshotsReceived     uint64 `json:"raft_snapshots_received"`
	SnapshotBytesSent     uint64 `json:"raft_snapshot_bytes_sent"`
	SnapshotBytesReceived uint64 `json:"raft_snapshot_bytes_received"`

	// Peers are the configured peers, ordered by node id.
	Peers []PeerStats `json:"raft_peers"`
}

// PeerStats is the state of the sender towards one peer.
type PeerStats struct {
	NodeID  uint64 `json:"node_id"`
	Address string `json:"address"`
	// Connected is set while a Stream to the peer is open and accepted.
	Connected bool `json:"connected"`
	// Refused is set while the peer refuses this node, for the reason in
	// Refusal: "peer_cluster_mismatch" (another cluster id) or
	// "protocol_mismatch" (the peer found no cluster id: another format
	// epoch).
	Refused bool   `json:"refused"`
	Refusal string `json:"refusal,omitempty"`
	// Queued is the number of messages waiting.
	Queued int `json:"queued"`
	// SnapshotsInFlight is the number of snapshot sends in progress.
	SnapshotsInFlight int `json:"snapshots_in_flight"`
}

// Stats returns the transport's counters and per-peer state.
func (t *Transport) Stats() Stats {
	c := &t.stats
	s := Stats{
		PeerClusterRefusals:         c.peerClusterRefusals.Load(),
		UnidentifiedPeerRefusals:    c.unidentifiedRefusals.Load(),
		UnauthenticatedPeerRefusals: c.unauthenticatedRefusals.Load(),
		TLSHandshakeRefusals:        c.tlsHandshakeRefusals.Load(),
		ProtocolRefusalsReceived:    c.protocolRefusalsReceived.Load(),
		MessagesSent:                c.messagesSent.Load(),
		BatchesSent:                 c.batchesSent.Load(),
		BytesSent:                   c.bytesSent.Load(),
		MessagesReceived:            c.messagesReceived.Load(),
		BatchesReceived:             c.batchesReceived.Load(),
		BytesReceived:               c.bytesReceived.Load(),
		MessagesDropped:             c.dropped.Load(),
		BadMessages:                 c.badMessages.Load(),
		StepErrors:                  c.stepErrors.Load(),
		SnapshotsSent:               c.snapshotsSent.Load(),
		SnapshotsFailed:             c.snapshotsFailed.Load(),
		SnapshotsReceived:           c.snapshotsReceived.Load(),
		SnapshotBytesSent:           c.snapshotBytesSent.Load(),
		SnapshotBytesReceived:       c.snapshotBytesReceived.Load(),
	}
	for _, p := range t.peerList() {
		p.refusedMu.Lock()
		refused, refusal := p.refused, p.refusal
		p.refusedMu.Unlock()
		s.Peers = append(s.Peers, PeerStats{
			NodeID:            p.id,
			Address:           p.addr,
			Connected:         p.connected.Load(),
			Refused:           refused,
			Refusal:           refusal,
			Queued:            p.queueLen(),
			SnapshotsInFlight: int(p.snaps.Load()),
		})
	}
	slices.SortFunc(s.Peers, func(a, b PeerStats) int {
		switch {
		case a.NodeID < b.NodeID:
			return -1
		case a.NodeID > b.NodeID:
			return 1
		}
		return 0
	})
	return s
}
