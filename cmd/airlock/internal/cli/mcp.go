package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	airlockmcp "github.com/airlockhq/airlock/cmd/airlock/internal/mcp"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/version"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newMCP(g *globals) *cobra.Command {
	var httpAddr, tokenFile string
	cmd := &cobra.Command{
		Use:   "mcp [--http 127.0.0.1:PORT [--token-file FILE]]",
		Short: "Serve sessions to an agent as MCP tools, as this config's client identity",
		Long: `Serves an MCP server (Model Context Protocol) whose tools create a session,
run commands in it, read, write and list its files, show its status and
egress, and finish it, opening its approval. It acts as the client identity
of the client config (--config, --as): it cannot approve, publish, widen a
policy or see another tenant, as that client cannot. docs/mcp.md has the
tools, their bounds and their retry rules.

Without --http it speaks MCP on standard input and output (an MCP client
starts it as a command). With --http it serves streamable HTTP at
http://ADDR/mcp on loopback only (127.0.0.1 or ::1; port 0 picks one),
requiring "Authorization: Bearer TOKEN": the first line of --token-file,
else $` + airlockmcp.TokenEnv + `, else a random token printed once on stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var token string
			if httpAddr != "" {
				if err := airlockmcp.CheckLoopback(httpAddr); err != nil {
					return usageError{err}
				}
				tok, generated, err := airlockmcp.Token(tokenFile)
				if err != nil {
					return usageError{err}
				}
				token = tok
				if generated {
					fmt.Fprintf(g.Stderr, "airlock mcp: token %s (shown once; clients send Authorization: Bearer TOKEN)\n", token)
				}
			} else if tokenFile != "" {
				return usageError{errors.New("--token-file is for --http")}
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				if self.id.Kind != identity.KindClient {
					return usageError{fmt.Errorf("airlock mcp acts as a client identity, and this is %s: pass --as client/NAME or a client's config", self.id.Principal())}
				}
				s := airlockmcp.New(mcpOptions(client, self))
				if httpAddr == "" {
					return s.Run(cmd.Context(), &mcp.StdioTransport{})
				}
				return airlockmcp.ServeHTTP(cmd.Context(), s, httpAddr, token, func(a net.Addr) {
					fmt.Fprintf(g.Stderr, "airlock mcp: serving http://%s/mcp as %s\n", a, self.id.Principal())
				})
			})
		},
	}
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this loopback address, 127.0.0.1:PORT or [::1]:PORT, instead of stdio")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "with --http, the bearer token clients must send: this file's first line (default $"+airlockmcp.TokenEnv+", else random)")
	return cmd
}

// mcpOptions wires the MCP server to the CLI: its connection, its tenant
// rule, its session spec from create_session's arguments (as session
// create's flags) and its text for a session's status.
func mcpOptions(client authorityv1.AuthorityServiceClient, self *caller) airlockmcp.Options {
	return airlockmcp.Options{
		Authority:   client,
		Tenant:      self.tenant,
		SessionSpec: mcpSessionSpec,
		SessionText: func(ctx context.Context, id string) (string, error) { return mcpSessionText(ctx, client, id) },
		ExecOutcome: execOutcome,
		StateWord:   jobStateWord,
		ReasonWord:  reasonWord,
		Version:     version.String(),
	}
}

// mcpSessionSpec is the spec session create builds from the same values
// as flags.
func mcpSessionSpec(a airlockmcp.CreateSessionArgs) (*authorityv1.JobSpec, error) {
	f := submitFlags{repo: a.Repository, rev: a.Revision, image: a.Image, runtime: a.Runtime, cpu: a.CPU, memory: a.Memory, disk: a.Disk,
		pids: a.Pids, publishTo: a.PublishTo, net: networkFlags{allow: a.Allow, allowDomain: a.AllowDomains, denyAll: a.DenyAll}}
	if f.rev == "" {
		f.rev = "HEAD"
	}
	if f.repo == "" {
		return nil, errors.New("repository is required")
	}
	var idle time.Duration
	for _, d := range []struct {
		name, in string
		out      *time.Duration
	}{{"timeout", a.Timeout, &f.timeout}, {"idle_timeout", a.IdleTimeout, &idle}} {
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%s %q: want a positive duration such as 30m", d.name, d.in)
		}
		*d.out = v
	}
	spec, err := f.spec(nil)
	if err != nil {
		// It names the flag: --allow-domain is allow_domains.
		return nil, fmt.Errorf("%v (the flag of session create named by the argument of the same name)", err)
	}
	spec.Session = &typesv1.SessionSpec{}
	if idle > 0 {
		spec.Session.IdleTimeout = durationpb.New(idle)
	}
	return spec, nil
}

// mcpSessionText is session get's text, then the egress decisions: the
// record once the session has ended, else those recorded so far (read for
// up to a second from the live stream).
func mcpSessionText(ctx context.Context, client authorityv1.AuthorityServiceClient, id string) (string, error) {
	resp, err := client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: id})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	writeSessionGet(&b, resp)
	b.WriteString("\n")
	if !terminal(resp.GetSession().GetState()) {
		writeLiveEgress(ctx, &b, client, id)
		return b.String(), nil
	}
	eg, err := client.GetJobEgress(ctx, &authorityv1.GetJobEgressRequest{JobId: id})
	if err != nil {
		return "", err
	}
	l := eg.GetEgress()
	writeEgress(&b, eg, int64(len(l.GetRecords())+len(l.GetLast())))
	return b.String(), nil
}

// writeLiveEgress writes the egress decisions a running session recorded
// so far, at most 200.
func writeLiveEgress(ctx context.Context, b *strings.Builder, client authorityv1.AuthorityServiceClient, id string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	stream, err := client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: id, StdoutOffset: math.MaxInt64, StderrOffset: math.MaxInt64, Egress: true})
	var recs []*typesv1.EgressRecord
	more := false
	for err == nil {
		var msg *authorityv1.WatchJobResponse
		if msg, err = stream.Recv(); err == nil && msg.GetEgress() != nil {
			if len(recs) == 200 {
				more = true
				break
			}
			recs = append(recs, msg.GetEgress().GetRecord())
		}
	}
	if len(recs) == 0 {
		b.WriteString("egress: no decision recorded so far (a session without a domains policy records none)\n")
		return
	}
	fmt.Fprintln(b, "egress decisions so far:")
	fmt.Fprintln(b, egressHeader)
	for _, r := range egresspb.Records(recs) {
		writeEgressRow(b, r)
	}
	if more {
		b.WriteString("... more decisions not shown here (the bundle's egress.jsonl has every one)\n")
	}
}
