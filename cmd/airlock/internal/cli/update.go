package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

type updateFlags struct {
	memory  string
	cpu     float64
	pids    int64
	timeout time.Duration
	net     networkFlags
	// A session's settings.
	idleTimeout time.Duration
	maxExecs    int32
	onIdle      string
}

// networkFlags are the network-policy flags of job submit and job update.
type networkFlags struct {
	allow, allowDomain []string
	denyAll            bool
}

func (f *networkFlags) register(fl *pflag.FlagSet, what string) {
	fl.StringArrayVar(&f.allow, "allow", nil, "CIDR or CIDR:PORT[,PORT...] the job may reach (repeatable"+what+")")
	fl.StringArrayVar(&f.allowDomain, "allow-domain", nil, "NAME or NAME:PORT[,PORT...] the job may reach, *.suffix for one label below it (repeatable; ports default to 443 and 80"+what+")")
	fl.BoolVar(&f.denyAll, "deny-all", false, "deny-all: loopback only"+what)
}

// policy is the policy the flags give, nil when none was given.
func (f *networkFlags) policy() (*typesv1.NetworkPolicy, error) {
	modes := 0
	for _, given := range []bool{f.denyAll, len(f.allow) > 0, len(f.allowDomain) > 0} {
		if given {
			modes++
		}
	}
	switch {
	case modes > 1:
		return nil, usageError{errors.New("--deny-all, --allow and --allow-domain exclude each other: a policy is deny-all, CIDR rules or names")}
	case f.denyAll:
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}, nil
	case len(f.allow) > 0:
		list := &typesv1.AllowList{}
		for _, a := range f.allow {
			r, err := parseAllow(a)
			if err != nil {
				return nil, usageError{err}
			}
			list.Rules = append(list.Rules, r)
		}
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: list}}, nil
	case len(f.allowDomain) > 0:
		list := &typesv1.DomainList{}
		for i, d := range f.allowDomain {
			name, ports, _ := strings.Cut(d, ":")
			norm, err := egress.NormalizeName(name)
			if err != nil {
				return nil, usageError{fmt.Errorf("--allow-domain %q: %v", d, err)}
			}
			p, err := parsePorts("--allow-domain", d, ports)
			if err != nil {
				return nil, err
			}
			// The domains mode has one port list for all its names.
			if i > 0 && !slices.Equal(p, list.Ports) {
				return nil, usageError{fmt.Errorf("--allow-domain %q: every --allow-domain must give the same ports (%v)", d, list.Ports)}
			}
			list.Domains, list.Ports = append(list.Domains, norm), p
		}
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: list}}, nil
	}
	return nil, nil
}

// parsePorts reads "PORT,PORT" ("" is none).
func parsePorts(flag, arg, ports string) ([]uint32, error) {
	if ports == "" {
		return nil, nil
	}
	var out []uint32
	for _, p := range strings.Split(ports, ",") {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return nil, usageError{fmt.Errorf("%s %q: %q is not a TCP port", flag, arg, p)}
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

func newJobUpdate(g *globals) *cobra.Command {
	var f updateFlags
	cmd := &cobra.Command{
		Use:   "update JOB_ID [--memory SIZE] [--cpu CORES] [--pids N] [--timeout D] [--idle-timeout D] [--max-execs N] [--allow CIDR[:PORT,...]]... [--allow-domain NAME[:PORT,...]]... [--deny-all]",
		Short: "Change a running job's limits or network policy, or a session's idle timeout and concurrent execs",
		Long: `Changes a running job's limits (only those given) or replaces its network
policy (--allow or --allow-domain, repeatable, or --deny-all). For a session,
--idle-timeout and --max-execs change how long it may sit with no exec
running and how many execs may run at once; lowering --max-execs stops no
running exec, it only refuses new ones until fewer run.

Narrowing (lower limits, fewer destinations) takes effect at once. Widening
needs an approval where the tenant's policy says so: the command then prints
the approval's id, and the change applies when another approver approves it
(never the one who asked). The disk limit cannot change on a running job.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u jobUpdate
			if err := u.Complete(&f, args); err != nil {
				return err
			}
			if err := u.Validate(); err != nil {
				return err
			}
			return u.Run(cmd.Context(), g)
		},
	}
	fl := cmd.Flags()
	fl.Float64Var(&f.cpu, "cpu", 0, "CPU cores, e.g. 0.5")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 1GiB")
	fl.Int64Var(&f.pids, "pids", 0, "process limit")
	fl.DurationVar(&f.timeout, "timeout", 0, "deadline, counted from the job's start, e.g. 20m")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", 0, "a session's idle timeout, e.g. 1h")
	fl.Int32Var(&f.maxExecs, "max-execs", 0, "how many execs a session may run at once")
	fl.StringVar(&f.onIdle, "on-idle", "", "what a session does once idle past its idle timeout: end or sleep")
	f.net.register(fl, "; replaces the policy")
	return cmd
}

// parseAllow reads "CIDR" or "CIDR:PORT,PORT"; an IPv6 CIDR with ports is
// written "[2001:db8::/32]:443".
func parseAllow(s string) (*typesv1.AllowRule, error) {
	cidr, ports := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return nil, fmt.Errorf("--allow %q: missing ']'", s)
		}
		cidr, ports = s[1:end], strings.TrimPrefix(s[end+1:], ":")
	} else if i := strings.LastIndex(s, ":"); i >= 0 && !strings.Contains(s[:i], ":") {
		cidr, ports = s[:i], s[i+1:]
	}
	if _, err := egress.ParsePrefix(cidr); err != nil {
		return nil, fmt.Errorf("--allow %q: %v", s, err)
	}
	p, err := parsePorts("--allow", s, ports)
	if err != nil {
		return nil, err
	}
	return &typesv1.AllowRule{Cidr: cidr, Ports: p}, nil
}

// jobUpdate is one job update in kubectl's Complete/Validate/Run shape:
// Complete reads the flags into the change (each flag checked as it is
// read), Validate checks the change as a whole, Run asks for it.
type jobUpdate struct {
	jobID   string
	limits  *typesv1.ResourceLimits
	session *typesv1.SessionSpec
	network *typesv1.NetworkPolicy
}

func (u *jobUpdate) Complete(f *updateFlags, args []string) error {
	u.jobID = args[0]
	if f.memory != "" || f.cpu != 0 || f.pids != 0 || f.timeout != 0 {
		if f.cpu < 0 || f.pids < 0 || f.timeout < 0 {
			return usageError{errors.New("--cpu, --pids and --timeout must not be negative")}
		}
		u.limits = &typesv1.ResourceLimits{CpuMillis: int64(f.cpu * 1000), Pids: f.pids}
		var err error
		if u.limits.MemoryBytes, err = parseSize("--memory", f.memory); err != nil {
			return err
		}
		if f.timeout > 0 {
			u.limits.Deadline = durationpb.New(f.timeout)
		}
	}
	if f.idleTimeout != 0 || f.maxExecs != 0 || f.onIdle != "" {
		if f.idleTimeout < 0 || f.maxExecs < 0 {
			return usageError{errors.New("--idle-timeout and --max-execs must not be negative")}
		}
		action, ok := idleActionOf(f.onIdle)
		if !ok {
			return usageError{fmt.Errorf("--on-idle %q: want end or sleep", f.onIdle)}
		}
		u.session = &typesv1.SessionSpec{MaxConcurrentExecs: f.maxExecs, OnIdle: action}
		if f.idleTimeout > 0 {
			u.session.IdleTimeout = durationpb.New(f.idleTimeout)
		}
	}
	var err error
	u.network, err = f.net.policy()
	return err
}

func (u *jobUpdate) Validate() error {
	if u.limits == nil && u.session == nil && u.network == nil {
		return usageError{errors.New("nothing to change: give --memory, --cpu, --pids, --timeout, --idle-timeout, --max-execs, --on-idle, --allow, --allow-domain or --deny-all")}
	}
	return nil
}

func (u *jobUpdate) Run(ctx context.Context, g *globals) error {
	return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
		type outcome struct {
			What       string `json:"what"`
			ApprovalID string `json:"approval_id,omitempty"`
		}
		var results []outcome
		if u.limits != nil || u.session != nil {
			// One change: limits and session settings widen or narrow together.
			resp, err := client.UpdateJobLimits(ctx, &authorityv1.UpdateJobLimitsRequest{JobId: u.jobID, Limits: u.limits, Session: u.session})
			if err != nil {
				return err
			}
			what := "limits"
			if u.limits == nil {
				what = "session"
			}
			results = append(results, outcome{what, resp.GetApprovalId()})
		}
		if u.network != nil {
			resp, err := client.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: u.jobID, Policy: u.network})
			if err != nil {
				return err
			}
			results = append(results, outcome{"network_policy", resp.GetApprovalId()})
		}
		job, err := client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: u.jobID})
		if err != nil {
			return err
		}
		return g.Print(results, func(w io.Writer) {
			for _, r := range results {
				if r.ApprovalID != "" {
					id := termtext.Line(r.ApprovalID)
					fmt.Fprintf(w, "%s: widening; waiting for approval %s (airlock approval show %s --as approver/NAME)\n", r.What, id, id)
				} else {
					fmt.Fprintf(w, "%s: applied\n", r.What)
				}
			}
			writeLimits(w, job.GetJob())
		})
	})
}

// writeLimits prints the limits and network policy a job runs under.
func writeLimits(w io.Writer, job *authorityv1.Job) {
	l := job.GetLimits()
	if l == nil {
		return
	}
	fmt.Fprintf(w, "limits     %s (grant generation %d)\n", limitsLine(l), job.GetGrantGeneration())
	if s := job.GetSession(); s != nil {
		fmt.Fprintf(w, "session    %s\n", sessionText(s))
	}
	st := job.GetNetworkPolicyStatus()
	fmt.Fprintf(w, "network    %s (generation %d, %s)\n", termtext.Line(policyText(st.GetPolicy())), st.GetGeneration(),
		networkStateWord(st.GetState()))
}

// limitsLine is every limit in one line, the disk's too.
func limitsLine(l *typesv1.ResourceLimits) string {
	return fmt.Sprintf("cpu %.2f, memory %s, pids %d, disk %s, deadline %s", float64(l.GetCpuMillis())/1000, humanBytes(l.GetMemoryBytes()),
		l.GetPids(), humanBytes(l.GetDiskBytes()), l.GetDeadline().AsDuration())
}

// policyText is a network policy in one line.
func policyText(p *typesv1.NetworkPolicy) string {
	switch m := p.GetMode().(type) {
	case *typesv1.NetworkPolicy_Allow:
		var rules []string
		for _, r := range m.Allow.GetRules() {
			s := r.GetCidr()
			if len(r.GetPorts()) > 0 {
				var ports []string
				for _, p := range r.GetPorts() {
					ports = append(ports, strconv.Itoa(int(p)))
				}
				s += ":" + strings.Join(ports, ",")
			}
			rules = append(rules, s)
		}
		return "allow " + strings.Join(rules, " ")
	case *typesv1.NetworkPolicy_Domains:
		return "domains " + strings.Join(m.Domains.GetDomains(), " ")
	}
	return "deny_all"
}

// sessionText is a session's settings in one line.
func sessionText(s *typesv1.SessionSpec) string {
	text := fmt.Sprintf("idle timeout %s, at most %d execs at once", s.GetIdleTimeout().AsDuration(), s.GetMaxConcurrentExecs())
	if s.GetOnIdle() == typesv1.IdleAction_IDLE_ACTION_SLEEP {
		text += ", sleeps when idle"
	}
	return text
}

// limitsText is limits in one line.
func limitsText(l *typesv1.ResourceLimits) string {
	return fmt.Sprintf("cpu %.2f, memory %s, pids %d, deadline %s", float64(l.GetCpuMillis())/1000, humanBytes(l.GetMemoryBytes()),
		l.GetPids(), l.GetDeadline().AsDuration())
}
