// Package cli implements the airlock command. Each command group lives in
// its own file; this file holds the root command, the global flags and the
// output helpers every command uses. Only cmd/airlock imports it.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/termtext"
	"github.com/airlockhq/airlock/pkg/version"
)

// globals are the flags every command shares.
type globals struct {
	output string
	config string
	as     string
	stdout io.Writer
	stderr io.Writer
}

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
	g := &globals{stdout: stdout, stderr: stderr}
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
		fmt.Fprintln(stderr, "airlock: interrupted")
		return 130
	}
	fmt.Fprintf(stderr, "airlock: %s\n", errorText(err))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// usageError marks bad command-line input.
type usageError struct{ error }

// remoteError marks an error whose message carries a server's text, and
// through it perhaps a caller's or a job's.
type remoteError struct{ error }

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
			if g.output != "text" && g.output != "json" {
				return usageError{fmt.Errorf("-o %q: must be text or json", g.output)}
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "text", "output format: text or json")
	root.PersistentFlags().StringVar(&g.config, "config", "", "client config file (default $"+clientconfig.EnvVar+")")
	root.PersistentFlags().StringVar(&g.as, "as", "", "identity to act as, KIND/NAME from the client config's pki_dir (default: the config's identity)")
	root.AddCommand(newPKI(g), newDev(g), newStatus(g), newJob(g), newSession(g), newApproval(g), newLease(g), newAudit(g), newPublish(g), newDeployment(g))
	return root
}

// clientConfig loads the client config named by --config or $AIRLOCK_CONFIG.
func (g *globals) clientConfig() (*clientconfig.Config, error) {
	path := g.config
	if path == "" {
		path = os.Getenv(clientconfig.EnvVar)
	}
	if path == "" {
		return nil, usageError{fmt.Errorf("no client config: pass --config FILE or set %s (airlock dev up writes DIR/client.yaml)", clientconfig.EnvVar)}
	}
	return clientconfig.Load(path)
}

// print writes v as indented JSON with -o json, else calls text.
func (g *globals) print(v any, text func(w io.Writer)) error {
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	text(tw)
	return tw.Flush()
}

// commandText is a job's argv in one line, each argument escaped.
func commandText(argv []string) string {
	args := make([]string, len(argv))
	for i, a := range argv {
		args[i] = shellWord(termtext.Line(a))
	}
	return strings.Join(args, " ")
}

// shellWord quotes an (already escaped) argument as a POSIX shell would
// need it, so a reader can tell `a b` from `a` `b`.
func shellWord(a string) string {
	// The escaped text has no control characters left, and a backslash
	// in it begins termtext's own escapes: neither needs quoting.
	if a != "" && !strings.ContainsAny(a, " '\"$&|;<>()~#!`") {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

// allPages gathers a listing page by page: fetch gets the page token ("" for
// the first) and returns a page and the next token. It stops on the last
// page or once want items are in (want 0: all of them). A server ends its
// pages by bytes as well as by count, so one page is never the whole story.
func allPages[T any](want int, fetch func(token string, size int32) ([]T, string, error)) ([]T, error) {
	var out []T
	token := ""
	for {
		size := int32(500)
		if want > 0 {
			size = int32(min(want-len(out), 500))
		}
		page, next, err := fetch(token, size)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" || (want > 0 && len(out) >= want) {
			if want > 0 && len(out) > want {
				out = out[:want]
			}
			return out, nil
		}
		token = next
	}
}
