package cli

import (
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// issuedFile describes one certificate written, for output.
type issuedFile struct {
	ID       string    `json:"id"`
	Cert     string    `json:"cert"`
	Key      string    `json:"key"`
	NotAfter time.Time `json:"not_after"`
}

func newPKI(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pki",
		Short: "Create and extend the private CA that issues Airlock's SPIFFE identities",
	}
	cmd.AddCommand(newPKIInit(g), newPKIIssue(g))
	return cmd
}

func newPKIInit(g *globals) *cobra.Command {
	var dir, td string
	var clients, approvers, pipelines, operators []string
	cmd := &cobra.Command{
		Use:   "init --trust-domain D --dir DIR",
		Short: "Create a CA and certificates for the three services and named callers",
		Long: `Creates DIR/ca.crt and DIR/ca.key, certificates for service/authority,
service/executor and service/publisher, and one for each caller named with
--client, --approver, --pipeline and --operator. Keys are written 0600. Refuses a DIR
that already holds a CA key.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var callers []identity.ID
			for kind, names := range map[identity.Kind][]string{identity.KindClient: clients, identity.KindApprover: approvers, identity.KindPipeline: pipelines, identity.KindOperator: operators} {
				for _, n := range names {
					id, err := identity.New(td, kind, n)
					if err != nil {
						return usageError{fmt.Errorf("--%s %q: %w", kind, n, err)}
					}
					callers = append(callers, id)
				}
			}
			if _, err := pki.Init(dir, td, callers); err != nil {
				return err
			}
			ids := []identity.ID{}
			for _, s := range identity.ServiceNames() {
				ids = append(ids, identity.Service(td, s))
			}
			return printIssued(g, dir, append(ids, callers...))
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to create the CA in (required)")
	cmd.Flags().StringVar(&td, "trust-domain", "", "SPIFFE trust domain, e.g. airlock.example.com (required)")
	cmd.Flags().StringSliceVar(&clients, "client", nil, "issue client/NAME (repeatable)")
	cmd.Flags().StringSliceVar(&approvers, "approver", nil, "issue approver/NAME (repeatable)")
	cmd.Flags().StringSliceVar(&pipelines, "pipeline", nil, "issue pipeline/NAME (repeatable)")
	cmd.Flags().StringSliceVar(&operators, "operator", nil, "issue operator/NAME, who sees and drains the executor fleet (repeatable)")
	cmdutil.Required(cmd, "dir", "trust-domain")
	return cmd
}

func newPKIIssue(g *globals) *cobra.Command {
	var dir, id string
	var validity time.Duration
	var dnsNames, ips []string
	cmd := &cobra.Command{
		Use:   "issue --dir DIR --id KIND/NAME",
		Short: "Issue one more certificate from an existing CA",
		Long: `Issues a certificate for KIND/NAME (client, approver, pipeline, operator or service)
in the CA's trust domain and writes DIR/KIND/NAME.crt and .key (0600),
replacing any earlier one: servers and clients pick up the new files
without a restart. An executor of a fleet is service/executor/NAME
(written to DIR/service/executor/NAME.crt): each executor has its own.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			ca, err := pki.LoadCA(dir)
			if err != nil {
				return err
			}
			spiffe := id
			if !strings.HasPrefix(id, "spiffe://") {
				spiffe = "spiffe://" + ca.TrustDomain + "/" + id
			}
			parsed, err := identity.Parse(spiffe)
			if err != nil {
				return usageError{fmt.Errorf("--id %q: %w", id, err)}
			}
			opts := pki.IssueOptions{Validity: validity, DNSNames: dnsNames}
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return usageError{fmt.Errorf("--ip %q: not an IP address", s)}
				}
				opts.IPAddresses = append(opts.IPAddresses, ip)
			}
			kp, err := ca.Issue(parsed, opts)
			if err != nil {
				return err
			}
			if err := pki.WriteKeyPair(dir, kp); err != nil {
				return err
			}
			return printIssued(g, dir, []identity.ID{parsed})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the CA directory made by pki init (required)")
	cmd.Flags().StringVar(&id, "id", "", "KIND/NAME or a full spiffe:// ID (required)")
	cmd.Flags().DurationVar(&validity, "validity", 0, "certificate lifetime (default 1 year, capped at the CA's)")
	cmd.Flags().StringSliceVar(&dnsNames, "dns", nil, "extra DNS SAN (repeatable)")
	cmd.Flags().StringSliceVar(&ips, "ip", nil, "extra IP SAN (repeatable)")
	cmdutil.Required(cmd, "dir", "id")
	return cmd
}

func printIssued(g *globals, dir string, ids []identity.ID) error {
	var out []issuedFile
	for _, id := range ids {
		cert, key := pki.Paths(dir, id)
		f := issuedFile{ID: id.String(), Cert: cert, Key: key}
		if kp, err := readCert(cert); err == nil {
			f.NotAfter = kp.NotAfter
		}
		out = append(out, f)
	}
	return g.Print(map[string]any{"ca": pki.CAPath(dir), "issued": out}, func(w io.Writer) {
		fmt.Fprintf(w, "CA\t%s\n", pki.CAPath(dir))
		fmt.Fprintln(w, "IDENTITY\tCERTIFICATE\tEXPIRES")
		for _, f := range out {
			fmt.Fprintf(w, "%s\t%s\t%s\n", f.ID, f.Cert, f.NotAfter.Format(time.DateOnly))
		}
	})
}
