// Command airlock-execd is a session sandbox's exec helper (package
// sandbox/execd): the executor starts it in the sandbox, once, and starts
// the session's execs through it. Build it static (CGO_ENABLED=0): it runs
// on any image.
package main

import (
	"os"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox/execd"
)

func main() { os.Exit(execd.Main()) }
