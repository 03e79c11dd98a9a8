package cli

import (
	"fmt"
	"github.com/airlockhq/airlock/pkg/usd"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// whenFlag reads a time flag: a UTC date (2026-12-01), an RFC 3339 time,
// or a duration ago (72h, not negative). Empty is nil.
func whenFlag(name, v string, now time.Time) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return nil, usageError{fmt.Errorf("--%s %q: a duration ago must not be negative (it would be a time to come); write 1h for an hour ago", name, v)}
		}
		return timestamppb.New(now.Add(-d)), nil
	}
	for _, layout := range []string{time.DateOnly, time.RFC3339} {
		if t, err := time.Parse(layout, v); err == nil {
			return timestamppb.New(t), nil
		}
	}
	return nil, usageError{fmt.Errorf("--%s %q: want a date (2026-12-01, UTC), an RFC 3339 time or a duration ago such as 72h", name, v)}
}

// warnBudget says a submission's budget warning on stderr, if it has one.
func warnBudget(g *globals, warning string) {
	if warning != "" {
		fmt.Fprintf(g.Stderr, "airlock: warning: %s\n", termtext.Line(warning))
	}
}

// dollars renders micro-dollars as $X.XX (rounded half up; under half
// a cent to the micro-dollar, pkg/usd), as the
// authority's own sentences do.
func dollars(micros int64) string { return usd.Format(micros) }

func newUsage(g *globals) *cobra.Command {
	var (
		tenant, since, until, by string
		limit                    int32
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show usage metered by the minute and its cost at the operator's rates, with budgets",
		Long: `Shows the usage of jobs and sessions, metered by the minute (a started minute
counts whole): vCPU-minutes and memory GB-minutes allocated while awake, what
was used beside them, disk GB-minutes while retained, network bytes, and the
cost at the operator's rates (metering.rates). A running job counts until
now, all of it awake (an upper bound), and is marked running. Budgets show
each tenant's month-to-date cost against its monthly budget.

A client sees its tenants, an approver the tenants it approves for, an
operator every tenant. --since defaults to the start of the current UTC
month, --until to now; each takes a date (2026-12-01, UTC), an RFC 3339 time
or a duration ago (72h).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			req := &authorityv1.GetUsageRequest{Limit: limit}
			var err error
			if req.Since, err = whenFlag("since", since, now); err != nil {
				return err
			}
			if req.Until, err = whenFlag("until", until, now); err != nil {
				return err
			}
			switch by {
			case "job":
				req.By = authorityv1.UsageGrouping_USAGE_GROUPING_JOB
			case "day":
				req.By = authorityv1.UsageGrouping_USAGE_GROUPING_DAY
			default:
				return usageError{fmt.Errorf("--by %q: want job or day", by)}
			}
			if limit < 0 || limit > 1000 {
				return usageError{fmt.Errorf("--limit %d: want 1 to 1000", limit)}
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				if req.Tenant, err = self.tenant(tenant); err != nil {
					return err
				}
				resp, err := client.GetUsage(cmd.Context(), req)
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) { printUsage(w, req.GetBy(), resp) })
			})
		},
	}
	tenantFlag(cmd, &tenant, "the tenant whose usage to show")
	cmd.Flags().StringVar(&since, "since", "", "usage from this time on (default: the start of the current UTC month)")
	cmd.Flags().StringVar(&until, "until", "", "usage before this time (default: now)")
	cmd.Flags().StringVar(&by, "by", "job", "one row per job (job) or per tenant, UTC day and runtime class (day)")
	cmd.Flags().Int32Var(&limit, "limit", 0, "at most this many rows, the most recent first (1-1000; default 100)")
	return cmd
}

func printUsage(w io.Writer, by authorityv1.UsageGrouping, resp *authorityv1.GetUsageResponse) {
	first := "JOB"
	if by == authorityv1.UsageGrouping_USAGE_GROUPING_DAY {
		first = "DAY"
	}
	fmt.Fprintf(w, "%s\tTENANT\tCLASS\tAWAKE\tASLEEP\tVCPU-MIN\tMEM-GB-MIN\tCPU-USED-MIN\tMEM-USED-GB-MIN\tDISK-GB-MIN\tNET-SENT\tNET-RECV\tCOST\n", first)
	row := func(name, tenant, class string, u *authorityv1.Usage) {
		if u.GetRunning() {
			name += " (running)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%dm\t%dm\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%s\n", name, tenant, class,
			u.GetAwakeMinutes(), u.GetAsleepMinutes(), u.GetVcpuMinutes(), u.GetMemoryGbMinutes(), u.GetCpuUsedMinutes(),
			u.GetMemoryUsedGbMinutes(), u.GetDiskGbMinutes(), u.GetNetworkSentBytes(), u.GetNetworkReceivedBytes(), dollars(u.GetCostMicros()))
	}
	for _, u := range resp.GetRows() {
		name := u.GetJobId()
		if by == authorityv1.UsageGrouping_USAGE_GROUPING_DAY {
			name = u.GetDay()
		}
		row(name, u.GetTenant(), runtimeClassWord(u.GetRuntimeClass()), u)
	}
	row("TOTAL", "", "", resp.GetTotal())
	if resp.GetTruncated() {
		fmt.Fprintf(w, "(more rows matched than --limit shows; the total counts them all)\n")
	}
	r := resp.GetRates()
	fmt.Fprintf(w, "\nrates per 730-hour month: %s/vCPU, %s/GB memory, %s/GB disk", dollars(r.GetVcpuMonthMicros()), dollars(r.GetMemoryGbMonthMicros()), dollars(r.GetDiskGbMonthMicros()))
	for _, c := range slices.Sorted(maps.Keys(r.GetClassComputeMillis())) {
		fmt.Fprintf(w, "; %s compute x%g", c, float64(r.GetClassComputeMillis()[c])/1000)
	}
	fmt.Fprintln(w)
	for _, b := range resp.GetBudgets() {
		if b.GetMonthlyLimitMicros() == 0 {
			fmt.Fprintf(w, "budget %s: %s this month, no monthly budget\n", b.GetTenant(), dollars(b.GetUsedMicros()))
			continue
		}
		fmt.Fprintf(w, "budget %s: %s of %s this month (%d%%)\n", b.GetTenant(), dollars(b.GetUsedMicros()), dollars(b.GetMonthlyLimitMicros()),
			b.GetUsedMicros()*100/b.GetMonthlyLimitMicros())
	}
}
