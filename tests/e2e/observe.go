package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// Metrics is the part of a node's GET /__ursula/metrics the tests read.
type Metrics struct {
	ClusterID          string         `json:"cluster_id"`
	ProcessIncarnation string         `json:"process_incarnation"`
	RaftGroups         []GroupMetrics `json:"raft_groups"`
	// WALRewrittenBytes counts the live entries the journals copied
	// forward to free segments (the deleted-data bound).
	WALRewrittenBytes float64 `json:"wal_rewritten_bytes"`
	// PeerClusterRefusals counts Raft RPCs refused because of another
	// cluster id, both the ones this node refused and the ones refused to
	// it.
	PeerClusterRefusals uint64 `json:"raft_grpc_peer_cluster_refusals"`
	// PeerClusterMismatches lists the configured peers refused within the
	// last minute.
	PeerClusterMismatches []PeerMismatch `json:"peer_cluster_mismatches"`
	// Refusals of the planes' authentication.
	UnauthenticatedPeerRefusals uint64 `json:"raft_grpc_unauthenticated_peer_refusals"`
	TLSHandshakeRefusals        uint64 `json:"raft_grpc_tls_handshake_refusals"`
	ClientAuthRefusals          uint64 `json:"client_auth_refusals"`
	// WALRecovery: this run started after a crash.
	WALRecovery bool `json:"wal_recovery"`
}

// GroupMetrics is one entry of raft_groups.
type GroupMetrics struct {
	GroupID      uint32   `json:"raft_group_id"`
	LeaderID     uint64   `json:"leader_id"`
	Term         uint64   `json:"term"`
	CommitIndex  uint64   `json:"commit_index"`
	AppliedIndex uint64   `json:"applied_index"`
	Voters       []uint64 `json:"voters"`
	Learners     []uint64 `json:"learners"`
	// Recovery is the recovery plan the replica holds (null: none).
	Recovery map[string]any `json:"recovery"`
}

// PeerMismatch is one entry of peer_cluster_mismatches: a configured peer
// and the cluster id it sent or answered with.
type PeerMismatch struct {
	NodeID    uint64 `json:"node_id"`
	ClusterID string `json:"cluster_id"`
}

// Group returns group g's entry, nil when the node does not report it.
func (m *Metrics) Group(g uint32) *GroupMetrics {
	for i := range m.RaftGroups {
		if m.RaftGroups[i].GroupID == g {
			return &m.RaftGroups[i]
		}
	}
	return nil
}

// Readiness is a node's GET /__ursula/ready answer.
type Readiness struct {
	// Status is the HTTP status: 200 ready, 503 not.
	Status                int            `json:"-"`
	Ready                 bool           `json:"ready"`
	Reason                string         `json:"reason"`
	ClusterID             string         `json:"cluster_id"`
	PeerClusterMismatches []PeerMismatch `json:"peer_cluster_mismatches"`
}

// Metrics fetches and decodes the node's /__ursula/metrics.
func (n *Node) Metrics(ctx context.Context) (*Metrics, error) {
	var m Metrics
	if _, err := getJSON(ctx, n.HTTPClient(3*time.Second), n.URL()+"/__ursula/metrics", &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Readiness fetches and decodes the node's /__ursula/ready.
func (n *Node) Readiness(ctx context.Context) (*Readiness, error) {
	var r Readiness
	status, err := getJSON(ctx, n.HTTPClient(3*time.Second), n.URL()+"/__ursula/ready", &r)
	if err != nil {
		return nil, err
	}
	r.Status = status
	return &r, nil
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: %w", url, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: %d answer does not decode as the documented JSON: %w\n%s", url, resp.StatusCode, err, body)
	}
	return resp.StatusCode, nil
}

// OffsetAt is the offset token of byte position pos ("-1" for 0).
func OffsetAt(pos uint64) string {
	if pos == 0 {
		return "-1"
	}
	return Offset{Pos: pos}.String()
}

// ReadRange reads the Durable Streams stream from byte position from up to
// byte position to on one node over gRPC (StreamService.Read, history read
// on whichever node sc talks to), following next_offset. It fails when a
// page does not start where it was asked to, when the stream's incarnation
// changes between pages, or when the node has no more data before to (it
// has not applied that far yet: callers may retry). It returns the bytes
// and the stream's incarnation.
func ReadRange(ctx context.Context, sc streamv1.StreamServiceClient, stream string, from, to uint64) ([]byte, uint64, error) {
	return readRange(ctx, sc, stream, from, to, 0)
}

// readRetrying reads, sending the request again while the node answers
// UNAVAILABLE: reads are linearizable, so a replica answers 503 while its
// group elects a leader (a client retries then), never stale bytes.
func readRetrying(ctx context.Context, sc streamv1.StreamServiceClient, req *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
	for {
		resp, err := sc.Read(ctx, req)
		if status.Code(err) != codes.Unavailable {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readRange(ctx context.Context, sc streamv1.StreamServiceClient, stream string, from, to, maxBytes uint64) ([]byte, uint64, error) {
	var data []byte
	var inc uint64
	pos := from
	for first := true; pos < to; first = false {
		resp, err := readRetrying(ctx, sc, &streamv1.ReadRequest{
			Ref:      &streamv1.StreamRef{Bucket: DSBucket, Stream: stream},
			Offset:   OffsetAt(pos),
			MaxBytes: maxBytes,
			NoTouch:  true,
		})
		if err != nil {
			return nil, inc, fmt.Errorf("read %s at byte %d: %w", stream, pos, err)
		}
		if !first && resp.GetIncarnation() != inc {
			return nil, inc, fmt.Errorf("read %s: incarnation changed from %d to %d at byte %d", stream, inc, resp.GetIncarnation(), pos)
		}
		inc = resp.GetIncarnation()
		start, err := ParseOffset(resp.GetStartOffset())
		if err != nil {
			return nil, inc, fmt.Errorf("read %s at byte %d: start_offset: %w", stream, pos, err)
		}
		next, err := ParseOffset(resp.GetNextOffset())
		if err != nil {
			return nil, inc, fmt.Errorf("read %s at byte %d: next_offset: %w", stream, pos, err)
		}
		if start.Pos != pos {
			return nil, inc, fmt.Errorf("read %s at byte %d: the page starts at byte %d", stream, pos, start.Pos)
		}
		if next.Pos != pos+uint64(len(resp.GetData())) {
			return nil, inc, fmt.Errorf("read %s at byte %d: %d bytes but next_offset names byte %d", stream, pos, len(resp.GetData()), next.Pos)
		}
		if len(resp.GetData()) == 0 {
			return nil, inc, fmt.Errorf("read %s: the node's copy ends at byte %d, want %d", stream, pos, to)
		}
		data = append(data, resp.GetData()...)
		pos = next.Pos
	}
	if pos > to {
		data = data[:to-from]
	}
	return data, inc, nil
}

// WaitReadRange retries ReadRange until it succeeds or ctx ends: a follower
// may not have applied everything yet.
func WaitReadRange(ctx context.Context, sc streamv1.StreamServiceClient, stream string, from, to uint64) ([]byte, uint64, error) {
	for {
		data, inc, err := ReadRange(ctx, sc, stream, from, to)
		if err == nil {
			return data, inc, nil
		}
		select {
		case <-ctx.Done():
			return nil, inc, fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ReadAt reads len(want) bytes of stream at byte position pos (the offset
// an append was acknowledged at) on the node sc talks to, asking for no
// more, and checks that they are want.
func ReadAt(ctx context.Context, sc streamv1.StreamServiceClient, stream string, pos uint64, want []byte) error {
	got, _, err := readRange(ctx, sc, stream, pos, pos+uint64(len(want)), uint64(len(want)))
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read %s at byte %d: got %q, want %q", stream, pos, clip(got), clip(want))
	}
	return nil
}

func clip(b []byte) []byte {
	if len(b) > 120 {
		return append(b[:120:120], "…"...)
	}
	return b
}

// ProcStatusBytes reads a "kB" field (VmRSS, VmHWM) of /proc/<pid>/status.
func ProcStatusBytes(pid int, field string) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, field, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}
