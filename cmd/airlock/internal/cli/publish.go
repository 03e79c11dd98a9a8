package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newPublish(g *globals) *cobra.Command {
	var key, job, digest, to string
	var dryRun bool
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

With --dry-run the publisher only checks: it verifies the bundle and scans
its content, then stops; nothing is recorded, spent or pushed, and the
approval may still be pending. A refusal still exits 1.

It runs as pipeline/deploy in the dev stack unless --as names another
identity.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &publisherv1.PublishRequest{ApprovalId: args[0], IdempotencyKey: key, JobId: job, BundleDigest: digest, DryRun: dryRun}
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
				d := resp.GetDeployment()
				if err := printDeployment(g, d); err != nil {
					return err
				}
				if dryRun && d.GetState() == publisherv1.DeploymentState_DEPLOYMENT_STATE_FAILED {
					return remoteError{fmt.Errorf("dry run: %s", d.GetMessage())}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&key, "idempotency-key", "", "the same key returns the same deployment (default: approval:APPROVAL_ID)")
	cmd.Flags().StringVar(&job, "job", "", "the job the pipeline means to publish (must be the approval's)")
	cmd.Flags().StringVar(&digest, "digest", "", "the bundle digest the pipeline means to publish (must be the approved one)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check only: verify and scan, record, spend and push nothing (the approval may be pending)")
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
