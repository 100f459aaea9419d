// Command ursulactl is the operator tool of an Ursula cluster: status,
// drain, undrain, wait, wait-ready, verify-cluster, rollout and thin admin
// verbs over the nodes' HTTP planes. See ops/README.md.
package main

import (
	"os"

	"github.com/ursula/ursula/ops/ursulactl"
)

func main() { os.Exit(ursulactl.Main(os.Args)) }
