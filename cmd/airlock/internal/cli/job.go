package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newJob(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Submit, follow and cancel sandboxed jobs"}
	cmd.AddCommand(newJobSubmit(g), newJobGet(g), newJobList(g), newJobWatch(g), newJobCancel(g), newJobUpdate(g), newJobEgress(g), newJobDownload(g))
	return cmd
}

type submitFlags struct {
	tenant, repo, rev, runtime, key, memory, disk string
	publishTo, user, image                        string
	cpu                                           float64
	pids                                          int64
	timeout                                       time.Duration
	env, caches, with, credentials                []string
	wait, raw                                     bool
	net                                           networkFlags
}

func newJobSubmit(g *globals) *cobra.Command {
	var f submitFlags
	cmd := &cobra.Command{
		Use:   "submit --repo R --rev REV [flags] -- CMD [ARGS...]",
		Short: "Submit a job; with --wait, stream its output and exit with its exit code",
		Long: `Submits CMD to run in a sandbox on repository R at revision REV (a branch,
tag or commit, resolved to a commit by the authority at submit time).

With --wait the job's output is streamed as it runs, a summary follows on
stderr (exit status, reason, usage, diff stat, bundle digest), and airlock
exits with the job's own exit code: 124 for a timeout, 137 for OOM, 130
when cancelled, 1 when the job failed to run.

` + streamHelp,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobSubmit(cmd.Context(), g, &f, args)
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&f.wait, "wait", false, "stream output and wait for the result")
	fl.BoolVar(&f.raw, "raw", false, "with --wait, copy the job's output to a terminal unescaped")
	return cmd
}

// register adds the flags that say what to run in and how: the ones a job
// and a session share.
func (f *submitFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	tenantFlag(cmd, &f.tenant, "tenant to run under")
	fl.StringVar(&f.repo, "repo", "", "repository name from the tenant's policy (required)")
	cmdutil.Required(cmd, "repo")
	fl.StringVar(&f.rev, "rev", "HEAD", "branch, tag or commit")
	fl.Float64Var(&f.cpu, "cpu", 0, "CPU cores, e.g. 0.5 (default: the tenant's)")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512MiB (default: the tenant's)")
	fl.Int64Var(&f.pids, "pids", 0, "process limit (default: the tenant's)")
	fl.StringVar(&f.disk, "disk", "", "disk limit for /work, /tmp and /out together, e.g. 1GiB")
	fl.DurationVar(&f.timeout, "timeout", 0, "deadline, e.g. 10m (default: the tenant's)")
	fl.StringVar(&f.runtime, "runtime", "", "runtime class: "+runtimeClassWords()+" (default: the tenant's)")
	fl.StringArrayVar(&f.with, "with", nil, "run beside the job in its sandbox: docker, a Docker daemon (runtime class vm only, at least 1GiB of memory; repeatable)")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE for the command (repeatable; never a credential)")
	fl.StringArrayVar(&f.caches, "cache", nil, "a named cache of the tenant's policy to mount, kept per repository (repeatable)")
	fl.StringArrayVar(&f.credentials, "credential", nil, "a brokered credential of the tenant's policy, by name: the egress proxy adds it to requests to its hosts, which --allow-domain must reach on 443; the job never holds it (repeatable)")
	fl.StringVar(&f.user, "user", "", "who the job runs as: agent, root, UID or UID:GID, ids 0 to 65533 (default: the tenant's)")
	fl.StringVar(&f.image, "image", "", "OCI image to run on, HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST] within the tenant's image policy, or host for the executor's host template (default: the tenant's)")
	fl.StringVar(&f.key, "idempotency-key", "", "the same key returns the same job (default: a fresh random key)")
	fl.StringVar(&f.publishTo, "publish-to", "", "REPO:BRANCH where the result may be published after approval")
	f.net.register(fl, "; default: deny-all")
}

func jobSubmit(ctx context.Context, g *globals, f *submitFlags, argv []string) error {
	spec, err := f.spec(argv)
	if err != nil {
		return err
	}
	return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
		tenant, err := self.tenant(f.tenant)
		if err != nil {
			return err
		}
		resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: tenant, Spec: spec, IdempotencyKey: f.idempotencyKey()})
		if err != nil {
			return err
		}
		warnBudget(g, resp.GetBudgetWarning())
		job := resp.GetJob()
		if !f.wait {
			return g.PrintProto(job, func(w io.Writer) {
				fmt.Fprintln(w, termtext.Line(job.GetJobId()))
			})
		}
		fmt.Fprintf(g.Stderr, "job %s submitted (commit %s)\n", termtext.Line(job.GetJobId()), termtext.Line(short(job.GetCommit())))
		final, err := watchJob(ctx, g, client, job.GetJobId(), f.raw)
		if err != nil {
			return err
		}
		return finishWait(g, final)
	})
}

// idempotencyKey is --idempotency-key, or a fresh random key.
func (f *submitFlags) idempotencyKey() string {
	if f.key != "" {
		return f.key
	}
	return randomID("cli-")
}

// randomID is prefix and 24 random hex digits.
func randomID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// spec builds the spec the flags say, running argv.
func (f *submitFlags) spec(argv []string) (*authorityv1.JobSpec, error) {
	spec := &authorityv1.JobSpec{Repository: f.repo, Revision: f.rev, Command: argv, Resources: &typesv1.ResourceLimits{}, Caches: f.caches, Image: f.image, With: f.with,
		Credentials: f.credentials}
	if f.cpu < 0 {
		return nil, usageError{errors.New("--cpu must not be negative")}
	}
	spec.Resources.CpuMillis = int64(f.cpu * 1000)
	var err error
	if spec.Resources.MemoryBytes, err = parseSize("--memory", f.memory); err != nil {
		return nil, err
	}
	if spec.Resources.DiskBytes, err = parseSize("--disk", f.disk); err != nil {
		return nil, err
	}
	spec.Resources.Pids = f.pids
	if f.timeout > 0 {
		spec.Resources.Deadline = durationpb.New(f.timeout)
	}
	if f.runtime != "" {
		rc, ok := runtimeClassOf(f.runtime)
		if !ok {
			return nil, usageError{fmt.Errorf("--runtime %q: must be %s", f.runtime, runtimeClassWords())}
		}
		spec.RuntimeClass = rc
	}
	if spec.NetworkPolicy, err = f.net.policy(); err != nil {
		return nil, err
	}
	if f.publishTo != "" {
		repo, branch, ok := strings.Cut(f.publishTo, ":")
		if !ok || repo == "" || branch == "" {
			return nil, usageError{fmt.Errorf("--publish-to %q: want REPO:BRANCH", f.publishTo)}
		}
		spec.PublishTarget = &typesv1.PublishTarget{Repository: repo, Branch: branch}
	}
	if spec.Env, err = parseEnv(f.env); err != nil {
		return nil, err
	}
	if f.user != "" {
		u, err := runspec.ParseUser(f.user)
		if err != nil {
			return nil, usageError{fmt.Errorf("--user %v", err)}
		}
		spec.User = &typesv1.JobUser{Uid: u.UID, Gid: u.GID}
	}
	return spec, nil
}

// parseEnv reads repeated --env KEY=VALUE flags; none is nil.
func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--env %q: want KEY=VALUE", kv)}
		}
		env[k] = v
	}
	return env, nil
}

func parseSize(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := config.ParseByteSize(s)
	if err != nil {
		return 0, usageError{fmt.Errorf("%s %q: %v", flag, s, err)}
	}
	return n, nil
}

func newJobGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get JOB_ID",
		Short: "Show one job",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showAuthority(cmd, g, func(ctx context.Context, c authorityv1.AuthorityServiceClient) (*authorityv1.Job, error) {
				resp, err := c.GetJob(ctx, &authorityv1.GetJobRequest{JobId: args[0]})
				return resp.GetJob(), err
			}, func(w io.Writer, job *authorityv1.Job) {
				fmt.Fprintf(w, "repository %s @ %s (%s)\n", termtext.Line(job.GetSpec().GetRepository()), termtext.Line(job.GetSpec().GetRevision()),
					termtext.Line(short(job.GetCommit())))
				fmt.Fprintf(w, "command    %s\n", commandText(job.GetSpec().GetCommand()))
				fmt.Fprintf(w, "requester  %s\n", termtext.Line(job.GetRequester()))
				fmt.Fprintf(w, "state      %s\n", jobStateWord(job.GetState()))
				writePlacement(w, job)
				writeWith(w, job)
				writeUser(w, job)
				writeLimits(w, job)
				writeSummary(w, job)
			})
		},
	}
}

// writePlacement says which executor of the fleet a job or session is
// placed on.
func writePlacement(w io.Writer, job *authorityv1.Job) {
	switch {
	case job.GetExecutor() != "":
		fmt.Fprintf(w, "executor   %s\n", termtext.Line(job.GetExecutor()))
	case terminal(job.GetState()):
		fmt.Fprintln(w, "executor   never placed")
	default:
		fmt.Fprintln(w, "executor   not placed yet")
	}
}

func newJobList(g *globals) *cobra.Command {
	return listCommand(g, "jobs",
		func(ctx context.Context, c authorityv1.AuthorityServiceClient, tenant, token string, size int32) ([]*authorityv1.Job, string, error) {
			r, err := c.ListJobs(ctx, &authorityv1.ListJobsRequest{Tenant: tenant, PageSize: size, PageToken: token})
			return r.GetJobs(), r.GetNextPageToken(), err
		},
		func(jobs []*authorityv1.Job) proto.Message { return &authorityv1.ListJobsResponse{Jobs: jobs} },
		func(w io.Writer, jobs []*authorityv1.Job) {
			fmt.Fprintln(w, "JOB\tSTATE\tREPOSITORY\tCOMMIT\tCOMMAND\tCREATED")
			for _, j := range jobs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", termtext.Line(j.GetJobId()), jobStateWord(j.GetState()),
					termtext.Line(j.GetSpec().GetRepository()), termtext.Line(short(j.GetCommit())), commandText(j.GetSpec().GetCommand()),
					j.GetCreatedAt().AsTime().Local().Format(time.DateTime))
			}
		})
}

// listCommand is a "list" command of a tenant's jobs or sessions (what):
// fetch reads one page, wrap makes the -o json message, text the table.
func listCommand(g *globals, what string,
	fetch func(ctx context.Context, c authorityv1.AuthorityServiceClient, tenant, token string, size int32) ([]*authorityv1.Job, string, error),
	wrap func([]*authorityv1.Job) proto.Message, text func(io.Writer, []*authorityv1.Job)) *cobra.Command {
	var tenant string
	var limit int32
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's " + what + ", newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				forTenant, err := self.tenant(tenant)
				if err != nil {
					return err
				}
				if limit < 1 {
					return usageError{fmt.Errorf("--limit %d: want at least 1", limit)}
				}
				list, err := allPages(int(limit), func(token string, size int32) ([]*authorityv1.Job, string, error) {
					return fetch(cmd.Context(), client, forTenant, token, size)
				})
				if err != nil {
					return err
				}
				return g.PrintProto(wrap(list), func(w io.Writer) { text(w, list) })
			})
		},
	}
	tenantFlag(cmd, &tenant, "whose "+what+" to list")
	cmd.Flags().Int32Var(&limit, "limit", 50, "at most this many "+what)
	return cmd
}

func newJobWatch(g *globals) *cobra.Command {
	var raw bool
	cmd := &cobra.Command{
		Use:   "watch JOB_ID",
		Short: "Stream a job's output and exit with its exit code",
		Long:  "Streams a job's output and exits with its exit code, as job submit --wait does.\n\n" + streamHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				final, err := watchJob(cmd.Context(), g, client, args[0], raw)
				if err != nil {
					return err
				}
				return finishWait(g, final)
			})
		},
	}
	cmd.Flags().BoolVar(&raw, "raw", false, "copy the job's output to a terminal unescaped")
	return cmd
}

func newJobCancel(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "Cancel a job; its sandbox is killed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showAuthority(cmd, g, func(ctx context.Context, c authorityv1.AuthorityServiceClient) (*authorityv1.Job, error) {
				resp, err := c.CancelJob(ctx, &authorityv1.CancelJobRequest{JobId: args[0], Reason: reason})
				return resp.GetJob(), err
			}, func(w io.Writer, job *authorityv1.Job) {
				fmt.Fprintf(w, "cancel requested for %s (state %s)\n", termtext.Line(args[0]), jobStateWord(job.GetState()))
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "cancelled from the CLI", "why, for the record")
	return cmd
}
