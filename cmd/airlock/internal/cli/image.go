package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The images a tenant's jobs ran on (job submit --image), as the
// executor's image cache holds them: listed, inspected and pruned here.

func newImage(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "List, inspect and prune the images a tenant's jobs ran on, in the executor's cache"}
	cmd.AddCommand(newImageList(g), newImageInspect(g), newImagePrune(g))
	return cmd
}

func newImageList(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the cached images the tenant's jobs ran on: digest, size, last use, jobs; and the whole cache's size",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listImages(cmd, g, tenant, "")
		},
	}
	tenantFlag(cmd, &tenant, "whose images to list")
	return cmd
}

func newImageInspect(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "inspect DIGEST",
		Short: "Show one cached image with its layers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := digest.Check(args[0]); err != nil {
				return usageError{fmt.Errorf("DIGEST: %v", err)}
			}
			return listImages(cmd, g, tenant, args[0])
		},
	}
	tenantFlag(cmd, &tenant, "whose image to inspect")
	return cmd
}

func listImages(cmd *cobra.Command, g *globals, tenant, d string) error {
	return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
		forTenant, err := self.tenant(tenant)
		if err != nil {
			return err
		}
		resp, err := client.ListImages(cmd.Context(), &authorityv1.ListImagesRequest{Tenant: forTenant, Digest: d})
		if err != nil {
			return err
		}
		if d != "" && len(resp.GetImages()) == 0 {
			return fmt.Errorf("image %s: not in the executor's cache for tenant %s", d, forTenant)
		}
		return g.PrintProto(resp, func(w io.Writer) {
			if d != "" {
				writeImage(w, resp.GetImages()[0])
				return
			}
			writeImageTable(w, resp.GetImages())
			writeImageCache(w, resp.GetCache())
		})
	})
}

func newImagePrune(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "prune [DIGEST]",
		Short: "Drop the tenant's cached images (all, or one) that none of its jobs runs on",
		Long: `Drops the tenant's hold on its cached images (every one, or DIGEST's) that
none of its jobs runs on now; an image a job runs on is kept and named. A
layer no tenant holds any more is deleted from the executor's disk; the
next job on the image pulls it again through the authority. The prune is on
the audit log.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d := ""
			if len(args) == 1 {
				if err := digest.Check(args[0]); err != nil {
					return usageError{fmt.Errorf("DIGEST: %v", err)}
				}
				d = args[0]
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				forTenant, err := self.tenant(tenant)
				if err != nil {
					return err
				}
				resp, err := client.PruneImages(cmd.Context(), &authorityv1.PruneImagesRequest{Tenant: forTenant, Digest: d})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) {
					fmt.Fprintf(w, "pruned %d image(s), freed %s\n", len(resp.GetPruned()), humanBytes(resp.GetFreedBytes()))
					if len(resp.GetPruned()) > 0 {
						writeImageTable(w, resp.GetPruned())
					}
					for _, d := range resp.GetInUse() {
						fmt.Fprintf(w, "kept %s: a job runs on it\n", termtext.Line(d))
					}
				})
			})
		},
	}
	tenantFlag(cmd, &tenant, "whose images to prune")
	return cmd
}

func writeImageTable(w io.Writer, list []*typesv1.ImageInfo) {
	fmt.Fprintln(w, "IMAGE\tEXECUTOR\tSIZE\tLAST USED\tIN USE\tJOBS")
	for _, i := range list {
		jobs := i.GetJobs()
		more := ""
		if len(jobs) > 3 {
			jobs, more = jobs[:3], fmt.Sprintf(" +%d", len(i.GetJobs())-3)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s%s\n", termtext.Line(i.GetReference()), termtext.Line(orDash(i.GetExecutor())), humanBytes(i.GetSizeBytes()),
			i.GetLastUsed().AsTime().Local().Format(time.DateTime), i.GetInUse(), termtext.Line(strings.Join(jobs, ",")), more)
	}
}

func writeImage(w io.Writer, i *typesv1.ImageInfo) {
	fmt.Fprintf(w, "image      %s\n", termtext.Line(i.GetReference()))
	fmt.Fprintf(w, "executor   %s\n", termtext.Line(orDash(i.GetExecutor())))
	fmt.Fprintf(w, "size       %s on disk\n", humanBytes(i.GetSizeBytes()))
	fmt.Fprintf(w, "last used  %s\n", i.GetLastUsed().AsTime().Local().Format(time.DateTime))
	fmt.Fprintf(w, "in use     %d job(s)\n", i.GetInUse())
	fmt.Fprintf(w, "jobs       %s\n", termtext.Line(strings.Join(i.GetJobs(), ", ")))
	fmt.Fprintln(w, "LAYER\tMEDIA TYPE\tCOMPRESSED\tUNPACKED\tDIFF ID")
	for _, l := range i.GetLayers() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", termtext.Line(l.GetDigest()), termtext.Line(l.GetMediaType()),
			humanBytes(l.GetCompressedBytes()), humanBytes(l.GetUnpackedBytes()), termtext.Line(l.GetDiffId()))
	}
}

func writeImageCache(w io.Writer, c *typesv1.ImageCacheStats) {
	fmt.Fprintf(w, "\nexecutor image cache: %s of %s, %d layers, %d images; since start %d pulls (%s), %d hits, %d evictions\n",
		humanBytes(c.GetSizeBytes()), humanBytes(c.GetMaxBytes()), c.GetLayers(), c.GetImages(),
		c.GetPulls(), humanBytes(c.GetPulledBytes()), c.GetHits(), c.GetEvictions())
}
