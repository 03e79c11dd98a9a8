// Package cmdutil holds what every airlock command shares: the global
// flags and how output is printed, the errors that choose an exit code,
// required flags, and a service's health over mTLS. The root and the
// client commands (cli) and the local dev stack (dev) import it; nothing
// outside cmd/airlock does.
package cmdutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/termtext"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// Globals are the flags every command shares and where it writes.
type Globals struct {
	// Output is -o: text or json.
	Output string
	// Config is --config, the client config file.
	Config string
	// As is --as, the identity to act as.
	As string
	// Stdout and Stderr take text for people; on a terminal they may be
	// termtext writers, so data (JSON, raw bytes) goes to
	// termtext.Unwrap of them.
	Stdout io.Writer
	Stderr io.Writer
}

// UsageError marks bad command-line input: exit status 2 (IsUsage).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }

// Usage marks e as bad command-line input for IsUsage.
func (UsageError) Usage() {}

// Usagef is a UsageError with a formatted message.
func Usagef(format string, args ...any) error { return UsageError{Err: fmt.Errorf(format, args...)} }

// IsUsage reports whether err, or an error it wraps, is bad command-line
// input: one with a Usage method, as UsageError has.
func IsUsage(err error) bool {
	var u interface{ Usage() }
	return errors.As(err, &u)
}

// ClientConfig loads the client config named by --config or $AIRLOCK_CONFIG.
func (g *Globals) ClientConfig() (*clientconfig.Config, error) {
	path := g.Config
	if path == "" {
		path = os.Getenv(clientconfig.EnvVar)
	}
	if path == "" {
		return nil, Usagef("no client config: pass --config FILE or set %s (airlock dev up writes DIR/client.yaml)", clientconfig.EnvVar)
	}
	return clientconfig.Load(path)
}

// Print writes v as indented JSON with -o json, else calls text with a
// writer that lines up tab-separated columns.
func (g *Globals) Print(v any, text func(w io.Writer)) error {
	if g.Output == "json" {
		enc := json.NewEncoder(termtext.Unwrap(g.Stdout))
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
	text(tw)
	return tw.Flush()
}

// PrintProto writes one message as JSON (-o json) or via text.
func (g *Globals) PrintProto(m proto.Message, text func(w io.Writer)) error {
	if g.Output == "json" {
		data, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(termtext.Unwrap(g.Stdout), string(data))
		return err
	}
	return g.Print(nil, text)
}

// Required marks flags required (cobra's MarkFlagRequired, so help and
// completion say so) and checks them before the command runs, after its
// arguments: one left empty is a UsageError naming every required flag,
// "--dir and --id are required".
func Required(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		if err := cmd.MarkFlagRequired(n); err != nil {
			panic(err) // a flag the command never defined
		}
	}
	args := cmd.Args
	cmd.Args = func(c *cobra.Command, a []string) error {
		if args != nil {
			if err := args(c, a); err != nil {
				return err
			}
		}
		for _, n := range names {
			if c.Flags().Lookup(n).Value.String() == "" {
				verb := "is"
				if len(names) > 1 {
					verb = "are"
				}
				return Usagef("--%s %s required", strings.Join(names, " and --"), verb)
			}
		}
		return nil
	}
}

// CheckHealth asks one server for the health of component ("" for the
// whole server), pinning its identity.
func CheckHealth(ctx context.Context, addr string, src *tlsconfig.Source, server identity.ID, component string) (string, error) {
	cc, err := grpcclient.Dial(addr, src, server)
	if err != nil {
		return "UNREACHABLE", err
	}
	defer cc.Close()
	return CheckHealthOn(ctx, cc, component)
}

// CheckHealthOn is CheckHealth over a connection the caller keeps: one
// that polls a starting server keeps its connection between attempts, so
// a connection still being made (a lost SYN is sent again only after a
// second) is not thrown away with each attempt's deadline.
func CheckHealthOn(ctx context.Context, cc grpc.ClientConnInterface, component string) (string, error) {
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: component})
	if err != nil {
		return "UNREACHABLE", err
	}
	return resp.GetStatus().String(), nil
}
