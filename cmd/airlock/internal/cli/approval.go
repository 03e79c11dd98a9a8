package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

func newApproval(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approval",
		Short: "Review, approve and deny results waiting to be published (as an approver: --as approver/NAME)",
	}
	cmd.AddCommand(newApprovalList(g), newApprovalShow(g), newApprovalDecide(g, true), newApprovalDecide(g, false))
	return cmd
}

var approvalStates = map[string]authorityv1.ApprovalState{
	"pending":  authorityv1.ApprovalState_APPROVAL_STATE_PENDING,
	"approved": authorityv1.ApprovalState_APPROVAL_STATE_APPROVED,
	"denied":   authorityv1.ApprovalState_APPROVAL_STATE_DENIED,
	"consumed": authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED,
	"expired":  authorityv1.ApprovalState_APPROVAL_STATE_EXPIRED,
}

func newApprovalList(g *globals) *cobra.Command {
	var tenant string
	var states []string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List approval requests, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &authorityv1.ListApprovalsRequest{}
			for _, s := range states {
				st, ok := approvalStates[s]
				if !ok {
					return usageError{fmt.Errorf("--state %q: want pending, approved, denied, consumed or expired", s)}
				}
				req.States = append(req.States, st)
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) (err error) {
				if req.Tenant, err = self.tenant(tenant); err != nil {
					return err
				}
				list, err := allPages(0, func(token string, size int32) ([]*authorityv1.Approval, string, error) {
					req.PageToken, req.PageSize = token, size
					r, err := client.ListApprovals(cmd.Context(), req)
					return r.GetApprovals(), r.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				resp := &authorityv1.ListApprovalsResponse{Approvals: list}
				return g.PrintProto(resp, func(w io.Writer) {
					fmt.Fprintln(w, "APPROVAL\tJOB\tSTATE\tVOTES\tFOR\tDIGEST\tEXPIRES")
					for _, a := range resp.GetApprovals() {
						what := approvalWhat(a)
						fmt.Fprintf(w, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", termtext.Line(a.GetApprovalId()), termtext.Line(a.GetJobId()), stateWord(a.GetState()),
							approvals(a), a.GetRequiredApprovals(), termtext.Line(what),
							termtext.Line(short(strings.TrimPrefix(a.GetBundleDigest(), "sha256:"))), a.GetExpiresAt().AsTime().Local().Format(time.DateTime))
					}
				})
			})
		},
	}
	tenantFlag(cmd, &tenant, "only this tenant's requests, else an approver sees every tenant's")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only requests in these states (pending, approved, denied, consumed, expired)")
	return cmd
}

// approvalWhat says in a line what a request asks for (not escaped).
func approvalWhat(a *authorityv1.Approval) string {
	switch a.GetKind() {
	case authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE:
		return "change: " + strings.Join(a.GetChange().GetWidens(), "; ")
	case authorityv1.ApprovalKind_APPROVAL_KIND_START:
		return "start with credentials " + startNames(a.GetStart())
	case authorityv1.ApprovalKind_APPROVAL_KIND_PORT_FORWARD:
		return fmt.Sprintf("port forward to port %d", a.GetPortForward().GetPort())
	}
	return "publish " + a.GetTarget().GetRepository() + ":" + a.GetTarget().GetBranch()
}

func approvals(a *authorityv1.Approval) int {
	n := 0
	for _, v := range a.GetVotes() {
		if v.GetDecision() == authorityv1.Decision_DECISION_APPROVE {
			n++
		}
	}
	return n
}

func newApprovalShow(g *globals) *cobra.Command {
	var full, raw, egressToo bool
	var parts []string
	cmd := &cobra.Command{
		Use:   "show APPROVAL_ID",
		Short: "Show a request with everything a reviewer needs: every file it changes, then the patch and the output",
		Long: `Show a request with everything a reviewer needs: the result, the votes,
the complete list of the files the patch changes (status, mode, lines,
size), the patch and the end of the output. Wherever the patch or the
output is shortened, it says how many bytes are not shown and which files'
diffs are shown only in part or not at all.

--full streams the complete file list, patch and output from the result
bundle itself, through the authority, and ends by confirming that every
byte was the bundle this request names (it fails otherwise).

Everything the job wrote (paths, patch, output) is shown as it lands, a
backslash as a backslash, except control characters, invalid UTF-8 and
invisible or bidirectional characters: each is shown escaped (\x1b,
\u202e), in reverse video on a terminal and between the marks ⟦ ⟧ in a
file or pipe (where a ⟦ or ⟧ of the job's own is escaped too, so no text
passes for an escape); a legend line says so when there are any. Each
line of the job's stands behind a "| " gutter so no line of it can pass
for one of ours. With --full, --part picks what is
streamed (files, patch, stdout, stderr; all by default), and --raw with one
part of bytes writes exactly those bytes and nothing else, once the whole
bundle has been verified:

  airlock approval show ID --full --raw --part patch | git apply

applies exactly the approved patch (the verification goes to stderr; the
command fails, writing nothing, if it does not hold).

--egress lists, after the review, each decision a domains job's egress
proxy and DNS server made (its first and last 500), where the review shows
only their totals by name.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (raw || len(parts) > 0) && !full {
				return usageError{errors.New("--raw and --part go with --full")}
			}
			if egressToo && full {
				return usageError{errors.New("--egress goes without --full (the bundle's egress.jsonl has the whole record)")}
			}
			if _, err := reviewParts(parts); err != nil {
				return err
			}
			// What is printed goes through a watcher, so the legend
			// comes only after text that has escapes.
			gw := *g
			gw.Stdout = termtext.NewWatcher(g.Stdout)
			g := &gw
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := client.GetApproval(cmd.Context(), &authorityv1.GetApprovalRequest{ApprovalId: args[0]})
				if err != nil {
					return err
				}
				a, rv := resp.GetApproval(), resp.GetReview()
				if full && !hasBundle(a) {
					return usageError{errors.New("--full: a change or start request has no result bundle; approval show prints all of it")}
				}
				if full && (g.Output == "json" || bareReview(raw, parts)) {
					// One JSON object a line, each a ReadReview message; or
					// one part's bytes and nothing else.
					return streamReview(cmd.Context(), g, client, a, raw, parts)
				}
				err = g.PrintProto(resp, func(w io.Writer) { writeRequest(w, a, rv) })
				if err != nil {
					return err
				}
				if !full {
					defer writeLegend(g.Stdout)
					if g.Output != "json" && hasBundle(a) {
						// Not through the table writer: a tab in the patch
						// stays a tab.
						writeReview(g.Stdout, a, rv)
					}
					if egressToo && g.Output != "json" {
						l := rv.GetDetail().GetEgress()
						if l == nil {
							fmt.Fprintln(g.Stdout, "\negress     nothing recorded: the job had no domains policy")
							return nil
						}
						fmt.Fprintln(g.Stdout, "\n--- egress decisions ---")
						return g.Print(nil, func(w io.Writer) { writeEgressLog(w, l, int64(len(l.GetRecords())+len(l.GetLast()))) })
					}
					return nil
				}
				return streamReview(cmd.Context(), g, client, a, raw, parts)
			})
		},
	}
	cmd.Flags().BoolVar(&full, "full", false, "stream the complete file list, patch and output from the result bundle, verified against its digest")
	cmd.Flags().BoolVar(&raw, "raw", false, "with --full, write the bundle's bytes unescaped")
	cmd.Flags().StringSliceVar(&parts, "part", nil, "with --full, only these parts: files, patch, stdout, stderr")
	cmd.Flags().BoolVar(&egressToo, "egress", false, "after the review, list each egress decision of a domains job")
	return cmd
}

// writeRequest prints what a request is and its votes, as approval show
// does before the review: a change's, a start's or a port forward's whole
// story, or a publish request's job and result.
func writeRequest(w io.Writer, a *authorityv1.Approval, rv *authorityv1.ReviewMaterial) {
	fmt.Fprintf(w, "approval   %s (%s, %d of %d approvals)\n", termtext.Line(a.GetApprovalId()), stateWord(a.GetState()), approvals(a), a.GetRequiredApprovals())
	if a.GetKind() == authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE {
		c := a.GetChange()
		fmt.Fprintf(w, "change to  running job %s, asked by %s\n", termtext.Line(a.GetJobId()), termtext.Line(a.GetRequester()))
		fmt.Fprintf(w, "digest     %s\n", termtext.Line(a.GetBundleDigest()))
		fmt.Fprintf(w, "command    %s\n", commandText(rv.GetCommand()))
		fmt.Fprintf(w, "limits     %s\n        ->  %s\n", limitsText(c.GetFromLimits()), limitsText(c.GetToLimits()))
		fmt.Fprintf(w, "network    %s\n        ->  %s\n", termtext.Line(policyText(c.GetFromNetworkPolicy())), termtext.Line(policyText(c.GetToNetworkPolicy())))
		if c.GetFromSession() != nil {
			fmt.Fprintf(w, "session    %s\n        ->  %s\n", sessionText(c.GetFromSession()), sessionText(c.GetToSession()))
		}
		for _, x := range c.GetWidens() {
			fmt.Fprintf(w, "widens     %s\n", termtext.Line(x))
		}
		writeVotes(w, a)
		return
	}
	if a.GetKind() == authorityv1.ApprovalKind_APPROVAL_KIND_START {
		writeStart(w, a, rv)
		writeVotes(w, a)
		return
	}
	if a.GetKind() == authorityv1.ApprovalKind_APPROVAL_KIND_PORT_FORWARD {
		writePortForwardRequest(w, a)
		writeVotes(w, a)
		return
	}
	writeReviewHeader(w, a, rv)
	writeVotes(w, a)
}

// hasBundle reports whether a request is about a result bundle (a
// publish request), not a change or a start.
func hasBundle(a *authorityv1.Approval) bool {
	k := a.GetKind()
	return k != authorityv1.ApprovalKind_APPROVAL_KIND_CHANGE && k != authorityv1.ApprovalKind_APPROVAL_KIND_START &&
		k != authorityv1.ApprovalKind_APPROVAL_KIND_PORT_FORWARD
}

// startNames lists a start request's credentials, those that need the
// approval marked.
func startNames(r *authorityv1.StartRequest) string {
	var names []string
	for _, c := range r.GetCredentials() {
		n := c.GetName()
		if c.GetApprovalRequired() {
			n += " (approval required)"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// writeStart prints what a start request is about: the queued job, what
// it runs, and each brokered credential it asks for with its hosts.
func writeStart(w io.Writer, a *authorityv1.Approval, rv *authorityv1.ReviewMaterial) {
	fmt.Fprintf(w, "start of   queued job %s, asked by %s\n", termtext.Line(a.GetJobId()), termtext.Line(a.GetRequester()))
	fmt.Fprintf(w, "digest     %s\n", termtext.Line(a.GetBundleDigest()))
	fmt.Fprintf(w, "commit     %s\n", termtext.Line(rv.GetCommit()))
	fmt.Fprintf(w, "command    %s\n", commandText(rv.GetCommand()))
	fmt.Fprintf(w, "network    %s\n", termtext.Line(policyText(rv.GetNetworkPolicy())))
	for _, c := range a.GetStart().GetCredentials() {
		need := ""
		if c.GetApprovalRequired() {
			need = ", approval required"
		}
		fmt.Fprintf(w, "credential %s for %s%s\n", termtext.Line(c.GetName()), termtext.Line(strings.Join(c.GetHosts(), ", ")), need)
	}
	fmt.Fprintf(w, "on approve the job goes to an executor, its egress proxy adding these credentials; on deny or expiry it is cancelled, never run\n")
}

// writeVotes prints a request's expiry and its votes.
func writeVotes(w io.Writer, a *authorityv1.Approval) {
	fmt.Fprintf(w, "expires    %s\n", a.GetExpiresAt().AsTime().Local().Format(time.DateTime))
	for _, v := range a.GetVotes() {
		fmt.Fprintf(w, "vote       %s %s: %s\n", termtext.Line(v.GetApprover()), decisionWord(v.GetDecision()), termtext.Line(v.GetComment()))
	}
}

func newApprovalDecide(g *globals, approve bool) *cobra.Command {
	var comment, digest string
	verb, decision := "deny", authorityv1.Decision_DECISION_DENY
	summary := "Deny a request (one deny ends it; a comment is required)"
	if approve {
		verb, decision = "approve", authorityv1.Decision_DECISION_APPROVE
		summary = "Approve a request for its bundle digest and target"
	}
	cmd := &cobra.Command{
		Use:   verb + " APPROVAL_ID",
		Short: summary,
		Long: summary + `.

The decision is bound to a bundle digest: by default the one the request
names (the one "approval show" displays); pass --digest to insist on the
digest you reviewed, so nothing else can be approved in its place.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !approve && strings.TrimSpace(comment) == "" {
				return usageError{errors.New("--comment is required when denying")}
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				if digest == "" {
					resp, err := client.GetApproval(cmd.Context(), &authorityv1.GetApprovalRequest{ApprovalId: args[0]})
					if err != nil {
						return err
					}
					digest = resp.GetApproval().GetBundleDigest()
				}
				resp, err := client.DecideApproval(cmd.Context(), &authorityv1.DecideApprovalRequest{
					ApprovalId: args[0], BundleDigest: digest, Decision: decision, Comment: comment,
				})
				if err != nil {
					return err
				}
				a := resp.GetApproval()
				return g.PrintProto(a, func(w io.Writer) {
					fmt.Fprintf(w, "%s: %s (%d of %d approvals)\n", termtext.Line(a.GetApprovalId()), stateWord(a.GetState()), approvals(a), a.GetRequiredApprovals())
				})
			})
		},
	}
	cmd.Flags().StringVar(&comment, "comment", "", "why (required to deny)")
	cmd.Flags().StringVar(&digest, "digest", "", "the bundle digest you reviewed (default: the request's)")
	return cmd
}
