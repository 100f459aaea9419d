// Command ursula runs Ursula's "all" target.
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, "all")) }
