package cli

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

func newJobEgress(g *globals) *cobra.Command {
	var refused bool
	cmd := &cobra.Command{
		Use:   "egress JOB_ID",
		Short: "List what a domains job's egress proxy and DNS server decided",
		Long: `List every connection and DNS query a job with a domains policy made, in
order: how it came (connect, http, transparent, dns), the name and port,
whether it was allowed and why, the address the proxy connected to, and
the bytes each way. Refusals past 20 per name per minute are counted in one
line. The record arrives with the job's result; the bundle's egress.jsonl
has all of it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := client.GetJobEgress(cmd.Context(), &authorityv1.GetJobEgressRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				l := resp.GetEgress()
				shown := int64(len(l.GetRecords()) + len(l.GetLast()))
				if refused && l != nil {
					only := func(recs []*authorityv1.EgressRecord) []*authorityv1.EgressRecord {
						return slices.DeleteFunc(slices.Clone(recs), func(r *authorityv1.EgressRecord) bool { return r.GetAllowed() })
					}
					l.Records, l.Last = only(l.GetRecords()), only(l.GetLast())
				}
				return g.PrintProto(resp, func(w io.Writer) {
					writeEgress(w, resp, shown)
					if refused && l != nil {
						fmt.Fprintln(w, "(allowed decisions left out: --refused)")
					}
				})
			})
		},
	}
	cmd.Flags().BoolVar(&refused, "refused", false, "list only what was refused")
	return cmd
}

// writeEgress prints a job's egress record for people; every name and
// reason is the job's doing, so each goes through termtext.
func writeEgress(w io.Writer, resp *authorityv1.GetJobEgressResponse, shown int64) {
	l := resp.GetEgress()
	if l == nil {
		state := jobStateWord(resp.GetState())
		switch resp.GetState() {
		case authorityv1.JobState_JOB_STATE_QUEUED, authorityv1.JobState_JOB_STATE_STAGING, authorityv1.JobState_JOB_STATE_RUNNING:
			fmt.Fprintf(w, "no egress record yet: the job is %s, and the record arrives with its result\n", state)
		default:
			fmt.Fprintf(w, "no egress record: the job (%s) had no domains policy, or ended before it ran\n", state)
		}
		return
	}
	writeEgressLog(w, l, shown)
}

// writeEgressLog prints a record's decisions, first and last, with how many
// are not shown between them.
func writeEgressLog(w io.Writer, l *authorityv1.EgressLog, shown int64) {
	fmt.Fprintln(w, "TIME\tVIA\tNAME\tPORT\tDECISION\tTO\tIN\tOUT\tREASON")
	rows := func(recs []egress.Record) {
		for _, r := range recs {
			decision, to := "refused", r.Addr
			if r.Allowed {
				decision = "allowed"
			}
			if r.Suppressed > 0 {
				decision += fmt.Sprintf(" x%d", r.Suppressed)
			}
			if r.Via == egress.ViaDNS {
				to = strings.Join(r.Answers, ",")
			}
			port := r.QType
			if r.Port > 0 {
				port = fmt.Sprint(r.Port)
			}
			reason := r.Reason
			if r.End != "" {
				reason += "; " + r.End
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format(time.TimeOnly), termtext.Line(cmp.Or(r.Via, "-")), termtext.Line(cmp.Or(r.Name, "-")),
				termtext.Line(port), decision, termtext.Line(to), humanBytes(r.BytesIn), humanBytes(r.BytesOut), termtext.Line(reason))
		}
	}
	rows(egresspb.Records(l.GetRecords()))
	if n := l.GetTotal() - shown; n > 0 {
		fmt.Fprintf(w, "... %d records not shown here (the bundle's egress.jsonl has every one)\n", n)
	}
	rows(egresspb.Records(l.GetLast()))
}

// writeEgressSummary is the review's view: per name, over the whole
// record, what went through and what was refused.
func writeEgressSummary(w io.Writer, l *authorityv1.EgressLog) {
	if l == nil {
		return
	}
	fmt.Fprintf(w, "egress     %d records of the job's domains policy, by name (approval show --egress lists them; the bundle's egress.jsonl has all)\n", l.GetTotal())
	names := egresspb.Names(l)
	if len(names) == 0 {
		// A report from before the executor summed the whole record.
		names = egress.Summarize(egresspb.Records(slices.Concat(l.GetRecords(), l.GetLast())))
	}
	for _, s := range names {
		fmt.Fprintf(w, "  %s  allowed %d, refused %d, in %s, out %s\n", termtext.Line(cmp.Or(s.Name, "(no name)")), s.Allowed, s.Refused, humanBytes(s.BytesIn), humanBytes(s.BytesOut))
	}
}
