// Package statuspage is the cluster status page: a page of plain HTML, CSS
// and JavaScript embedded in the binary (no build step, no request to any
// other origin) that shows the nodes with their readiness reasons, drain
// state and peer refusals, every Raft group with its leader, term, voters,
// learners, applied lag, hot bytes and recovery gate, and small charts of
// the cluster's throughput and latency over the last minutes.
//
// A Page reads every node's /__ursula/metrics and /__ursula/ready (Target:
// over HTTP on the node's client plane, or in process for the node that
// serves the page) once a second while somebody watches, once per
// IdleInterval otherwise, and keeps the newest samples of the rates in a
// bounded ring, so that a page opened later has a history. It serves:
//
//	GET /__ursula/ui/            the page
//	GET /__ursula/ui/snapshot    the cluster view as JSON, with the history
//	GET /__ursula/ui/events      the view live: a server-sent "snapshot"
//	                             event at every read (the first with the
//	                             history), a comment every 15 s otherwise
//
// Live connections are bounded (MaxViewers; more answer 503 with
// Retry-After); a viewer that reads slowly skips views instead of queueing
// them. A node that does not answer within Timeout is shown unreachable,
// with the id it had when it last answered.
//
// The package decides nothing about who may see the page: the gateway
// serves it on its data port only as gateway.status_page allows, the node
// on its loopback admin plane behind the admin plane's guard.
package statuspage
