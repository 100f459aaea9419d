package upstream

import (
	"strconv"
	"sync/atomic"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/stats"

	"github.com/ursula/ursula/services/platform/telemetry"
)

// clientStatsHandler traces the calls to the nodes: a client span per call,
// child of the span in the call's context (the gateway's request span),
// carried to the node in the gRPC metadata (W3C traceparent). The
// once-a-second cluster-info poll is not traced. The router installs it
// only in a process that exports traces or OTLP metrics (New).
func clientStatsHandler() stats.Handler {
	return otelgrpc.NewClientHandler(otelgrpc.WithFilter(filters.Not(filters.MethodName("GetClusterInfo"))))
}

// metrics holds the router's counters, updated atomically without locks.
type metrics struct {
	cacheHits         atomic.Uint64
	cacheMisses       atomic.Uint64
	notLeader         atomic.Uint64
	retries           atomic.Uint64
	noLeader          atomic.Uint64
	transportFailures atomic.Uint64
	refreshes         atomic.Uint64
	refreshFailures   atomic.Uint64
}

// Stats is a snapshot of the router's counters and of the nodes it knows.
type Stats struct {
	// SingleNode is set when every call goes to the one seed node.
	SingleNode bool `json:"single_node"`
	// ClusterID and GroupCount are as learned from the nodes.
	ClusterID  string `json:"cluster_id"`
	GroupCount int    `json:"group_count"`
	// LeaderCacheHits and LeaderCacheMisses count calls whose group leader
	// was, or was not, known when the call was routed.
	LeaderCacheHits   uint64 `json:"leader_cache_hits"`
	LeaderCacheMisses uint64 `json:"leader_cache_misses"`
	// NotLeader counts NOT_LEADER answers from nodes.
	NotLeader uint64 `json:"not_leader"`
	// Retries counts second attempts.
	Retries uint64 `json:"retries"`
	// NoLeader counts calls answered Unavailable (with retry_after_ms)
	// because their group had no known leader.
	NoLeader uint64 `json:"no_leader"`
	// TransportFailures counts calls that failed on the link to a node.
	TransportFailures uint64 `json:"transport_failures"`
	// Refreshes and RefreshFailures count cluster info polls.
	Refreshes       uint64 `json:"refreshes"`
	RefreshFailures uint64 `json:"refresh_failures"`
	// Nodes are the known nodes, by id.
	Nodes []NodeStats `json:"nodes"`
}

// NodeStats describes one node as the router sees it.
type NodeStats struct {
	ID   uint64 `json:"id"`
	Addr string `json:"addr"`
	// Up is false after a transport failure until the node answers again.
	Up bool `json:"up"`
	// Conn is the gRPC connection state (IDLE, CONNECTING, READY,
	// TRANSIENT_FAILURE, SHUTDOWN).
	Conn string `json:"conn"`
	// Leads is the number of groups whose cached leader is this node.
	Leads int `json:"leads"`
}

// Stats returns a snapshot of the counters and nodes.
func (r *Router) Stats() Stats {
	s := Stats{
		LeaderCacheHits:   r.m.cacheHits.Load(),
		LeaderCacheMisses: r.m.cacheMisses.Load(),
		NotLeader:         r.m.notLeader.Load(),
		Retries:           r.m.retries.Load(),
		NoLeader:          r.m.noLeader.Load(),
		TransportFailures: r.m.transportFailures.Load(),
		Refreshes:         r.m.refreshes.Load(),
		RefreshFailures:   r.m.refreshFailures.Load(),
	}
	v := r.view.Load()
	if v == nil {
		return s
	}
	s.SingleNode = v.single != nil
	s.ClusterID = v.clusterID
	s.GroupCount = v.groupCount
	leads := make(map[uint64]int, len(v.nodes))
	for g := range v.leaders {
		leads[v.leaders[g].Load()]++
	}
	for _, nc := range v.order {
		id := nc.id.Load()
		s.Nodes = append(s.Nodes, NodeStats{ID: id, Addr: nc.addr, Up: nc.up.Load(), Conn: nc.conn.GetState().String(), Leads: leads[id]})
	}
	return s
}

// MetricsSource reads the router's counters and its view of the nodes as
// telemetry samples (per node: up and the number of groups it leads, with
// a node_id attribute).
func (r *Router) MetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		st := r.Stats()
		for _, c := range []struct {
			name, unit, help string
			v                uint64
		}{
			{"leader_cache_hits", "{call}", "Calls routed to a group leader known in advance.", st.LeaderCacheHits},
			{"leader_cache_misses", "{call}", "Calls routed without a known group leader.", st.LeaderCacheMisses},
			{"not_leader", "{call}", "NOT_LEADER answers from nodes.", st.NotLeader},
			{"retries", "{call}", "Calls tried a second time.", st.Retries},
			{"no_leader", "{call}", "Calls answered unavailable because their group had no known leader.", st.NoLeader},
			{"transport_failures", "{call}", "Calls that failed on the link to a node.", st.TransportFailures},
			{"refreshes", "{poll}", "Cluster info polls.", st.Refreshes},
			{"refresh_failures", "{poll}", "Cluster info polls that failed.", st.RefreshFailures},
		} {
			emit(telemetry.Sample{Name: c.name, Kind: telemetry.Counter, Unit: c.unit, Help: c.help, Value: float64(c.v)})
		}
		emit(telemetry.Sample{Name: "known_nodes", Kind: telemetry.Gauge, Unit: "{node}", Help: "Storage nodes the router knows.", Value: float64(len(st.Nodes))})
		for _, n := range st.Nodes {
			attrs := []attribute.KeyValue{attribute.String("node_id", strconv.FormatUint(n.ID, 10))}
			up := 0.0
			if n.Up {
				up = 1
			}
			emit(telemetry.Sample{Name: "node_up", Kind: telemetry.Gauge, Unit: "{state}", Help: "1 unless the last call to the node failed on the link.", Value: up, Attrs: attrs})
			emit(telemetry.Sample{Name: "node_leads", Kind: telemetry.Gauge, Unit: "{group}", Help: "Groups whose cached leader is the node.", Value: float64(n.Leads), Attrs: attrs})
		}
	}
}
