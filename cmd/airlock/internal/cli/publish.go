package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/termtext"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newPublish(g *globals) *cobra.Command {
	var key, job, digest, to string
	cmd := &cobra.Command{
		Use:   "publish APPROVAL_ID",
		Short: "Publish an approved result as one commit on its protected branch (as a pipeline)",
		Long: `Asks the publisher to publish an approved result. The publisher fetches the
result bundle from the executor and checks it is the approved one (digest,
the executor's signature, the authority's grant); checks its content
against the tenant's publish policy (secrets, paths git refuses, protected
paths, sizes, binaries); makes one commit on the branch's tip with the
approval's trailers; and only then spends the approval, leases the deploy
credential and pushes, never forced.

A refusal prints the deployment with its findings and exits 1; the
approval is then not spent. The same --idempotency-key (default: one per
approval) always returns the same deployment, and an approval is never
published twice: run it again after any failure or interruption and it
resumes where it stopped.

It runs as pipeline/deploy in the dev stack unless --as names another
identity.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &publisherv1.PublishRequest{ApprovalId: args[0], IdempotencyKey: key, JobId: job, BundleDigest: digest}
			if req.IdempotencyKey == "" {
				req.IdempotencyKey = "approval:" + args[0]
			}
			if to != "" {
				repo, branch, ok := strings.Cut(to, ":")
				if !ok || repo == "" || branch == "" {
					return usageError{fmt.Errorf("--to %q: want REPOSITORY:BRANCH", to)}
				}
				req.Target = &typesv1.PublishTarget{Repository: repo, Branch: branch}
			}
			return withPublisher(g, func(client publisherv1.PublisherServiceClient) error {
				resp, err := client.Publish(cmd.Context(), req)
				if err != nil {
					if d := deploymentDetail(err); d != nil {
						if perr := printDeployment(g, d); perr != nil {
							return perr
						}
					}
					return err
				}
				return printDeployment(g, resp.GetDeployment())
			})
		},
	}
	cmd.Flags().StringVar(&key, "idempotency-key", "", "the same key returns the same deployment (default: approval:APPROVAL_ID)")
	cmd.Flags().StringVar(&job, "job", "", "the job the pipeline means to publish (must be the approval's)")
	cmd.Flags().StringVar(&digest, "digest", "", "the bundle digest the pipeline means to publish (must be the approved one)")
	cmd.Flags().StringVar(&to, "to", "", "REPOSITORY:BRANCH the pipeline means to publish to (must be the approved target)")
	return cmd
}

// deploymentDetail is the deployment a refused Publish attaches.
func deploymentDetail(err error) *publisherv1.Deployment {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if dep, ok := d.(*publisherv1.Deployment); ok {
			return dep
		}
	}
	return nil
}

func newDeployment(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "deployment", Short: "Read the publisher's deployments (as a pipeline or an approver)"}
	cmd.AddCommand(newDeploymentGet(g), newDeploymentList(g))
	return cmd
}

func newDeploymentGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get DEPLOYMENT_ID",
		Short: "Show a deployment: its state, commit, base and parent, approvers, findings and each step's time",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withPublisher(g, func(client publisherv1.PublisherServiceClient) error {
				resp, err := client.GetDeployment(cmd.Context(), &publisherv1.GetDeploymentRequest{DeploymentId: args[0]})
				if err != nil {
					return err
				}
				return printDeployment(g, resp.GetDeployment())
			})
		},
	}
}

func newDeploymentList(g *globals) *cobra.Command {
	var job, repo string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List deployments, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPublisher(g, func(client publisherv1.PublisherServiceClient) error {
				req := &publisherv1.ListDeploymentsRequest{JobId: job, Repository: repo}
				list, err := allPages(0, func(token string, size int32) ([]*publisherv1.Deployment, string, error) {
					req.PageToken, req.PageSize = token, size
					r, err := client.ListDeployments(cmd.Context(), req)
					return r.GetDeployments(), r.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				resp := &publisherv1.ListDeploymentsResponse{Deployments: list}
				return g.PrintProto(resp, func(w io.Writer) {
					fmt.Fprintln(w, "DEPLOYMENT\tJOB\tSTATE\tTARGET\tCOMMIT\tCREATED")
					for _, d := range list {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", termtext.Line(d.GetDeploymentId()), termtext.Line(d.GetJobId()), deploymentState(d.GetState()),
							termtext.Line(d.GetTarget().GetRepository()+":"+d.GetTarget().GetBranch()), orDash(short(d.GetCommit())),
							d.GetCreatedAt().AsTime().Local().Format(time.DateTime))
					}
				})
			})
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "only this job's deployments")
	cmd.Flags().StringVar(&repo, "repo", "", "only deployments to this repository")
	return cmd
}

// printDeployment shows one deployment; every byte that came from a job
// or a caller (paths, messages, ids) is escaped.
func printDeployment(g *globals, d *publisherv1.Deployment) error {
	return g.PrintProto(d, func(w io.Writer) {
		fmt.Fprintf(w, "deployment:\t%s\n", termtext.Line(d.GetDeploymentId()))
		fmt.Fprintf(w, "state:\t%s\n", deploymentState(d.GetState()))
		if d.GetMessage() != "" {
			fmt.Fprintf(w, "message:\t%s\n", termtext.Line(d.GetMessage()))
		}
		fmt.Fprintf(w, "job:\t%s\n", termtext.Line(d.GetJobId()))
		fmt.Fprintf(w, "approval:\t%s\n", termtext.Line(d.GetApprovalId()))
		fmt.Fprintf(w, "target:\t%s\n", termtext.Line(d.GetTarget().GetRepository()+":"+d.GetTarget().GetBranch()))
		fmt.Fprintf(w, "bundle:\t%s\n", termtext.Line(d.GetBundleDigest()))
		fmt.Fprintf(w, "commit:\t%s\n", orDash(termtext.Line(d.GetCommit())))
		fmt.Fprintf(w, "base:\t%s\n", orDash(termtext.Line(d.GetBaseCommit())))
		if p := d.GetParentCommit(); p != "" && p != d.GetBaseCommit() {
			fmt.Fprintf(w, "parent:\t%s (the branch had moved; the patch was re-applied)\n", termtext.Line(p))
		}
		for _, a := range d.GetApprovers() {
			fmt.Fprintf(w, "approved by:\t%s\n", termtext.Line(a))
		}
		if d.GetFilesDigest() != "" {
			fmt.Fprintf(w, "files:\t%s\n", termtext.Line(d.GetFilesDigest()))
		}
		fmt.Fprintf(w, "policy:\t%s\n", orDash(termtext.Line(d.GetPolicyDigest())))
		fmt.Fprintf(w, "requester:\t%s\n", termtext.Line(d.GetRequester()))
		for _, s := range d.GetSteps() {
			fmt.Fprintf(w, "  %s\t%s\n", termtext.Line(s.GetStep()), s.GetDoneAt().AsTime().Local().Format("2006-01-02 15:04:05.000"))
		}
		if len(d.GetFindings()) > 0 {
			fmt.Fprintf(w, "\n%d finding(s); nothing was spent:\n", len(d.GetFindings()))
			fmt.Fprintln(w, "RULE\tPATH\tLINE\tSECRET\tMESSAGE")
			for _, f := range d.GetFindings() {
				line := "-"
				if f.GetLine() > 0 {
					line = fmt.Sprint(f.GetLine())
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", termtext.Line(f.GetRule()), orDash(termtext.Line(f.GetPath())), line,
					orDash(termtext.Line(f.GetRedacted())), termtext.Line(f.GetMessage()))
			}
		}
	})
}
