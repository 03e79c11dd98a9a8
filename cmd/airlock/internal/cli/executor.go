package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// The fleet of executors as an operator sees it: listed, shown with the
// jobs placed on each, drained before a stop and undrained after. Every
// command here acts as an operator (withOperator).

const executorHelp = `Acts as an operator: --as operator/NAME, else the client config's identity
when it is one, else the dev stack's operator/admin when the config's
pki_dir holds it.`

func newExecutor(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "executor",
		Short: "List, show, drain and undrain the fleet's executors (as an operator)",
		Long: `The executors of the fleet, as the authority knows them from their
heartbeats. Drain one before stopping it: no new work is placed on it, and
what is placed there finishes; once nothing is placed it can be stopped.

` + executorHelp,
	}
	cmd.AddCommand(newExecutorList(g), newExecutorGet(g), newExecutorDrain(g), newExecutorUndrain(g))
	return cmd
}

func newExecutorList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the fleet: state, address, runtime classes, placed jobs, free capacity, last heartbeat",
		Long:  executorHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withOperator(g, func(client authorityv1.AuthorityServiceClient) error {
				resp, err := client.ListExecutors(cmd.Context(), &authorityv1.ListExecutorsRequest{})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) { writeExecutorTable(w, resp.GetExecutors(), time.Now()) })
			})
		},
	}
}

func newExecutorGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one executor: its report, its drain, the jobs placed on it",
		Long:  executorHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withOperator(g, func(client authorityv1.AuthorityServiceClient) error {
				resp, err := client.GetExecutor(cmd.Context(), &authorityv1.GetExecutorRequest{Name: args[0]})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) { writeExecutor(w, resp, time.Now()) })
			})
		},
	}
}

func newExecutorDrain(g *globals) *cobra.Command {
	var reason string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "drain NAME [--reason TEXT] [--wait [--timeout D]]",
		Short: "Place no new work on an executor; with --wait, wait until nothing is placed on it",
		Long: `Drains the executor: no new work is placed on it, and the jobs and
sessions placed there go on to their end. The drain is on the audit log,
with --reason. With --wait the command polls until nothing is placed on the
executor (saying how many jobs are left as that changes): then it can be
stopped. --timeout bounds the wait (exit 1 when it runs out; the executor
stays draining).

` + executorHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout != 0 && !wait {
				return usageError{fmt.Errorf("--timeout goes with --wait")}
			}
			if timeout < 0 {
				return usageError{fmt.Errorf("--timeout %s: want a positive duration", timeout)}
			}
			return withOperator(g, func(client authorityv1.AuthorityServiceClient) error {
				resp, err := client.DrainExecutor(cmd.Context(), &authorityv1.DrainExecutorRequest{Name: args[0], Drain: true, Reason: reason})
				if err != nil {
					return err
				}
				if wait {
					e, err := waitDrained(cmd.Context(), g, client, resp.GetExecutor(), timeout)
					if err != nil {
						return err
					}
					resp = &authorityv1.DrainExecutorResponse{Executor: e}
				}
				return g.PrintProto(resp, func(w io.Writer) { fmt.Fprintln(w, drainText(resp.GetExecutor())) })
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until nothing is placed on the executor")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --wait, give up after this long (default: no limit)")
	return cmd
}

func newExecutorUndrain(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "undrain NAME",
		Short: "End an executor's drain: new work may be placed on it again",
		Long:  "The end of the drain is on the audit log.\n\n" + executorHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withOperator(g, func(client authorityv1.AuthorityServiceClient) error {
				resp, err := client.DrainExecutor(cmd.Context(), &authorityv1.DrainExecutorRequest{Name: args[0]})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) {
					e := resp.GetExecutor()
					fmt.Fprintf(w, "executor %s: not draining; new work may be placed on it (%s)\n", termtext.Line(e.GetName()), executorState(e))
				})
			})
		},
	}
}

// drainPoll is how often drain --wait asks how much is still placed.
var drainPoll = 2 * time.Second

// waitDrained polls the draining executor e until nothing is placed on it
// and returns it then, saying on stderr how many jobs are left each time
// that changes. It gives up after timeout (0: never), or when the drain
// is ended meanwhile.
func waitDrained(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, e *authorityv1.Executor, timeout time.Duration) (*authorityv1.Executor, error) {
	name := e.GetName()
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	said := int64(-1)
	for {
		if !e.GetDraining() {
			return nil, remoteError{fmt.Errorf("executor %s: its drain was ended while waiting (%s)", name, executorState(e))}
		}
		if e.GetPlaced() == 0 {
			return e, nil
		}
		if e.GetPlaced() != said && g.Output == "text" {
			fmt.Fprintf(g.Stderr, "executor %s: %s still placed\n", termtext.Line(name), jobCount(e.GetPlaced()))
			said = e.GetPlaced()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-expired:
			return nil, remoteError{fmt.Errorf("executor %s: %s still placed after %s; it stays draining", name, jobCount(e.GetPlaced()), timeout)}
		case <-time.After(drainPoll):
		}
		resp, err := client.GetExecutor(ctx, &authorityv1.GetExecutorRequest{Name: name})
		switch {
		case status.Code(err) == codes.Unavailable:
			continue // the authority restarting: ask again
		case err != nil:
			return nil, err
		}
		e = resp.GetExecutor()
	}
}

// drainText says where a drain of e stands.
func drainText(e *authorityv1.Executor) string {
	name := termtext.Line(e.GetName())
	if e.GetPlaced() == 0 {
		return fmt.Sprintf("executor %s is drained: nothing placed on it; it can be stopped", name)
	}
	return fmt.Sprintf("executor %s is draining: no new work is placed on it; %s still placed (drain --wait waits for them)", name, jobCount(e.GetPlaced()))
}

func jobCount(n int64) string {
	if n == 1 {
		return "1 job"
	}
	return fmt.Sprintf("%d jobs", n)
}

// writeExecutorTable lists executors, one a line, every text an executor
// reported escaped.
func writeExecutorTable(w io.Writer, list []*authorityv1.Executor, now time.Time) {
	fmt.Fprintln(w, "NAME\tSTATE\tADDRESS\tCLASSES\tPLACED\tFREE JOBS\tFREE MEMORY\tFREE CPU\tWARM POOL\tLAST SEEN")
	for _, e := range list {
		c := e.GetReport().GetCapacity()
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d/%d\t%s/%s\t%s/%s\t%s\t%s\n", termtext.Line(e.GetName()), executorState(e), termtext.Line(e.GetAddress()),
			orDash(classList(e.GetReport(), ",")), e.GetPlaced(), c.GetJobsFree(), c.GetJobs(), humanBytes(c.GetMemoryFreeBytes()), humanBytes(c.GetMemoryBytes()),
			cores(c.GetCpuFreeMillis()), cores(c.GetCpuMillis()), poolSummary(e.GetReport()), ago(e.GetLastSeen(), now))
	}
}

// poolSummary is an executor's warm pools in one word: sandboxes ready of
// those its tenants ask for, and the sessions given one of all those that
// could have been ("2/2 ready, 41/44 hits"); "-" for none.
func poolSummary(r *authorityv1.ExecutorReport) string {
	if len(r.GetWarmPools()) == 0 {
		return "-"
	}
	var ready, target int32
	var hits, misses int64
	for _, p := range r.GetWarmPools() {
		ready, target, hits, misses = ready+p.GetReady(), target+p.GetTarget(), hits+p.GetHits(), misses+p.GetMisses()
	}
	return fmt.Sprintf("%d/%d ready, %d/%d hits", ready, target, hits, hits+misses)
}

// writeWarmPools lists an executor's warm pools, one a line.
func writeWarmPools(w io.Writer, r *authorityv1.ExecutorReport) {
	for _, p := range r.GetWarmPools() {
		line := fmt.Sprintf("warm pool  tenant %s, %s as %d:%d, disk %s, /dev/shm %s: %d of %d ready, %d hits, %d misses",
			termtext.Line(p.GetTenant()), runtimeClassWord(p.GetRuntimeClass()), p.GetUid(), p.GetGid(), humanBytes(p.GetDiskBytes()), humanBytes(p.GetShmBytes()),
			p.GetReady(), p.GetTarget(), p.GetHits(), p.GetMisses())
		if d := p.GetRefillMedian().AsDuration(); d > 0 {
			line += fmt.Sprintf(", made in %v (median; last %v)", d.Round(time.Millisecond), p.GetRefillLast().AsDuration().Round(time.Millisecond))
		}
		if e := p.GetLastError(); e != "" {
			line += "; its last refill failed: " + termtext.Line(e)
		}
		fmt.Fprintln(w, line)
	}
}

// fleetSummary counts the fleet by state: "3 executors: 2 up, 1 lost; 1
// draining".
func fleetSummary(list []*authorityv1.Executor) string {
	if len(list) == 0 {
		return "no executor has joined the fleet"
	}
	counts := map[authorityv1.ExecutorState]int{}
	draining := 0
	for _, e := range list {
		counts[e.GetState()]++
		if e.GetDraining() {
			draining++
		}
	}
	noun := "executors"
	if len(list) == 1 {
		noun = "executor"
	}
	s := fmt.Sprintf("%d %s: %d up, %d lost", len(list), noun, counts[authorityv1.ExecutorState_EXECUTOR_STATE_UP], counts[authorityv1.ExecutorState_EXECUTOR_STATE_LOST])
	if draining > 0 {
		s += fmt.Sprintf("; %d draining", draining)
	}
	return s
}

// classList is the runtime classes an executor reported, joined by sep.
func classList(r *authorityv1.ExecutorReport, sep string) string {
	var words []string
	for _, c := range r.GetRuntimeClasses() {
		words = append(words, runtimeClassWord(c))
	}
	return strings.Join(words, sep)
}

// writeExecutor shows one executor and the jobs placed on it.
func writeExecutor(w io.Writer, resp *authorityv1.GetExecutorResponse, now time.Time) {
	e, r := resp.GetExecutor(), resp.GetExecutor().GetReport()
	c := r.GetCapacity()
	fmt.Fprintf(w, "executor   %s\n", termtext.Line(e.GetName()))
	fmt.Fprintf(w, "id         %s\n", termtext.Line(orDash(e.GetId())))
	fmt.Fprintf(w, "address    %s\n", termtext.Line(orDash(e.GetAddress())))
	state := executorState(e)
	if e.GetDraining() {
		state += fmt.Sprintf(" since %s, by %s", when(e.GetDrainedAt()), termtext.Line(orDash(e.GetDrainedBy())))
		if why := e.GetDrainReason(); why != "" {
			state += ": " + termtext.Line(why)
		}
	}
	fmt.Fprintf(w, "state      %s\n", state)
	fmt.Fprintf(w, "joined     %s\n", when(e.GetJoinedAt()))
	fmt.Fprintf(w, "last seen  %s (%s)\n", when(e.GetLastSeen()), ago(e.GetLastSeen(), now))
	fmt.Fprintf(w, "version    %s, started %s\n", termtext.Line(orDash(r.GetVersion())), when(r.GetStartedAt()))
	fmt.Fprintf(w, "classes    %s\n", orDash(classList(r, ", ")))
	fmt.Fprintf(w, "capacity   jobs %d free of %d, memory %s free of %s, cpu %s free of %s, disk %s free of %s\n",
		c.GetJobsFree(), c.GetJobs(), humanBytes(c.GetMemoryFreeBytes()), humanBytes(c.GetMemoryBytes()),
		cores(c.GetCpuFreeMillis()), cores(c.GetCpuMillis()), humanBytes(c.GetDiskFreeBytes()), humanBytes(c.GetDiskBytes()))
	fmt.Fprintf(w, "holds      %d images, source of %d repositories\n", len(r.GetImages()), len(r.GetSources()))
	fmt.Fprintf(w, "networks   %s\n", termtext.Line(orDash(strings.Join(r.GetNetworkPools(), ", "))))
	runs := fmt.Sprintf("%d", len(r.GetRuns()))
	if r.GetRunsTruncated() {
		runs = "more than " + runs
	}
	fmt.Fprintf(w, "runs       %s held, as it reported\n", runs)
	writeWarmPools(w, r)
	placed := fmt.Sprintf("placed     %s not ended", jobCount(e.GetPlaced()))
	if n := int64(len(resp.GetJobs())); n < e.GetPlaced() {
		placed += fmt.Sprintf(" (the first %d listed)", n)
	}
	fmt.Fprintln(w, placed)
	for _, j := range resp.GetJobs() {
		fmt.Fprintf(w, "  %s\n", termtext.Line(j))
	}
	switch {
	case !e.GetDraining():
		fmt.Fprintf(w, "safe to stop: no, not draining (airlock executor drain %s)\n", termtext.Line(e.GetName()))
	case e.GetPlaced() > 0:
		fmt.Fprintf(w, "safe to stop: no, %s still placed\n", jobCount(e.GetPlaced()))
	default:
		fmt.Fprintln(w, "safe to stop: yes (keep its data directory: it holds finished jobs' bundles until they are published)")
	}
}

// when is a time as the CLI shows one, local; "-" for none.
func when(t *timestamppb.Timestamp) string {
	if t.AsTime().Unix() <= 0 {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime)
}
