// Command ursula runs Ursula's "all" target; run under the name of a
// per-role binary (a link named ursula-node, as in the container image),
// it runs that binary's target (app.TargetForName).
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, app.TargetForName(os.Args[0]))) }
