// Command ursula-backup runs Ursula's "backup" target: scheduled backups
// of a cluster into a location (services/backup), with retention.
package main

import (
	"os"

	"github.com/ursula/ursula/services/app"
)

func main() { os.Exit(app.Main(os.Args, "backup")) }
