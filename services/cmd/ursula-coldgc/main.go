// Command ursula-coldgc runs Ursula's "coldgc" target: the cold-GC and
// compaction worker of a split deployment.
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, "coldgc")) }
