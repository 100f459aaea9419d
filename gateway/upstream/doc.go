// Package upstream routes the gateway's StreamService calls across a cluster
// of storage nodes. Its Router implements streamv1.StreamServiceClient, so the
// gateway (and the subscription manager) use it exactly like a client of one
// node.
//
// # What the router knows
//
// The router polls GetClusterInfo from the nodes (the seeds in Config.Nodes
// until it knows the cluster; then every known node, concurrently) every
// Config.RefreshInterval, right after a NOT_LEADER answer or a connection
// failure, and on the first call if it has never succeeded. It merges the
// answers into a view: the cluster id (nodes of another cluster are
// ignored), the group count, the node set (one gRPC connection per node
// address, opened and closed as nodes come and go; seed connections live
// until Close) and the leader of each group (a node claiming the group
// itself wins; otherwise the most common claim). The leader cache is also
// updated in place by NOT_LEADER answers, whose metadata names the leader
// (leader_id, and leader_addr for a node the router does not know yet).
//
// Single-node mode: with one seed and a cluster of one node, every call goes
// to the seed directly (one atomic load of overhead, no placement, no
// retry), whatever address the node advertises.
//
// # Routing
//
// A call is retried once after the failures below, except NOT_LEADER: a
// refusal proposed nothing, so the call follows the hinted leader up to
// maxAttempts times in all (route.go).
//
//	call                         node                         retried after
//	CreateBucket                 leader of group 0            NOT_LEADER; connection failure before sending
//	CreateStream, Append,        leader of the stream's group NOT_LEADER; connection failure before sending
//	DeleteStream
//	Head                         leader                       NOT_LEADER; any connection failure
//	Read offset=now or wait_ms>0 leader                       NOT_LEADER; any connection failure
//	Read (history)               leader if known and up,      NOT_LEADER from a follower (→ leader);
//	                             else any node (round robin)  any connection failure (→ another node)
//	Subscribe                    leader                       NOT_LEADER or connection failure before the first chunk
//	GetClusterInfo               any node                     connection failure (→ another node)
//
// The group of a stream is FNV-1a 64(bucket + "/" + stream) mod group_count (placement.go).
//
// # Appends on AppendStream
//
// Appends to a node travel as messages of one AppendStream call per node
// connection (appendmux.go) rather than as a call each: under many
// appends in flight the gateway's gRPC cost per append about halves, and
// the node is spared a call's setup. Every append still gets exactly what
// a unary Append would have answered, so the routing above is unchanged.
// Appends above 64 KiB, a node that does not implement AppendStream (for a
// minute at a time), and a router that exports traces or rpc metrics use
// unary calls. An append sent on a call that breaks fails UNAVAILABLE
// without a "not sent" cause (it may have been applied); one the call
// proves was never started (not sent, refused, a draining node's end of
// call) is sent again as a unary Append.
//
// # Errors
//
// Everything returned is a gRPC status, as from a node:
//
//   - no known leader for the group (after re-learning) → UNAVAILABLE with
//     metadata retry_after_ms = Config.RetryAfter (the gateway answers 503 with
//     Retry-After); so is a NOT_LEADER at the last attempt, and a cluster
//     no seed can reach;
//   - OUTCOME_UNKNOWN and every other domain error (including a node's own
//     UNAVAILABLE or OVERLOADED) is returned as is, never retried;
//   - a write whose connection failed after the request may have left
//     (anything but a dial error, refused connection or unresolvable name) is
//     returned as is: the node may have proposed it;
//   - a call whose context ended returns its context error.
//
// A connection failure is an UNAVAILABLE status without an Ursula ErrorInfo;
// it marks the node down (history reads avoid it) until it answers again.
package upstream
