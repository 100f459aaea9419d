package app

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ursula/ursula/storage/engine"
)

// errNoOrdinal refuses raft.node_id_from_hostname on a host whose name does
// not end in "-<n>".
var errNoOrdinal = errors.New(`app: raft.node_id_from_hostname: the host name does not end in "-<n>"`)

// resolveNodeID sets cfg.NodeID from the host name when
// raft.node_id_from_hostname is on: a host named "<name>-<n>" (a pod of a
// Kubernetes StatefulSet, whose ordinal n counts from 0) is node n+1. Only
// the first label of a dotted name counts. hostname is os.Hostname in
// production.
func resolveNodeID(cfg *engine.Config, hostname func() (string, error)) error {
	if !cfg.NodeIDFromHostname {
		return nil
	}
	host, err := hostname()
	if err != nil {
		return fmt.Errorf("raft.node_id_from_hostname: read the host name: %w", err)
	}
	id, err := nodeIDFromHostname(host)
	if err != nil {
		return err
	}
	cfg.NodeID = id
	return nil
}

// nodeIDFromHostname is 1 + the ordinal n of a host name "<name>-<n>".
func nodeIDFromHostname(host string) (uint64, error) {
	label, _, _ := strings.Cut(host, ".")
	i := strings.LastIndexByte(label, '-')
	if i <= 0 || i == len(label)-1 {
		return 0, fmt.Errorf("%w: %q", errNoOrdinal, host)
	}
	digits := label[i+1:]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q", errNoOrdinal, host)
		}
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n == 1<<64-1 || (len(digits) > 1 && digits[0] == '0') {
		return 0, fmt.Errorf("%w: %q (ordinal %q is not a plain number below 2^64-1)", errNoOrdinal, host, digits)
	}
	return n + 1, nil
}
