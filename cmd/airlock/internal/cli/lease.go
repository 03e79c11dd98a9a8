package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

func newLease(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "lease", Short: "List and revoke leased credentials (as an approver: --as approver/NAME)"}
	var job string
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List leases, active ones unless --all",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				leases, err := allPages(0, func(token string, size int32) ([]*authorityv1.Lease, string, error) {
					r, err := client.ListLeases(cmd.Context(), &authorityv1.ListLeasesRequest{JobId: job, IncludeInactive: all, PageSize: size, PageToken: token})
					return r.GetLeases(), r.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				resp := &authorityv1.ListLeasesResponse{Leases: leases}
				return g.PrintProto(resp, func(w io.Writer) {
					fmt.Fprintln(w, "LEASE\tPURPOSE\tJOB\tRESOURCE\tHOLDER\tEXPIRES\tREVOKED")
					for _, l := range resp.GetLeases() {
						revoked := "-"
						if l.GetRevokedAt() != nil {
							revoked = l.GetRevokedAt().AsTime().Local().Format(time.DateTime)
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termtext.Line(l.GetLeaseId()), purposeWord(l.GetPurpose()),
							termtext.Line(l.GetJobId()), termtext.Line(l.GetResource()), termtext.Line(l.GetHolder()), l.GetExpiresAt().AsTime().Local().Format(time.DateTime), revoked)
					}
				})
			})
		},
	}
	list.Flags().StringVar(&job, "job", "", "only this job's leases")
	list.Flags().BoolVar(&all, "all", false, "include expired and revoked leases")
	var reason string
	revoke := &cobra.Command{
		Use:   "revoke LEASE_ID",
		Short: "Revoke a lease now; it is refused wherever it is presented afterwards",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showAuthority(cmd, g, func(ctx context.Context, c authorityv1.AuthorityServiceClient) (*authorityv1.Lease, error) {
				resp, err := c.RevokeCredential(ctx, &authorityv1.RevokeCredentialRequest{LeaseId: args[0], Reason: reason})
				return resp.GetLease(), err
			}, func(w io.Writer, l *authorityv1.Lease) {
				fmt.Fprintf(w, "revoked %s\n", termtext.Line(l.GetLeaseId()))
			})
		},
	}
	revoke.Flags().StringVar(&reason, "reason", "revoked from the CLI", "why, for the audit log")
	cmd.AddCommand(list, revoke)
	return cmd
}
