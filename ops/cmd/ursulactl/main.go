// Command ursulactl is the operator tool of an Ursula cluster: status,
// drain, undrain, wait, wait-ready, verify-cluster, rollout and thin admin
// verbs over the nodes' HTTP planes; --version, --json on every verb and
// shell completion (ursulactl completion bash). See ops/README.md.
package main

import (
	"os"

	"github.com/ursula/ursula/ops/ursulactl"
)

func main() { os.Exit(ursulactl.Main(os.Args)) }
