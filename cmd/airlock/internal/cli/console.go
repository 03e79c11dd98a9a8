package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/cmd/airlock/internal/console"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/provenance"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The console command: package console serves the page, and consoleBackend
// answers it with this package's client and review text, so the page shows
// what approval show prints.

func newConsole(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "console --as approver/NAME",
		Short: "Serve the approver's web page on loopback: pending approvals, reviews, decisions, audit trails",
		Long: `Serve the approver's web page on a loopback address, acting with the
approver's own certificate (--as approver/NAME) as kubectl proxy does: the
browser holds no credential. It prints a URL with a token made for this
start; the first request trades the token for a cookie. The page lists the
pending approvals, shows a request's whole review (the one approval show
prints, and the full bundle streamed and verified on demand), approves or
denies it with a comment, and shows a job's audit trail. See
docs/console.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckListen("--listen", listen); err != nil {
				return usageError{err}
			}
			cc, self, err := dial(g, identity.ServiceAuthority)
			if err != nil {
				return err
			}
			defer cc.Close()
			if self.id.Kind != identity.KindApprover {
				return usageError{fmt.Errorf("the console is an approver's, and this is %s: pass --as approver/NAME", self.id.Principal())}
			}
			b := &consoleBackend{g: g, client: authorityv1.NewAuthorityServiceClient(cc), self: self}
			srv, ln, url, err := console.Listen(listen, b)
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(g.Stdout, "airlock console for %s: open %s\n", termtext.Line(self.id.Principal()), url)
			fmt.Fprintf(g.Stdout, "(the URL holds this start's token; Ctrl-C stops the console)\n")
			flushText(g.Stdout)
			return srv.Serve(cmd.Context(), ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback address to serve on (port 0: any free port)")
	return cmd
}

// consoleBackend is console.Backend over the authority, as the approver.
type consoleBackend struct {
	g      *globals
	client authorityv1.AuthorityServiceClient
	self   *caller
}

// consoleError is an authority's error as the page shows it: one line,
// escaped.
func consoleError(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(termtext.Line(rpcError(err).Error()))
}

func (b *consoleBackend) Identity() string { return termtext.Line(b.self.id.Principal()) }

func consoleApproval(a *authorityv1.Approval) console.Approval {
	return console.Approval{
		ID: a.GetApprovalId(), Kind: strings.TrimPrefix(a.GetKind().String(), "APPROVAL_KIND_"), JobID: a.GetJobId(),
		State: stateWord(a.GetState()), Pending: a.GetState() == authorityv1.ApprovalState_APPROVAL_STATE_PENDING,
		Votes: fmt.Sprintf("%d/%d", approvals(a), a.GetRequiredApprovals()), What: termtext.Line(approvalWhat(a)),
		Requester: termtext.Line(a.GetRequester()), Digest: a.GetBundleDigest(),
		Expires: a.GetExpiresAt().AsTime().Local().Format(time.DateTime),
	}
}

func (b *consoleBackend) Approvals(ctx context.Context) ([]console.Approval, error) {
	req := &authorityv1.ListApprovalsRequest{States: []authorityv1.ApprovalState{authorityv1.ApprovalState_APPROVAL_STATE_PENDING}}
	list, err := allPages(0, func(token string, size int32) ([]*authorityv1.Approval, string, error) {
		req.PageToken, req.PageSize = token, size
		r, err := b.client.ListApprovals(ctx, req)
		return r.GetApprovals(), r.GetNextPageToken(), err
	})
	if err != nil {
		return nil, consoleError(err)
	}
	out := make([]console.Approval, 0, len(list))
	for _, a := range list {
		out = append(out, consoleApproval(a))
	}
	return out, nil
}

func (b *consoleBackend) Review(ctx context.Context, id string) (*console.Review, error) {
	resp, err := b.client.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: id})
	if err != nil {
		return nil, consoleError(err)
	}
	a, rv := resp.GetApproval(), resp.GetReview()
	out := &console.Review{Approval: consoleApproval(a), HasBundle: hasBundle(a)}
	var req bytes.Buffer
	writeRequest(&req, a, rv)
	out.Sections = append(out.Sections, console.Section{Title: "Request", Text: req.String()})
	if hasBundle(a) {
		var pol bytes.Buffer
		fmt.Fprintf(&pol, "network    %s\n", termtext.Line(policyText(rv.GetNetworkPolicy())))
		// An approver may not read the job itself (GetJob): its limits
		// are in the grant the bundle carries, which the full review reads.
		fmt.Fprintf(&pol, "limits     in the grant the bundle carries: the full review below reads them from it\n")
		writeUsage(&pol, rv.GetResult())
		out.Sections = append(out.Sections, console.Section{Title: "Policy, limits and usage", Text: pol.String()})
		var review bytes.Buffer
		writeReview(&review, a, rv)
		if strings.Contains(review.String(), termtext.Open) {
			fmt.Fprintf(&review, "\nlegend     %s\n", termtext.Legend)
		}
		out.Sections = append(out.Sections, console.Section{Title: "Review: files, patch, egress, execs, output", Text: review.String()})
	}
	return out, nil
}

// maxFullReview bounds the text of a full review the page holds; the
// CLI's approval show --full has no bound.
const maxFullReview = 64 << 20

// capped is a buffer that refuses to grow past max.
type capped struct {
	bytes.Buffer
	max int
}

var errFullTooBig = fmt.Errorf("the full review is longer than the console shows (%d MiB): airlock approval show --full shows all of it", maxFullReview>>20)

func (c *capped) Write(p []byte) (int, error) {
	if c.Len()+len(p) > c.max {
		return 0, errFullTooBig
	}
	return c.Buffer.Write(p)
}

func (b *consoleBackend) FullReview(ctx context.Context, id string) (*console.Section, error) {
	resp, err := b.client.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: id})
	if err != nil {
		return nil, consoleError(err)
	}
	a := resp.GetApproval()
	if !hasBundle(a) {
		return nil, errors.New("a change, start or port forward request has no result bundle; its page shows all of it")
	}
	buf := &capped{max: maxFullReview}
	g := *b.g
	g.Output, g.Stdout = "text", termtext.NewWatcher(buf)
	err = streamReview(ctx, &g, b.client, a, false, nil)
	sec := &console.Section{Title: "Full review, streamed from the bundle", Text: buf.String()}
	if err != nil {
		sec.Failed = true
		sec.Verdict = "NOT VERIFIED: " + termtext.Line(rpcError(err).Error())
		return sec, nil
	}
	// The limits the job ran under (an approver may not read the job,
	// GetJob, but the bundle holds the grant in force at its end), and
	// the executor's signed provenance over the bundle.
	grantText, signer, err := b.bundleGrant(ctx, a)
	if err != nil {
		sec.Failed = true
		sec.Verdict = "NOT VERIFIED: the bundle's grant and provenance: " + termtext.Line(rpcError(err).Error())
		return sec, nil
	}
	sec.Text = grantText + "\n" + sec.Text
	sec.Verdict = "verified: everything shown is bundle " + termtext.Line(a.GetBundleDigest()) + ", the one this request names, " +
		"and its provenance is signed by " + termtext.Line(signer)
	return sec, nil
}

// bundleGrant reads a's bundle, streamed through the authority and
// checked against a's digest end to end; it verifies the executor's
// provenance over that digest against the client config's CA, for the
// executor the bundle's grant names and the grant it holds (as the
// publisher does, but for the grant's signature: the authority's key is
// not the client's). It says the grant's limits and network policy in
// lines, and returns the provenance's signer.
func (b *consoleBackend) bundleGrant(ctx context.Context, a *authorityv1.Approval) (string, string, error) {
	src, err := b.self.cfg.Source(b.g.As)
	if err != nil {
		return "", "", err
	}
	roots, err := src.Roots()
	if err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.client.DownloadBundle(ctx, &authorityv1.DownloadBundleRequest{JobId: a.GetJobId()})
	if err != nil {
		return "", "", err
	}
	bs, err := openBundle(stream)
	if err != nil {
		return "", "", err
	}
	if bs.header.GetBundleDigest() != a.GetBundleDigest() {
		return "", "", fmt.Errorf("the job's bundle is %s, the request names %s", bs.header.GetBundleDigest(), a.GetBundleDigest())
	}
	var raw []byte
	err = bundle.Stream(bs.chunks, a.GetBundleDigest(), func(name string) bool { return name == bundle.GrantFile }, func(_ string, size int64, r io.Reader) error {
		if size > maxGrant {
			return fmt.Errorf("%s: %d bytes, more than a grant's %d", bundle.GrantFile, size, maxGrant)
		}
		var rerr error
		raw, rerr = io.ReadAll(r)
		return rerr
	})
	if err != nil {
		return "", "", err
	}
	if err := bs.end(); err != nil {
		return "", "", err
	}
	if raw == nil {
		return "", "", fmt.Errorf("the bundle holds no %s", bundle.GrantFile)
	}
	sg := &typesv1.SignedGrant{}
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(raw, sg); err != nil {
		return "", "", fmt.Errorf("%s: not a signed grant: %v", bundle.GrantFile, err)
	}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return "", "", fmt.Errorf("%s: its body is not a grant: %v", bundle.GrantFile, err)
	}
	executor, err := identity.Parse(g.GetExecutor())
	switch {
	case g.GetJobId() != a.GetJobId():
		return "", "", fmt.Errorf("%s: for job %q, the request is for job %q", bundle.GrantFile, g.GetJobId(), a.GetJobId())
	case err != nil:
		return "", "", fmt.Errorf("%s: executor: %v", bundle.GrantFile, err)
	}
	pv, err := provenance.Verify(bs.header.GetProvenance(), a.GetBundleDigest(), roots, executor)
	if err != nil {
		return "", "", err
	}
	switch {
	case pv.Statement.Predicate.GrantDigest != grant.Digest(sg):
		return "", "", fmt.Errorf("provenance names grant %s, the bundle holds %s", pv.Statement.Predicate.GrantDigest, grant.Digest(sg))
	case pv.Statement.Predicate.JobID != a.GetJobId():
		return "", "", fmt.Errorf("provenance: for job %q, the request is for job %q", pv.Statement.Predicate.JobID, a.GetJobId())
	}
	text := fmt.Sprintf("limits     %s (the grant in force at the run's end, generation %d)\nnetwork    %s (generation %d)\nprovenance signed by %s over this bundle and grant %s\n",
		limitsLine(g.GetLimits()), g.GetGeneration(), termtext.Line(policyText(g.GetNetworkPolicy())), g.GetNetworkPolicyGeneration(),
		termtext.Line(pv.Signer.String()), grant.Digest(sg))
	return text, pv.Signer.String(), nil
}

// maxGrant bounds a bundle's grant.pb the console reads.
const maxGrant = 1 << 20

func (b *consoleBackend) Decide(ctx context.Context, id, digest string, approve bool, comment string) (*console.Approval, error) {
	d := authorityv1.Decision_DECISION_DENY
	if approve {
		d = authorityv1.Decision_DECISION_APPROVE
	}
	resp, err := b.client.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: id, BundleDigest: digest, Decision: d, Comment: comment})
	if err != nil {
		return nil, consoleError(err)
	}
	a := consoleApproval(resp.GetApproval())
	return &a, nil
}

// maxAuditEvents bounds a job's trail on the page.
const maxAuditEvents = 5000

func (b *consoleBackend) Audit(ctx context.Context, jobID string) ([]console.AuditEvent, error) {
	var out []console.AuditEvent
	err := eachAuditEvent(ctx, b.client, &authorityv1.ListAuditEventsRequest{JobId: jobID}, maxAuditEvents, func(e *authorityv1.AuditEvent) error {
		out = append(out, console.AuditEvent{
			Sequence: e.GetSequence(), Time: e.GetTime().AsTime().Local().Format(time.DateTime), Kind: termtext.Line(e.GetKind()),
			Outcome: outcomeWord(e.GetOutcome()), Caller: termtext.Line(e.GetCaller()), Subject: termtext.Line(e.GetSubject()),
			Reason: termtext.Line(e.GetReason()),
		})
		return nil
	})
	if err != nil {
		return nil, consoleError(err)
	}
	return out, nil
}
