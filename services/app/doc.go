// Package app composes Ursula's roles into processes. One root Config
// configures every role; a target selects which roles run: "all" (node +
// gateway + subscriptions in one process, talking to each other over the
// same gRPC clients as a split deployment), "node", "gateway", "coldgc" or
// "backup". Main is what every binary's main calls. The ursula binary
// takes its default target from the name it runs as (TargetForName): run
// as ursula-node, ursula-gateway, ursula-coldgc or ursula-backup (the
// container image's links to ursula), it is that binary.
//
// # Configuration vocabulary
//
// Every setting is a leaf of Config's TOML tree and has one dotted name,
// used three ways: the TOML key (raft.wal.fsync), the flag
// (-raft.wal.fsync) and the environment variable (URSULA_RAFT_WAL_FSYNC,
// see EnvName). Load layers them: defaults < TOML file (-config) <
// URSULA_* environment < flags. Each component registers its settings'
// flags, named by their keys, with their defaults and help (RegisterFlags);
// the environment and -h are derived from those flags, and a test checks
// that the flags and the TOML tree name the same settings. Lists are
// comma-separated on the command line and in the environment; raft.peers
// takes <id>/<cluster_url>/<client_url> entries and log.levels
// component=level pairs.
//
// Strictness: an unknown key in the file, an unknown URSULA_* variable
// whose first word is a section or top-level setting, a bad value (named
// by its key or variable) and a setting given twice under its old and new
// names are refused. URSULA_* variables that name no section (URSULA_BIN)
// are left alone.
//
// Deprecated names (settings.go): the keys renamed to the seed's names
// (raft.fsync, raft.data_dir, the [cold] section with cold.dir,
// cold.s3.prefix and cold.external_min_bytes) in the file, as flags and as
// variables, and the flag names of earlier releases (-data-dir,
// -node.listen, dashes for underscores). Each one used is logged once as a
// warning. The layering is hand-written over the standard flag package and
// BurntSushi/toml (already the file's decoder, with its undecoded-key
// check): a layering library would push the file through flag strings,
// which cannot carry [[raft.peers]], or need a second struct-tag scheme.
//
// -h (and -help) prints every setting with its type, default, help and
// variable, grouped by table; docs/configuration.md is generated from the
// same flags and checked by TestConfigurationReference. -version prints
// internal/buildinfo's line for the binary.
//
// A process that runs the gateway makes one in-flight request-body budget
// of server.http_inflight_body_size (services/platform/httpserver.Budget)
// and gives it to the gateway and the subscription APIs; the start is
// refused (InflightBodyBudgetTooSmall) when it is below the gateway's
// max_body_bytes, or, on a node, below 64 MiB.
//
// Under a service manager (systemd, Type=notify: $NOTIFY_SOCKET set), Main
// tells it READY=1 once the process serves, STATUS= lines, STOPPING=1 when
// a graceful shutdown begins, and WATCHDOG=1 every half of WatchdogSec
// (notify.go says what "serves" means for each target; package
// services/platform/sdnotify speaks the protocol).
package app
