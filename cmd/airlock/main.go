// Command airlock is the Airlock command line: PKI, a local dev stack, and
// (as the services grow) jobs, approvals, leases and the audit log.
package main

import (
	"os"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
