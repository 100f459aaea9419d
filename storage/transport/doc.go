// Package transport carries Raft messages between storage nodes over gRPC
// (ursula.raft.v1.RaftService on the cluster plane). A *Transport is both
// the sending side, plugged into storage/multiraft as its Transport, and
// the receiving side, registered on the node's cluster-plane gRPC server.
//
// # Identity
//
// Every RPC a node sends carries two metadata entries: ursula-cluster-id
// (server.cluster_id, as the node's WAL holds it) and ursula-node-id (its
// raft.node_id in decimal). The receiving node checks them in a gRPC tap
// handle (ServerOptions), which runs when the request's headers arrive,
// before the stream exists and before any request message is decoded:
//
//   - no cluster id or no valid node id: FAILED_PRECONDITION with the text
//     "raft protocol mismatch: request names no cluster id (format epoch
//     mismatch?)" and an ErrorInfo (domain "ursula", reason
//     RAFT_PROTOCOL_MISMATCH). Counted in
//     raft_grpc_unidentified_peer_refusals; each sender address is logged
//     once.
//   - another cluster id: FAILED_PRECONDITION whose message names the
//     refusing node's id and cluster id, with an ErrorInfo (domain
//     "ursula", reason PEER_CLUSTER_MISMATCH, metadata node_id and
//     cluster_id of the refusing node). Counted in
//     raft_grpc_peer_cluster_refusals and logged once per sender (again
//     only after a minute without refusals of it).
//
// A sender that receives a PEER_CLUSTER_MISMATCH refusal counts it in
// raft_grpc_peer_cluster_refusals too, logs it once at error level while
// the peer keeps refusing, treats the peer as unreachable and retries the
// stream every RefusedRetry (default 10s) on the same connection.
// PeerClusterMismatches lists the configured peers refused either way
// within the last minute; an inbound refusal counts for a configured peer
// when the request claims its node id and, when the peer's configured
// address is an IP address, comes from that address.
//
// # Authentication
//
// A call of this cluster is then authenticated (PERMISSION_DENIED
// otherwise, counted in raft_grpc_unauthenticated_peer_refusals and logged
// once per sender and reason within the mismatch window, readiness
// untouched): the node id it names must be a configured peer other than
// this node, and with Config.TLS its connection's client certificate,
// verified against the cluster CA in the TLS handshake, must prove exactly
// that node id (urn:ursula:node:<id>, package pki). A connection without a
// certificate of the cluster CA does not get past the handshake
// (ServerTLS; counted in raft_grpc_tls_handshake_refusals by the listener
// through HandshakeRefused). Peers are dialed over TLS and must prove the
// node id dialed. Every Raft message received must name the sender as its
// From (others are counted as bad and dropped), so a node speaks in Raft
// for itself only. Without Config.TLS the plane is plaintext and the
// metadata is taken at its word: a loopback development cluster only.
//
// # Messages
//
// Send never blocks: it appends each message to its destination peer's
// bounded queue (QueueMessages, QueueBytes); a message that does not fit,
// or that names an unknown peer, is dropped and reported with
// ReportUnreachable (Raft retransmits). One goroutine per peer owns one
// long-lived Stream RPC. The receiver answers a new stream with one
// StreamAck (batches = 0) as a handshake; only then does the sender mark
// the peer connected and start sending. Whenever the queue is non-empty
// the sender takes everything queued and sends it as MessageBatches of at
// most MaxBatchBytes (a larger single message goes alone): there is no
// timer, so a message waits only for the previous batch's write. Each
// GroupMessage holds a group id and one raftpb.Message in its protobuf
// encoding. When the stream breaks, the unsent messages and everything
// queued while there is no stream are reported unreachable, and the
// sender reconnects after a capped exponential backoff (BackoffMin
// doubling to BackoffMax, ±20% jitter).
//
// The receiver decodes each message and steps it into its group;
// undecodable messages, messages addressed to another node and messages
// the host refuses are counted and skipped, never ending the stream.
//
// # Snapshots
//
// A MsgSnap goes through SendSnapshot on its own goroutine (at most
// MaxSnapshotsPerPeer per peer; beyond that it is reported failed at
// once). The first SnapshotChunk carries the group id and the
// raftpb.Message without its snapshot data; every chunk carries the next
// slice of the data (SnapshotChunkBytes, default 1 MiB); the last chunk
// has last = true (a snapshot without data is one chunk). The receiver
// reassembles the data into the message's snapshot, steps it, and
// answers SendSnapshotResponse; the sender then calls
// ReportSnapshot(group, to, false), and ReportSnapshot(group, to, true)
// plus ReportUnreachable on any failure.
//
// # Probe and shed state
//
// Probe and GetShedState are answered from callbacks the node provides
// (Config.Probe / SetProbeFunc, Config.ShedState / SetShedStateFunc) and
// called with (*Transport).Probe and GetShedState. A shed state answer is
// accepted only when it names this node's cluster id.
//
// # Peers
//
// Config.Peers is the initial peer set; AddPeer and RemovePeer change it
// for membership changes (a re-addressed peer gets a new sender and
// connection). Stats reports, per peer, whether its stream is connected
// and whether it refuses this node (Refusal "peer_cluster_mismatch" or
// "protocol_mismatch", the latter being another format epoch).
//
// # Lifecycle
//
// New starts nothing. Run starts the peer senders and blocks until its
// context ends or Close is called; then it stops every goroutine, closes
// every connection and makes inbound streams end (so that the gRPC
// server can stop gracefully). Close the transport before stopping the
// cluster-plane server gracefully.
package transport
