// Command ursula-node runs Ursula's "node" target.
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, "node")) }
