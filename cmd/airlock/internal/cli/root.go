// Package cli implements the airlock command: the root and every client
// command. Each command group (a noun: job, session, approval, lease,
// audit, publish and deployment, pki, status, executor) is a file of its own; rpc.go
// is the one way a command dials a service, calls it and prints the
// answer, and words.go the one word for each state and kind. The local
// dev stack is package dev, and what both share is package cmdutil. This
// file holds the root command, the global flags and the exit codes. Only
// cmd/airlock imports it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/cmd/airlock/internal/dev"
	"github.com/airlockhq/airlock/cmd/airlock/internal/selftest"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/termtext"
	"github.com/airlockhq/airlock/pkg/version"
)

// globals are the flags every command shares (cmdutil.Globals).
type globals = cmdutil.Globals

// usageError marks bad command-line input, exit status 2, as
// cmdutil.UsageError does for the commands outside this package.
type usageError struct{ error }

// Usage marks the error for cmdutil.IsUsage.
func (usageError) Usage() {}

// remoteError marks an error whose message carries a server's text, and
// through it perhaps a caller's or a job's.
type remoteError struct{ error }

// exitError carries a specific exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Main runs the airlock command with args and returns the exit code: 0 on
// success, 1 on failure, 2 on bad usage, or the code a command chose.
func Main(args []string, stdout, stderr io.Writer) int {
	g := &globals{Stdout: textWriter(stdout), Stderr: textWriter(stderr)}
	defer flushText(g.Stdout)
	defer flushText(g.Stderr)
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Ctrl-C (or SIGTERM) cancels the command's context, and with it the
	// RPC in flight, instead of killing the process mid-write.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if ctx.Err() != nil {
		fmt.Fprintln(g.Stderr, "airlock: interrupted")
		return 130
	}
	fmt.Fprintf(g.Stderr, "airlock: %s\n", errorText(err))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if cmdutil.IsUsage(err) {
		return 2
	}
	return 1
}

// errorText is err as Main prints it, escaped: a remoteError on one line, so
// a server cannot add lines of its own; any other keeps its line breaks (a
// config file's several problems, a service's last log lines).
func errorText(err error) string {
	var re remoteError
	if errors.As(err, &re) {
		return termtext.Line(err.Error())
	}
	return termtext.Block(err.Error())
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "airlock",
		Short: "Run untrusted agent work in real sandboxes and publish only what people approved",
		Long: `airlock is the command line for Airlock: a certificate authority for its
identities, a local three-service stack for development, and the client of
the authority, executor and publisher.`,
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if g.Output != "text" && g.Output != "json" {
				return usageError{fmt.Errorf("-o %q: must be text or json", g.Output)}
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVarP(&g.Output, "output", "o", "text", "output format: text or json")
	root.PersistentFlags().StringVar(&g.Config, "config", "", "client config file (default $"+clientconfig.EnvVar+")")
	root.PersistentFlags().StringVar(&g.As, "as", "", "identity to act as, KIND/NAME from the client config's pki_dir (default: the config's identity)")
	root.AddCommand(newPKI(g), dev.New(g), newStatus(g), newJob(g), newSession(g), newApproval(g), newLease(g), newAudit(g), newPublish(g), newDeployment(g), newCache(g), newImage(g), newExecutor(g), newUsage(g), newConsole(g), newMCP(g), selftest.New(g))
	return root
}
