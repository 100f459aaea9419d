// Package e2e tests Ursula as an operator runs it: real binaries spawned as
// separate processes, each in its own temporary directory with free loopback
// ports, talked to over HTTP, killed with SIGKILL or stopped with SIGTERM and
// restarted on the same data directory.
//
// The non-test files are the harness, shared with the other test tiers
// (tests/chaos, tests/conformance, tests/bench):
//
//   - Binary locates a server binary: $URSULA_BIN for ursula, else
//     $URSULA_BIN_DIR/<name> (the Makefile sets both to bin/), else it runs
//     go build once per test process into a temporary directory.
//   - Server is one spawned process and the addresses it was given (as
//     flags, or fixed in a config file). Start, WaitReady, Kill (SIGKILL),
//     Terminate (SIGTERM) and Restart act on that process only, by its pid;
//     the data directory survives restarts.
//   - Client speaks the Durable Streams protocol (PUT create, POST append with
//     idempotent-producer headers, GET catch-up paged by Stream-Next-Offset).
//   - Cluster (cluster.go) is N ursula-node processes (3 or 5) on free
//     loopback ports, one TOML file per node (NodeConfig: server.cluster_id,
//     listeners, raft.node_id, raft.wal.path, group_count, [[raft.peers]]), and
//     optionally an ursula-gateway in front of them. StartCluster waits until
//     every node answers 200 on /__ursula/ready and every group has a
//     leader all nodes agree on. Leader finds a group's leader from the
//     nodes' /__ursula/metrics, WaitVoter waits until a node is a voter of
//     every group again, Node.Wipe empties a stopped node's data directory,
//     Node.Reconfigure rewrites its file (another cluster id, say) and
//     AddNode prepares a node outside the voter set. Every process is killed
//     at the end of the test, pass or fail; a failed test prints each
//     node's configuration and the tail of its log, and copies them to
//     $URSULA_TEST_ARTIFACTS when set.
//   - Proxy (proxy.go) is a TCP proxy for one directed link that can
//     blackhole, delay, cut or reset it. With ClusterOptions.Proxies every
//     node's [[raft.peers]] cluster_url for another node names its own proxy
//     of that link; Cluster.Isolate cuts a node off the cluster plane.
//   - Metrics and Readiness (observe.go) decode /__ursula/metrics and
//     /__ursula/ready; ReadRange and ReadAt read a stream's history from one
//     node over gRPC (StreamService.Read on its client plane).
//
// The tests here:
//
//   - TestDurability: acknowledged appends survive SIGKILL (fsync "always"
//     and "never") and SIGTERM byte-exact at their offsets, and producers
//     retrying after the restart are deduplicated; in the all-in-one
//     deployment, and in the split one (ursula-node behind ursula-gateway,
//     the node killed while the gateway stays up);
//   - TestClusterWipedNodeRejoins: a voter of a 3-node cluster loses its
//     data directory and starts again (seed: "Rejoining a wiped node"):
//     every group promotes it back to voter by itself, it serves the old
//     history, no acknowledged write is lost, no stream's incarnation
//     changes, and once back it carries quorums with another node down;
//   - TestClusterPeerOfAnotherCluster (seed: "Peers of another cluster"): a
//     configured peer restarted with another server.cluster_id, and a node
//     of another cluster that lists this cluster's nodes without being
//     listed: refusals counted on both sides, a configured peer listed under
//     peer_cluster_mismatches (node_id, cluster_id) in metrics and
//     readiness, an unlisted sender never listed, the healthy nodes ready
//     and serving throughout;
//   - TestClusterFiveNodes: a 5-node cluster commits in every group with
//     two voters down, and every node holds every acknowledged append once
//     they are back;
//   - TestColdMemoryBounded: 2 GiB of 64 KiB appends from 8 producers
//     into 4 streams of one group, through bin/ursula with the S3 cold
//     store (a versitygw process), a 64 MiB hot cap and the default flush
//     thresholds; every append retried on 503 until accepted; the
//     server's resident set (sampled every 100 ms, and VmHWM) stays
//     within the hot cap plus 256 MiB, the group's hot bytes within the
//     cap, cold flushes happen, and every byte reads back at the offset
//     its append was acknowledged at;
//   - TestColdStoreOutage: with the S3 server killed, a read of flushed
//     (uncached) bytes answers 502 COLD_STORE_FAILED, appends are accepted
//     up to the group's hot cap and then refused with 503 OVERLOADED and
//     Retry-After, while the hot window still reads back and another group
//     still takes writes; once S3 is back every hot byte is flushed, the
//     refused append is accepted on retry, and both streams read back as
//     exactly their acknowledged appends;
//   - TestColdBucketPurge: DELETE /__ursula/purge/{bucket} on the admin
//     listener answers 428 without and 412 with a wrong process
//     incarnation (changing nothing), then 200 with a complete report; the
//     bucket's S3 prefix lists empty, another bucket keeps every object
//     and byte, the purged bucket's streams answer 404 and it is fenced
//     (creating it or a stream in it: 404); purging again answers the
//     same proof with nothing removed; the client listeners answer 404;
//   - TestAdminEndpoints: the operations page's admin curl examples (seed
//     "Admin endpoints"; the recovery-plan ones excepted) against a 3-node
//     cluster, with the real curl when it is on PATH: pinning the process
//     incarnation from metrics, flush-cold (a stream name with slashes
//     too), a Raft snapshot and a log purge, adding a learner, a leader
//     transfer, replacing the voter set, maintenance drain on and off; each
//     answer's status and documented fields, 409 NOT_LEADER with leader_id
//     on a follower, 400 for a non-voter or a missing voter set, 428
//     without the incarnation header and 412 with the incarnation of a
//     node before its restart, neither changing anything;
//   - TestUrsulactl: every ursulactl verb (ops/ursulactl, run in process
//     through ursulactl.Run, and bin/ursulactl itself) against a 3-node
//     cluster: status (also with a SIGKILLed node shown unreachable),
//     verify-cluster, wait-ready, drain/wait/undrain, transfer, membership,
//     snapshot, purge-log, flush-cold, purge-bucket; the refusals (exit
//     2) of a drain while a node is down and of a transfer or membership
//     change on a follower; a node restarted between the pinning of its
//     incarnation and the mutation (ursulactl's Pinned hook) answers 412
//     and the operation stops with exit 2;
//   - TestGRPCurlFreshNode, TestGRPCurlWildcardNode (grpc_test.go): the
//     grpcurl examples of docs/grpc.md, run by bin/grpcurl in an empty
//     directory against a fresh ursula-node: reflection lists and
//     describes both planes' services, grpc.health.v1 says SERVING, a
//     stream is written and read, an error shows its ErrorInfo reason, an
//     admin mutation needs the token and the process incarnation; a node
//     listening on every address serves reflection over loopback;
//   - TestUrsulactlRollout: `ursulactl rollout` restarts every node of a
//     3-node cluster (SIGTERM, start) while idempotent producers append
//     through the gateway and SSE readers follow streams: no client sees a
//     non-retriable answer (503 with Retry-After is retried with the same
//     producer tuple), every acknowledged append reads back once at its
//     offset from the gateway and every node, the SSE readers see every
//     byte in order, and leaderships spread over every node again;
//   - TestFailStopPortTaken, TestFailStopColdStoreBroken,
//     TestFailStopDataDirUnwritable (failstop_test.go; the issue: ursula
//     kept running and answering 503 forever when its node failed): a
//     listen port already taken (ursula's client, gateway and admin
//     ports, ursula-node's client port and its cluster port in a 3-node
//     configuration, ursula-gateway's port) ends the process with a
//     non-zero status within 10 s, its log naming the failing role and
//     "address already in use"; a cold store that is a regular file or a
//     root holding a foreign object without URSULA_FORMAT_EPOCH ends it
//     before it reports ready, naming the cold store; a data directory
//     made unusable under load (renamed away, a regular file in its
//     place) ends it with the storage role named, and once the directory
//     is back every acknowledged append reads back once, in order (the
//     all-in-one deployment, and ursula-node behind ursula-gateway, the
//     gateway staying up);
//   - TestHTTPTimeouts, TestSlowReadersMemoryBounded,
//     TestHeadersOnlyBodiesBounded, TestBodyBudgetRefuses,
//     TestBodyLimitsRefuseStart (limits_test.go; the issue: an attacker
//     probing with real clients): against bin/ursula with one-second
//     timeouts a request body that stops arriving answers 408 and its
//     connection is closed, and connections that stop inside their headers
//     or stay idle are closed by the gateway, the node's client plane and
//     the admin plane; 60 connections that read nothing of a 4 MiB JSON
//     read grow the live heap (measured after a collection forced through
//     the admin plane's heap profile) by a few MiB, not 240, and the write
//     timeout then frees them all; 20 requests announcing 32 MiB bodies and
//     sending none take one 64 KiB piece of the body budget each, the heap
//     hardly moves, and the body timeout gives it all back; with the
//     smallest budget (64 MiB) two 32 MiB uploads under way take it all, a
//     third request with a body answers 503 OVERLOADED with Retry-After
//     while reads go on, and goes through once they are gone; ursula,
//     ursula-node and ursula-gateway refuse to start with a budget below
//     64 MiB or below the body limit (InflightBodyBudgetTooSmall), and
//     ursula-gateway with a body limit above 33554432;
//   - TestCleanShutdownDamagedTailRefused (walrecovery_test.go): bin/ursula
//     acknowledges appends and stops cleanly on SIGTERM; the active WAL
//     segment holding them loses its last bytes; the next start exits
//     non-zero, its log naming the segment file and the byte offset, and
//     the data directory is unchanged; with the segment restored every
//     acknowledged append reads back and wal_recovery is false;
//   - TestColdObjectCorrupt (coldcorrupt_test.go): bin/ursula with a
//     local-directory cold store; one byte of a real chunk object and one
//     of an external payload flipped on disk; reads of them answer 502
//     COLD_OBJECT_CORRUPT without the bytes, again on a retry,
//     cold_corrupt_reads moves in /__ursula/metrics and Prometheus, the
//     log names the object, and the undamaged part of the stream and
//     another stream read back exactly;
//   - TestProxy: the proxy's modes, without binaries;
//   - TestExampleConfig, TestLocalClusterConfig: every binary accepts
//     deploy/ursula.example.toml, and the files of make run-cluster
//     (deploy/local-cluster) are valid and consistent;
//   - TestSystemdNotify (sdnotify_test.go): bin/ursula started as systemd
//     starts a unit of Type=notify ($NOTIFY_SOCKET, $WATCHDOG_USEC) says
//     READY=1 by the time it serves, pings the watchdog, and says
//     STOPPING=1 on SIGTERM.
//
// Run with `make test-e2e`, or `go test ./tests/e2e` (which builds the
// binaries itself when URSULA_BIN / URSULA_BIN_DIR are unset). The cold-tier
// tests need a versitygw binary (see storage/objstore/objstoretest: $VERSITYGW,
// which make test-e2e sets, else bin/versitygw); TestColdMemoryBounded takes
// about 80 s on 2 cores and is not shortened by -short.
package e2e
