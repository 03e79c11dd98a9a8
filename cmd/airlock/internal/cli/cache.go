package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The named caches a tenant's policy offers its jobs (job submit --cache):
// kept by the executor per tenant and repository, listed and wiped here.

func newCache(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "cache", Short: "List and clear a tenant's named caches"}
	cmd.AddCommand(newCacheList(g), newCacheClear(g))
	return cmd
}

func newCacheList(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's caches: repository, name, size, last used",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				forTenant, err := self.tenant(tenant)
				if err != nil {
					return err
				}
				resp, err := client.ListCaches(cmd.Context(), &authorityv1.ListCachesRequest{Tenant: forTenant})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) { writeCacheTable(w, resp.GetCaches()) })
			})
		},
	}
	tenantFlag(cmd, &tenant, "whose caches to list")
	return cmd
}

func newCacheClear(g *globals) *cobra.Command {
	var tenant, repo string
	cmd := &cobra.Command{
		Use:   "clear [--repository R] [NAME]",
		Short: "Wipe a tenant's caches: all, a repository's, or one name's",
		Long: `Wipes the tenant's caches of repository R (every repository without
--repository) named NAME (every name without it). The next job starts cold.
A job running meanwhile keeps the copy it started with; what it commits
when it ends lands on the emptied cache. The clear is on the audit log.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				forTenant, err := self.tenant(tenant)
				if err != nil {
					return err
				}
				resp, err := client.ClearCaches(cmd.Context(), &authorityv1.ClearCachesRequest{Tenant: forTenant, Repository: repo, Name: name})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) {
					if len(resp.GetCleared()) == 0 {
						fmt.Fprintln(w, "no cache matched: nothing cleared")
						return
					}
					fmt.Fprintf(w, "cleared %d:\n", len(resp.GetCleared()))
					writeCacheTable(w, resp.GetCleared())
				})
			})
		},
	}
	tenantFlag(cmd, &tenant, "whose caches to clear")
	cmd.Flags().StringVar(&repo, "repository", "", "only this repository's caches")
	return cmd
}

func writeCacheTable(w io.Writer, caches []*typesv1.CacheInfo) {
	fmt.Fprintln(w, "REPOSITORY\tNAME\tSIZE\tLAST USED\tEXECUTOR")
	for _, c := range caches {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", termtext.Line(c.GetRepository()), termtext.Line(c.GetName()), humanBytes(c.GetSizeBytes()),
			c.GetLastUsed().AsTime().Local().Format(time.DateTime), termtext.Line(orDash(c.GetExecutor())))
	}
}

// writeCacheUses says, in a job's summary and its review, which caches
// the run started from: it did not start clean.
func writeCacheUses(w io.Writer, r *typesv1.RunResult) {
	for _, u := range r.GetCaches() {
		what := "not committed"
		switch {
		case u.GetEvicted():
			what = "committed, then evicted"
		case u.GetCommitted():
			what = "committed"
		}
		fmt.Fprintf(w, "cache      %s at %s: started from %s, after %s, %s", termtext.Line(u.GetName()), termtext.Line(u.GetPath()),
			startedFrom(u.GetSizeBefore()), humanBytes(u.GetSizeAfter()), what)
		if m := u.GetMessage(); m != "" {
			fmt.Fprintf(w, " (%s)", termtext.Line(m))
		}
		fmt.Fprintln(w)
	}
}

func startedFrom(n int64) string {
	if n == 0 {
		return "empty"
	}
	return humanBytes(n) + " kept from earlier jobs"
}
