package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ursula/ursula/internal/pki"
)

// ErrorInfo reasons of the refusals (domain ErrorInfoDomain).
const (
	ReasonPeerClusterMismatch = "PEER_CLUSTER_MISMATCH"
	ReasonProtocolMismatch    = "RAFT_PROTOCOL_MISMATCH"
	ErrorInfoDomain           = "ursula"
)

// protocolMismatchText is what a node answers a request that names no
// cluster id; nodes before format epoch 4 read it as a format-epoch
// mismatch.
const protocolMismatchText = "raft protocol mismatch: request names no cluster id (format epoch mismatch?)"

// maxRememberedSenders bounds the per-sender logging state.
const maxRememberedSenders = 1024

// RefusalError is a peer's refusal of this node's request: the peer
// belongs to another cluster (errors.Is ErrPeerClusterMismatch), or it
// found no cluster id in the request (errors.Is ErrProtocolMismatch).
type RefusalError struct {
	// NodeID and ClusterID are the refusing node's, as it answered (zero
	// and empty when it did not say).
	NodeID    uint64
	ClusterID string
	// Address is where this node sent the request.
	Address string
	// Protocol is set for a protocol mismatch.
	Protocol bool
	// Message is the peer's status message.
	Message string

	st *status.Status
}

// GRPCStatus returns the peer's FAILED_PRECONDITION status, so that
// status.FromError and status.Code see through a refusal.
func (e *RefusalError) GRPCStatus() *status.Status { return e.st }

func (e *RefusalError) Error() string {
	if e.Protocol {
		return fmt.Sprintf("transport: peer at %s refused the request as a raft protocol mismatch: %s", e.Address, e.Message)
	}
	return fmt.Sprintf("transport: peer at %s is node %d of cluster %q, not of this cluster: %s", e.Address, e.NodeID, e.ClusterID, e.Message)
}

// Is matches ErrPeerClusterMismatch or ErrProtocolMismatch.
func (e *RefusalError) Is(target error) bool {
	if e.Protocol {
		return target == ErrProtocolMismatch
	}
	return target == ErrPeerClusterMismatch
}

// AsRefusal classifies an error of an RPC to a cluster-plane peer: it
// returns the peer's refusal, or nil when err is not one.
func AsRefusal(err error, address string) *RefusalError {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return nil
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != ErrorInfoDomain {
			continue
		}
		id, _ := strconv.ParseUint(info.GetMetadata()["node_id"], 10, 64)
		switch info.GetReason() {
		case ReasonPeerClusterMismatch:
			return &RefusalError{NodeID: id, ClusterID: info.GetMetadata()["cluster_id"], Address: address, Message: st.Message(), st: st}
		case ReasonProtocolMismatch:
			return &RefusalError{NodeID: id, ClusterID: info.GetMetadata()["cluster_id"], Address: address, Protocol: true, Message: st.Message(), st: st}
		}
	}
	return nil
}

// Mismatch is a configured peer refused, either way, within the mismatch
// window.
type Mismatch struct {
	// NodeID is the peer's configured id.
	NodeID uint64 `json:"node_id"`
	// ClusterID is the cluster id the peer sent (inbound) or answered with
	// (outbound).
	ClusterID string `json:"cluster_id"`
	// Address is the peer's configured address (outbound) or the address
	// its request came from (inbound).
	Address string `json:"address"`
	// Direction is "outbound" (the peer refused this node) or "inbound"
	// (this node refused the peer).
	Direction string `json:"direction"`
	// At is the time of the latest refusal.
	At time.Time `json:"at"`
}

// refusals records refusals for PeerClusterMismatches and for logging each
// refused sender once.
type refusals struct {
	window time.Duration

	mu           sync.Mutex
	peers        map[uint64]Mismatch  // configured peers, latest refusal
	inbound      map[string]time.Time // sender (host, node, cluster) → last refusal
	unidentified map[string]struct{}  // sender hosts logged
}

func (r *refusals) init(window time.Duration) {
	r.window = window
	r.peers = map[uint64]Mismatch{}
	r.inbound = map[string]time.Time{}
	r.unidentified = map[string]struct{}{}
}

func (r *refusals) record(m Mismatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.peers[m.NodeID] = m
}

// seenInbound notes an inbound refusal of key and reports whether it is new
// (not refused within the window), that is, whether to log it.
func (r *refusals) seenInbound(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.inbound[key]
	r.inbound[key] = now
	if len(r.inbound) > maxRememberedSenders {
		for k, at := range r.inbound {
			if now.Sub(at) > r.window {
				delete(r.inbound, k)
			}
		}
	}
	return !ok || now.Sub(last) > r.window
}

// seenUnidentified reports whether host was not logged before.
func (r *refusals) seenUnidentified(host string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.unidentified[host]; ok {
		return false
	}
	if len(r.unidentified) >= maxRememberedSenders {
		return false // stop remembering (and logging) new senders
	}
	r.unidentified[host] = struct{}{}
	return true
}

func (r *refusals) list(now time.Time, configured func(uint64) bool) []Mismatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []Mismatch{}
	for _, m := range r.peers {
		if now.Sub(m.At) <= r.window && (configured == nil || configured(m.NodeID)) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Mismatch) int {
		switch {
		case a.NodeID < b.NodeID:
			return -1
		case a.NodeID > b.NodeID:
			return 1
		}
		return 0
	})
	return out
}

// PeerClusterMismatches lists the configured peers refused, either way,
// within the mismatch window (default one minute), ordered by node id.
// Senders outside the configured peers are never listed.
func (t *Transport) PeerClusterMismatches() []Mismatch {
	return t.refusal.list(time.Now(), func(id uint64) bool { return t.peer(id) != nil })
}

// outboundError classifies the error of an RPC to p: a refusal is counted,
// recorded, logged once while the peer keeps refusing, and returned as a
// *RefusalError; anything else is returned unchanged.
func (t *Transport) outboundError(p *peer, err error) error {
	ref := AsRefusal(err, p.addr)
	if ref == nil {
		return err
	}
	if ref.Protocol {
		t.stats.protocolRefusalsReceived.Add(1)
	} else {
		t.stats.peerClusterRefusals.Add(1)
		t.refusal.record(Mismatch{NodeID: p.id, ClusterID: ref.ClusterID, Address: p.addr, Direction: "outbound", At: time.Now()})
	}
	p.refusedMu.Lock()
	first := !p.refused
	p.refused = true
	p.refusal = "peer_cluster_mismatch"
	if ref.Protocol {
		p.refusal = "protocol_mismatch"
	}
	p.refusedMu.Unlock()
	if first {
		if ref.Protocol {
			p.logger.Error("raft peer refuses this node as a raft protocol mismatch (another format epoch?); treating it as unreachable", "err", ref.Message)
		} else {
			p.logger.Error("raft peer belongs to another cluster and refuses this node; treating it as unreachable until the configuration is fixed",
				"peer_node_id", ref.NodeID, "peer_cluster_id", ref.ClusterID, "cluster_id", t.cfg.ClusterID)
		}
	}
	return ref
}

// accepted clears p's refusal state once it accepted a stream.
func (p *peer) accepted() {
	p.refusedMu.Lock()
	was := p.refused
	p.refused = false
	p.refusedMu.Unlock()
	if was {
		p.logger.Info("raft peer accepts this node again")
	}
}

// ServerOptions are the options the cluster-plane gRPC server needs: the
// identity check of every request (an InTapHandle, which runs before the
// stream exists and so before any request message is decoded), a
// keepalive policy matching the peers' pings, and the message size limit.
// The check applies to every method of that server. A server that already
// has a tap handle installs UnaryServerInterceptor and
// StreamServerInterceptor instead.
//
// With TLS, the server's listener must run the handshake (ServerTLS) and
// hand the gRPC server finished TLS connections (listenmux.NewTLS does):
// the options include pki.Terminated credentials, which read the
// verified client certificate from them.
func (t *Transport) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.InTapHandle(t.tapHandle),
		grpc.KeepaliveEnforcementPolicy(keepaliveEnforcement(t.cfg.KeepaliveTime)),
		grpc.MaxRecvMsgSize(t.cfg.MaxMessageBytes),
	}
	if t.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(pki.Terminated()))
	}
	return opts
}

// ServerTLS is the TLS configuration of the cluster-plane listener: this
// node's certificate, and a client certificate from the cluster CA
// required of every connection. Nil when the plane runs plaintext.
func (t *Transport) ServerTLS() *tls.Config {
	if t.cfg.TLS == nil {
		return nil
	}
	return t.cfg.TLS.ServerConfig(tls.RequireAndVerifyClientCert)
}

// CertificateNotAfter is when this node's cluster-plane certificate (as
// last loaded) expires; zero when the plane runs plaintext.
func (t *Transport) CertificateNotAfter() time.Time {
	if t.cfg.TLS == nil {
		return time.Time{}
	}
	return t.cfg.TLS.NotAfter()
}

// HandshakeRefused counts and logs (once per address within the mismatch
// window) a connection closed in its TLS handshake: for the listener that
// runs ServerTLS.
func (t *Transport) HandshakeRefused(remote net.Addr, err error) {
	t.stats.tlsHandshakeRefusals.Add(1)
	host := remote.String()
	if h, _, e := net.SplitHostPort(host); e == nil {
		host = h
	}
	if t.refusal.seenInbound("tls|"+host, time.Now()) {
		t.logger.Error("refused a cluster-plane connection in its TLS handshake (no certificate of the cluster CA?)",
			"remote_address", remote.String(), "err", err)
	}
}

// SenderID is the node id of the peer that made an inbound call: checked
// against its certificate (with TLS) and the configured peers before the
// call ran, by the identity check of ServerOptions.
func SenderID(ctx context.Context) uint64 {
	md, _ := metadata.FromIncomingContext(ctx)
	id, _ := strconv.ParseUint(firstValue(md, MetadataNodeID), 10, 64)
	return id
}

func (t *Transport) tapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	return ctx, t.checkIdentity(ctx, info.Header)
}

// UnaryServerInterceptor checks the identity metadata of unary calls. A
// unary request is decoded before interceptors run, so prefer
// ServerOptions' tap handle.
func (t *Transport) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if err := t.checkIdentity(ctx, md); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor checks the identity metadata of streaming calls
// before the handler reads any message.
func (t *Transport) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if err := t.checkIdentity(ss.Context(), md); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

func firstValue(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// checkIdentity refuses a request whose metadata names no cluster id or
// another one.
func (t *Transport) checkIdentity(ctx context.Context, md metadata.MD) error {
	clusterID := firstValue(md, MetadataClusterID)
	nodeText := firstValue(md, MetadataNodeID)
	nodeID, nodeErr := strconv.ParseUint(nodeText, 10, 64)
	remote := ""
	p, _ := grpcpeer.FromContext(ctx)
	if p != nil && p.Addr != nil {
		remote = p.Addr.String()
	}
	if clusterID == t.cfg.ClusterID && nodeErr == nil && nodeID != 0 {
		return t.authenticate(p, remote, nodeID)
	}
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	if clusterID == "" || nodeErr != nil || nodeID == 0 {
		t.stats.unidentifiedRefusals.Add(1)
		if t.refusal.seenUnidentified(host) {
			t.logger.Warn("refused a raft request that names no cluster or node id (a node of an older format epoch, or a stray client)",
				"remote_address", remote, "sender_cluster_id", clusterID, "sender_node_id", nodeText)
		}
		return t.refusalStatus(codes.FailedPrecondition, protocolMismatchText, ReasonProtocolMismatch)
	}

	t.stats.peerClusterRefusals.Add(1)
	now := time.Now()
	if p := t.peer(nodeID); p != nil && sameHostIfIP(p.addr, host) {
		t.refusal.record(Mismatch{NodeID: nodeID, ClusterID: clusterID, Address: remote, Direction: "inbound", At: now})
	}
	if t.refusal.seenInbound(host+"|"+nodeText+"|"+clusterID, now) {
		t.logger.Error("refused a raft request from a node of another cluster",
			"sender_node_id", nodeID, "sender_cluster_id", clusterID, "remote_address", remote, "cluster_id", t.cfg.ClusterID)
	}
	msg := fmt.Sprintf("raft peer cluster mismatch: node %d of cluster %q refuses node %d of cluster %q",
		t.cfg.NodeID, t.cfg.ClusterID, nodeID, clusterID)
	return t.refusalStatus(codes.FailedPrecondition, msg, ReasonPeerClusterMismatch)
}

// authenticate refuses a caller of this cluster that cannot prove the
// node id it names: with TLS its certificate must prove exactly that node,
// and in every mode the node must be a configured peer. The refusal is
// PERMISSION_DENIED, counted, and logged once per sender within the
// mismatch window; it never changes readiness.
func (t *Transport) authenticate(p *grpcpeer.Peer, remote string, nodeID uint64) error {
	var reason string
	switch {
	case nodeID == t.cfg.NodeID:
		reason = "it names this node's own id"
	case t.peer(nodeID) == nil:
		reason = "it names no configured peer"
	case t.cfg.TLS != nil:
		var id pki.Identity
		ok := false
		if p != nil {
			id, ok = pki.FromAuthInfo(p.AuthInfo)
		}
		switch {
		case !ok:
			reason = "its connection proves no identity"
		case id != pki.NodeIdentity(nodeID):
			reason = "its certificate proves " + id.String()
		}
	}
	if reason == "" {
		return nil
	}
	t.stats.unauthenticatedRefusals.Add(1)
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	if t.refusal.seenInbound("auth|"+host+"|"+strconv.FormatUint(nodeID, 10)+"|"+reason, time.Now()) {
		t.logger.Error("refused a cluster-plane call that cannot prove who sent it",
			"sender_node_id", nodeID, "remote_address", remote, "reason", reason)
	}
	return status.Errorf(codes.PermissionDenied, "cluster plane: node %d refuses a call naming node %d: %s", t.cfg.NodeID, nodeID, reason)
}

func (t *Transport) refusalStatus(code codes.Code, msg, reason string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: reason,
		Domain: ErrorInfoDomain,
		Metadata: map[string]string{
			"node_id":    strconv.FormatUint(t.cfg.NodeID, 10),
			"cluster_id": t.cfg.ClusterID,
		},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// sameHostIfIP reports whether a request from remoteHost may come from the
// peer configured at addr: always when addr names a host name, and only
// from that IP address when it names one.
func sameHostIfIP(addr, remoteHost string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	if ip == nil {
		return true
	}
	rip := net.ParseIP(remoteHost)
	return rip != nil && rip.Equal(ip)
}
