// Command ursula-gateway runs Ursula's "gateway" target.
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, "gateway")) }
