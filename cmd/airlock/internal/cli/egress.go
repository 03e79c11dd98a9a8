package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newJobEgress(g *globals) *cobra.Command {
	var refused, follow bool
	cmd := &cobra.Command{
		Use:   "egress JOB_ID",
		Short: "List what a domains job's egress proxy and DNS server decided",
		Long: `List every connection and DNS query a job with a domains policy made, in
order: how it came (connect, http, transparent, dns), the name and port,
whether it was allowed and why, the address the proxy connected to, and
the bytes each way, how it ended and which end closed first, and for TLS
how the handshake went (completed, or failed: who sent an alert after how
many bytes from the other end), read from the TLS record headers (nothing
is decrypted). Refusals past 20 per name per minute are counted in one
line. The record arrives with the job's result; the bundle's egress.jsonl
has all of it. --follow streams each decision as the executor records it
(a connection when it closes) while the job runs, until the job ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				if follow {
					return followEgress(cmd.Context(), g, client, args[0], refused)
				}
				resp, err := client.GetJobEgress(cmd.Context(), &authorityv1.GetJobEgressRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				l := resp.GetEgress()
				shown := int64(len(l.GetRecords()) + len(l.GetLast()))
				if refused && l != nil {
					only := func(recs []*typesv1.EgressRecord) []*typesv1.EgressRecord {
						return slices.DeleteFunc(slices.Clone(recs), func(r *typesv1.EgressRecord) bool { return r.GetAllowed() })
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
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "stream each decision as it is recorded, until the job ends")
	return cmd
}

// followEgress prints a job's egress decisions as the executor records
// them, until the job ends (-o json: each as a JSON object). A dropped
// stream resumes after the last decision printed.
func followEgress(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, jobID string, refused bool) error {
	var next int64
	shown := false
	job, err := followJob(ctx, g, client, func() *authorityv1.WatchJobRequest {
		// Output offsets past any end: no output, the egress record only.
		return &authorityv1.WatchJobRequest{JobId: jobID, StdoutOffset: math.MaxInt64, StderrOffset: math.MaxInt64, Egress: true, EgressOffset: next}
	}, func(msg *authorityv1.WatchJobResponse) error {
		ev := msg.GetEgress()
		if ev == nil || ev.GetIndex() < next {
			return nil
		}
		next = ev.GetIndex() + 1
		if refused && ev.GetRecord().GetAllowed() {
			return nil
		}
		err := g.PrintProto(ev, func(w io.Writer) {
			if !shown {
				fmt.Fprintln(w, egressHeader)
			}
			writeEgressRow(w, egresspb.Records([]*typesv1.EgressRecord{ev.GetRecord()})[0])
		})
		shown = true
		return err
	})
	if err != nil {
		return err
	}
	if !shown && g.Output == "text" {
		fmt.Fprintf(g.Stdout, "no egress decisions: the job (%s) had no domains policy, or made no connection nor query\n", jobStateWord(job.GetState()))
	}
	return nil
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
	fmt.Fprintln(w, egressHeader)
	rows := func(recs []egress.Record) {
		for _, r := range recs {
			writeEgressRow(w, r)
		}
	}
	rows(egresspb.Records(l.GetRecords()))
	if n := l.GetTotal() - shown; n > 0 {
		fmt.Fprintf(w, "... %d records not shown here (the bundle's egress.jsonl has every one)\n", n)
	}
	rows(egresspb.Records(l.GetLast()))
}

const egressHeader = "TIME\tVIA\tNAME\tPORT\tDECISION\tTO\tIN\tOUT\tREASON"

// writeEgressRow prints one decision under egressHeader.
func writeEgressRow(w io.Writer, r egress.Record) {
	if r.Via == egress.ViaRequest {
		writeRequestRow(w, r)
		return
	}
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
	if e := egressEnd(r); e != "" {
		reason += "; " + e
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format(time.TimeOnly), termtext.Line(cmp.Or(r.Via, "-")), termtext.Line(cmp.Or(r.Name, "-")),
		termtext.Line(port), decision, termtext.Line(to), humanBytes(r.BytesIn), humanBytes(r.BytesOut), termtext.Line(reason))
}

// writeRequestRow prints a request line under egressHeader: the request
// where the name goes, the upstream's status where the address goes, and
// the brokered credential it carried before the reason, e.g.
// "request  GET api.test/v1/x  443  allowed  200  1.0KiB  120B  credential=gh".
func writeRequestRow(w io.Writer, r egress.Record) {
	decision := "refused"
	if r.Allowed {
		decision = "allowed"
	}
	if r.Suppressed > 0 {
		decision += fmt.Sprintf(" x%d", r.Suppressed)
	}
	status := "-"
	if r.Status > 0 {
		status = fmt.Sprint(r.Status)
	}
	reason := "credential=" + cmp.Or(r.Credential, "none")
	if r.Reason != "" {
		reason += "; " + r.Reason
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format(time.TimeOnly), egress.ViaRequest,
		termtext.Line(strings.TrimSpace(r.Method+" "+cmp.Or(r.Name, "-")+r.Path)), r.Port, decision, status,
		humanBytes(r.BytesIn), humanBytes(r.BytesOut), termtext.Line(reason))
}

// egressEnd says how an allowed connection went, for people: its TLS
// handshake, then how it ended and which end closed first, e.g. "tls
// handshake failed: the job sent an alert after 2.1KiB from the server;
// the job closed first".
func egressEnd(r egress.Record) string {
	var parts []string
	if t := r.TLS; t != nil {
		switch t.Handshake {
		case egress.HandshakeCompleted:
			parts = append(parts, "tls handshake completed")
		case egress.HandshakeFailed:
			if t.By != "" {
				parts = append(parts, fmt.Sprintf("tls handshake failed: the %s sent an alert after %s from the %s", t.By, humanBytes(t.After), otherSide(t.By)))
			} else {
				parts = append(parts, "tls handshake failed: ended before it completed, no alert seen")
			}
		case egress.HandshakeNotTLS:
			parts = append(parts, fmt.Sprintf("not tls: the %s sent bytes that are not TLS records", cmp.Or(string(t.By), "other end")))
		case egress.HandshakeUndecided:
			parts = append(parts, fmt.Sprintf("tls handshake not seen to end in the first %s each way", humanBytes(egress.MaxTLSWatch)))
		}
	}
	switch {
	case r.End == "closed" && r.ClosedFirst != "":
		parts = append(parts, fmt.Sprintf("the %s closed first", r.ClosedFirst))
	case r.End != "":
		parts = append(parts, r.End)
	}
	return strings.Join(parts, "; ")
}

func otherSide(s egress.Side) egress.Side {
	if s == egress.SideJob {
		return egress.SideServer
	}
	return egress.SideJob
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
	writeCredentialUses(w, egresspb.CredentialUses(l))
}

// writeCredentialUses prints how the job used each brokered credential:
// requests the proxy added it to, requests to its hosts it refused, and
// their bytes. Nothing for a job without credentials.
func writeCredentialUses(w io.Writer, uses []egress.CredentialSummary) {
	if len(uses) == 0 {
		return
	}
	fmt.Fprintln(w, "credentials  brokered: the egress proxy added them; the job never held them")
	for _, c := range uses {
		fmt.Fprintf(w, "  %s  requests %d, refused %d, in %s, out %s\n", termtext.Line(c.Name), c.Requests, c.Refused, humanBytes(c.BytesIn), humanBytes(c.BytesOut))
	}
}
