package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// auditFilter is the flags that select audit events.
type auditFilter struct {
	job, tenant, caller, kind string
	since                     string
	limit                     int
}

// auditKinds are the kinds of event the authority records.
var auditKinds = audit.Kinds()

func (f *auditFilter) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.job, "job", "", "only events about this job")
	tenantFlag(cmd, &f.tenant, "only events about this tenant")
	cmd.Flags().StringVar(&f.caller, "caller", "", "only events by this caller SPIFFE ID")
	cmd.Flags().StringVar(&f.kind, "kind", "", "only events of this kind, e.g. job.granted or rpc.denied (all are listed above)")
	cmd.Flags().StringVar(&f.since, "since", "", "only events since a time (RFC 3339) or a duration ago (e.g. 1h)")
}

// auditFilterHelp ends the help of the commands that take an auditFilter:
// the kinds, a line for each group (approval., job., ...).
var auditFilterHelp = func() string {
	var b strings.Builder
	b.WriteString("The kinds of event (--kind):")
	group := ""
	for _, k := range auditKinds {
		if g, _, _ := strings.Cut(k, "."); g != group {
			group = g
			b.WriteString("\n ")
		}
		b.WriteString(" " + k)
	}
	return b.String()
}()

// request checks the flags and builds the request; the tenant is set by
// the caller once it knows whom it acts as.
func (f *auditFilter) request() (*authorityv1.ListAuditEventsRequest, error) {
	if f.kind != "" && !slices.Contains(auditKinds, f.kind) {
		return nil, usageError{fmt.Errorf("--kind %q: the authority records no such kind; want one of %s", f.kind, strings.Join(auditKinds, ", "))}
	}
	req := &authorityv1.ListAuditEventsRequest{JobId: f.job, Caller: f.caller, Kind: f.kind}
	start, err := whenFlag("since", f.since, time.Now())
	if err != nil {
		return nil, err
	}
	req.StartTime = start
	return req, nil
}

// eachAuditEvent pages through the log, oldest first, calling fn per event.
func eachAuditEvent(ctx context.Context, client authorityv1.AuthorityServiceClient, req *authorityv1.ListAuditEventsRequest, limit int, fn func(*authorityv1.AuditEvent) error) error {
	seen := 0
	for {
		req.PageSize = 1000
		resp, err := client.ListAuditEvents(ctx, req)
		if err != nil {
			return err
		}
		for _, e := range resp.GetEvents() {
			if limit > 0 && seen >= limit {
				return nil
			}
			if err := fn(e); err != nil {
				return err
			}
			seen++
		}
		if resp.GetNextPageToken() == "" {
			return nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

func newAudit(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read, export and verify the authority's hash-chained audit log (as an approver: --as approver/NAME)",
	}
	cmd.AddCommand(newAuditList(g), newAuditExport(g), newAuditVerify(g), newAuditCheckpoints(g))
	return cmd
}

func newAuditList(g *globals) *cobra.Command {
	var f auditFilter
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List audit events, oldest first",
		Long:  "Lists audit events, oldest first.\n\n" + auditFilterHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				if req.Tenant, err = self.tenant(f.tenant); err != nil {
					return err
				}
				resp := &authorityv1.ListAuditEventsResponse{}
				if err := eachAuditEvent(cmd.Context(), client, req, f.limit, func(e *authorityv1.AuditEvent) error {
					resp.Events = append(resp.Events, e)
					return nil
				}); err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) {
					fmt.Fprintln(w, "SEQ\tTIME\tKIND\tOUTCOME\tCALLER\tSUBJECT\tREASON")
					for _, e := range resp.GetEvents() {
						fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.GetSequence(), e.GetTime().AsTime().Local().Format(time.DateTime),
							termtext.Line(e.GetKind()), outcomeWord(e.GetOutcome()), termtext.Line(e.GetCaller()), termtext.Line(e.GetSubject()), termtext.Line(e.GetReason()))
					}
				})
			})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&f.limit, "limit", 200, "at most this many events (0: all)")
	return cmd
}

func newAuditExport(g *globals) *cobra.Command {
	var f auditFilter
	var out string
	cmd := &cobra.Command{
		Use:   "export [--out FILE]",
		Short: "Write the audit log as JSON lines (one event per line), oldest first",
		Long:  "Writes the audit log as JSON lines (one event per line), oldest first.\n\n" + auditFilterHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				if req.Tenant, err = self.tenant(f.tenant); err != nil {
					return err
				}
				w := termtext.Unwrap(g.Stdout) // JSON lines: data
				var file *atomicfile.File
				if out != "" {
					// Written beside the target and renamed, so an interrupted
					// export never leaves a partial file under the name asked for.
					file, err = atomicfile.Create(out, 0o600)
					if err != nil {
						return err
					}
					defer file.Abort()
					w = file
				}
				n := 0
				err = eachAuditEvent(cmd.Context(), client, req, 0, func(e *authorityv1.AuditEvent) error {
					line, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
					if err != nil {
						return err
					}
					n++
					_, err = fmt.Fprintf(w, "%s\n", line)
					return err
				})
				if file != nil && err == nil {
					err = file.Commit(atomicfile.Durable)
				}
				if err != nil {
					return err
				}
				if out != "" {
					fmt.Fprintf(g.Stderr, "exported %d events to %s\n", n, out)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "write to FILE instead of standard output")
	return cmd
}

var errChainBroken = errors.New("audit chain broken")

// auditEvent converts an API event to the form its hash is computed over.
func auditEvent(e *authorityv1.AuditEvent) audit.Event {
	return audit.Event{
		Sequence: e.GetSequence(), Time: e.GetTime().AsTime(), Kind: e.GetKind(), Caller: e.GetCaller(),
		Subject: e.GetSubject(), Tenant: e.GetTenant(), JobID: e.GetJobId(), Outcome: outcomeString(e.GetOutcome()),
		Reason: e.GetReason(), PrevHash: e.GetPreviousHash(), Hash: e.GetHash(),
	}
}

// outcomeString is the stored form of an outcome, which the hash covers.
func outcomeString(o authorityv1.AuditOutcome) string {
	if o == authorityv1.AuditOutcome_AUDIT_OUTCOME_UNSPECIFIED {
		return ""
	}
	return outcomeWord(o)
}
