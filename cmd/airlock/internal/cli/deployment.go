package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/termtext"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

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
