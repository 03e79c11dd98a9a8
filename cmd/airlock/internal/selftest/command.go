package selftest

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// New is the `airlock selftest` command.
func New(g *cmdutil.Globals) *cobra.Command {
	var (
		opts                       Options
		runtimes, memory, approver string
		pipeline                   string
		expect, secrets, rows      []string
		counterFrom                []string
		onHost                     bool
	)
	cmd := &cobra.Command{
		Use:   "selftest --repo R [flags]",
		Short: "Test the deployed stack's boundaries and useful work, and report each as a row",
		Long: `Runs the validation plan against the deployed stack, with its deployed
policy, as the tenant's client: a row for each boundary, with the runtime
class and version, template, resource shape and policy digest it ran on.

  exit-status  a failing and a passing command return their real statuses
  isolation    a dummy secret outside the workspace cannot be read (with
               --secret-path, or --on-executor-host on the executor host); an
               earlier job's files (/tmp, $HOME, /work, /out) and credentials
               are absent from a new job
  egress       a job under the default policy reaches nothing; each
               --expect-reach works; a narrowed policy is enforced once it
               says applied (timed)
  idempotency  a retried submission and a retried exec id return the first,
               and the counter the selftest serves saw one request each
  limits       memory and pids (the tenant's defaults) and a deadline stop a
               job with the right ending
  export       with --publish-to, --pipeline and --approver: a planted fake key in an
               exported file is refused by the publisher's scan in a dry
               run; the approval is never approved, so nothing can land
  restart      with --disruptive: after --restart-command restarts the
               executor, recorded results and the source are there, scratch
               is not

Its jobs carry idempotency keys starting selftest- and AIRLOCK_SELFTEST in
their environment; whatever still runs at the end is cancelled. Progress goes
to stderr; -o text, json or junit (JUnit XML for CI) to stdout. It exits 1
when any row fails.`,
		Args: cobra.NoArgs,
		// -o junit is this command's alone.
		PersistentPreRunE: func(*cobra.Command, []string) error {
			switch g.Output {
			case "text", "json", "junit":
				return nil
			}
			return cmdutil.Usagef("-o %q: must be text, json or junit", g.Output)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.ExpectReach, opts.SecretPaths, opts.Rows, opts.PlantSecret = expect, secrets, rows, onHost
			for _, w := range splitList(runtimes) {
				c, ok := typesv1.RuntimeClass_value["RUNTIME_CLASS_"+strings.ToUpper(w)]
				if !ok || c == 0 || strings.ToLower(w) != w {
					return cmdutil.Usagef("--runtime %q: want a comma-separated list of runc, runsc and vm", runtimes)
				}
				opts.Runtimes = append(opts.Runtimes, typesv1.RuntimeClass(c))
			}
			for _, r := range rows {
				if !contains(RowNames, r) {
					return cmdutil.Usagef("--row %q: want one of %s", r, strings.Join(RowNames, ", "))
				}
			}
			for _, f := range counterFrom {
				p, err := netip.ParsePrefix(f)
				if err != nil {
					a, aerr := netip.ParseAddr(f)
					if aerr != nil {
						return cmdutil.Usagef("--counter-from %q: want an address or CIDR", f)
					}
					p = netip.PrefixFrom(a, a.BitLen())
				}
				opts.CounterFrom = append(opts.CounterFrom, p.Masked())
			}
			for _, t := range expect {
				if _, err := parseTarget(t); err != nil {
					return cmdutil.UsageError{Err: err}
				}
			}
			n, err := config.ParseByteSize(memory)
			if err != nil || n <= 0 {
				return cmdutil.Usagef("--memory-probe %q: want a size such as 1GiB", memory)
			}
			opts.MemoryProbe = n
			if opts.PidsProbe < 2 || opts.Deadline <= 0 {
				return cmdutil.Usagef("--pids-probe must be at least 2 and --deadline above 0")
			}
			cfg, err := g.ClientConfig()
			if err != nil {
				return err
			}
			if opts.Tenant == "" {
				opts.Tenant = cfg.Tenant
			}
			if opts.Tenant == "" {
				return cmdutil.Usagef("--tenant is required (the client config names no default tenant)")
			}
			if opts.PublishTo != "" {
				if repo, branch, ok := strings.Cut(opts.PublishTo, ":"); !ok || repo == "" || branch == "" {
					return cmdutil.Usagef("--publish-to %q: want REPO:BRANCH", opts.PublishTo)
				}
			}
			cc, err := Dial(cfg, g.As, identity.ServiceAuthority)
			if err != nil {
				return err
			}
			defer cc.Close()
			cl := Clients{Client: authorityv1.NewAuthorityServiceClient(cc)}
			if approver != "" {
				ac, err := Dial(cfg, approver, identity.ServiceAuthority)
				if err != nil {
					return fmt.Errorf("--approver: %w", err)
				}
				defer ac.Close()
				cl.Approver = authorityv1.NewAuthorityServiceClient(ac)
			}
			if pipeline != "" {
				pc, err := Dial(cfg, pipeline, identity.ServicePublisher)
				if err != nil {
					return fmt.Errorf("--pipeline: %w", err)
				}
				defer pc.Close()
				cl.Publisher = publisherv1.NewPublisherServiceClient(pc)
			}
			opts.Progress = g.Stderr
			rep, err := Run(cmd.Context(), cl, opts)
			if err != nil && rep == nil {
				return err
			}
			out := termtext.Unwrap(g.Stdout)
			var werr error
			switch g.Output {
			case "json":
				werr = rep.WriteJSON(out)
			case "junit":
				werr = rep.WriteJUnit(out)
			default:
				werr = rep.WriteText(g.Stdout)
			}
			if err := errors.Join(err, werr); err != nil {
				return err
			}
			if failed := rep.Failed(); len(failed) > 0 {
				return fmt.Errorf("selftest failed: %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Tenant, "tenant", "", "tenant to run under (default: the client config's tenant)")
	fl.StringVar(&opts.Repo, "repo", "", "repository of the tenant's policy the jobs run on (required)")
	cmdutil.Required(cmd, "repo")
	fl.StringVar(&opts.Rev, "rev", "HEAD", "branch, tag or commit")
	fl.StringVar(&runtimes, "runtime", "", "runtime classes to run the plan in, each its own rows: runc,runsc,vm (default: the tenant's default class)")
	fl.StringArrayVar(&expect, "expect-reach", nil, "a destination jobs must reach, NAME or CIDR with an optional :PORT (443 without; repeatable)")
	fl.StringVar(&opts.CounterListen, "counter-listen", "", "HOST:PORT to serve the selftest's counter on; it must be reachable from the sandboxes and not an executor host address (not 0.0.0.0 unless firewalled)")
	fl.StringVar(&opts.CounterAddr, "counter-addr", "", "IP:PORT jobs dial the counter at, when it differs from --counter-listen (a relay or NAT)")
	fl.StringArrayVar(&counterFrom, "counter-from", nil, "an address or CIDR the sandboxes' connections reach the counter from (their egress, or a relay); when given, only those are counted (repeatable)")
	fl.StringArrayVar(&secrets, "secret-path", nil, "a file on the executor host no job may read, planted by the operator (repeatable)")
	fl.BoolVar(&onHost, "on-executor-host", false, "this machine is the executor host: plant a dummy secret here for the isolation row (without it or --secret-path that check is skipped)")
	fl.StringVar(&memory, "memory-probe", "1GiB", "what the memory job allocates under the tenant's default memory limit")
	fl.IntVar(&opts.PidsProbe, "pids-probe", 512, "how many processes the pids job starts under the tenant's default pids limit")
	fl.DurationVar(&opts.Deadline, "deadline", 2*time.Second, "the deadline job's deadline")
	fl.BoolVar(&opts.Disruptive, "disruptive", false, "run the restart row, which restarts the executor with --restart-command")
	fl.StringVar(&opts.RestartCommand, "restart-command", "", "shell command that restarts the executor and returns once it serves")
	fl.StringVar(&approver, "approver", "", "KIND/NAME of an approver of the tenant, to deny any approval a selftest job opened (the export row needs it)")
	fl.StringVar(&opts.PublishTo, "publish-to", "", "REPO:BRANCH the export row's job names as its publish target; its approval is never approved, and is denied at the end")
	fl.StringVar(&pipeline, "pipeline", "", "KIND/NAME of a pipeline identity, for the export row's dry-run publish")
	fl.StringArrayVar(&rows, "row", nil, "run only this row (repeatable): "+strings.Join(RowNames, ", "))
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, w := range strings.Split(s, ",") {
		if w = strings.TrimSpace(w); w != "" {
			out = append(out, w)
		}
	}
	return out
}
