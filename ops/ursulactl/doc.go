// Package ursulactl is the operator tool of an Ursula cluster (the
// ursulactl command, ops/cmd/ursulactl, is a thin main around Main). It
// reads each node's GET /__ursula/metrics and /__ursula/ready on the
// node's client plane and sends admin mutations to its admin plane; it
// holds no state of its own between runs.
//
// # Manifest
//
// A cluster manifest is a TOML file (LoadManifest; unknown keys are
// errors):
//
//	cluster_id = "local-cluster"              # optional: every node must report it
//	admin_token_file = "/etc/ursula/token"    # optional default of the nodes'
//	ca_file = "pki/ca.crt"                    # optional: the CA of https:// URLs
//
//	[[nodes]]                                 # one per voter, in rollout order
//	id = 1                                    # raft.node_id
//	name = "node1"                            # optional: {node} in --restart-cmd
//	client_url = "http://127.0.0.1:4441"      # server.listen: metrics, readiness
//	admin_url = "http://127.0.0.1:4451"       # server.admin_listen: mutations
//	admin_token_file = "node1.token"          # optional, relative to the manifest
//
// A URL without a scheme gets http://; an https:// URL is verified against
// ca_file by the node identity its certificate proves (package pki). The
// token, when a node has a token file, is the file's one line (the file
// must be mode 600 or 400 and not a symlink), sent as Authorization:
// Bearer <token> on every admin-plane request; it is never taken from the
// command line.
//
// # Safety
//
// Every operation reads a node's metrics once before it mutates the node,
// pins the process_incarnation it finds there, sends it as
// x-ursula-process-incarnation on every mutation of the operation and
// never refreshes it: a 412 (the node restarted) or 428 answer, or later
// metrics showing another incarnation, stop the operation with an error
// matching ErrAborted (exit status 2). So do the preconditions: drain
// refuses while another node is unreachable or unready or when a group
// would be left without a quorum of ready voters, and handoffs go only to
// voters that are ready and not draining (GET /__ursula/leadership-shed).
// A node whose metrics name another node_id, or another cluster_id than the
// manifest's, is never mutated.
//
// # Output
//
// Results go to stdout; progress goes to stderr, as bars on a terminal
// and otherwise as plain lines paced by Env.Now (lineProgress), and not at
// all with --quiet. With --json (every verb) stdout holds exactly one
// JSON document: the verb's result, or {"error": {...}} when it failed
// before it had one (Run prints it); the lines an operation prints as it
// goes then go to stderr.
//
// # Confirmation
//
// Destructive verbs (purge-bucket, purge-log, membership removing a
// voter, restore, recover-group apply, cluster enable-feature) ask on
// stderr and read the answer from Env.Stdin when it is a terminal; off a
// terminal they refuse (ErrNotConfirmed, exit 1) unless --yes is given. A
// declined prompt is a safety abort (exit 2). Nothing is sent before the
// answer.
//
// # Exit status
//
// 0 done; 1 any other error (unreachable node, timeout, problems found by
// verify-cluster, a refused request, bad arguments, no --yes off a
// terminal); 2 aborted by a safety check or a declined confirmation.
// Every error is one line on stderr, after any progress lines, starting
// with "ursulactl: error: ".
//
// Tests drive the same code through Run (with Env.Hooks and Env.Restart)
// or through a Controller.
package ursulactl
