// Command runcue operates a runcue database from a terminal or a script:
// status, work, services, events, backups; every command works while an
// owner runs in another process. See package runcuecli for the commands
// and exit codes.
package main

import (
	"os"

	"github.com/runcue/runcue/cmd/runcuecli"
)

func main() {
	os.Exit(runcuecli.Main(runcuecli.Options{}, os.Args[1:]))
}
