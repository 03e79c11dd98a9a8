// Package selftest owns `airlock selftest`: the guide's validation plan run
// against a deployed stack, with its deployed policy, through the
// authority's and publisher's public gRPC APIs only, as a tenant's client
// (and an approver where a step needs one). Each part of the plan is a
// named row (isolation, egress, exit-status, idempotency, limits, export,
// restart) with its checks and a record of what it ran on; the report is
// text, JSON or JUnit XML. Only package cli imports it, to register the
// command.
package selftest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Options say what to test and how.
type Options struct {
	// Tenant the jobs run under; Repo and Rev what they run on.
	Tenant, Repo, Rev string
	// Runtimes are the classes to run the plan in, each its own rows;
	// none runs it once in the tenant's default class.
	Runtimes []typesv1.RuntimeClass
	// ExpectReach are destinations jobs must reach: NAME or CIDR, each
	// with an optional :PORT (443 when none).
	ExpectReach []string
	// CounterListen is where the selftest serves its counter, and
	// CounterAddr the HOST:PORT jobs dial it at (CounterListen when
	// empty). No CounterListen: the checks that need a live external
	// side are skipped, saying so.
	CounterListen, CounterAddr string
	// CounterFrom, when not empty, are the source addresses the counter
	// counts (the sandboxes' egress, or a relay's); others are ignored.
	CounterFrom []netip.Prefix
	// SecretPaths are files on the executor host no job may read.
	SecretPaths []string
	// PlantSecret writes a dummy secret on this machine and adds it to
	// SecretPaths: only when the operator says this machine is the
	// executor host (--on-executor-host), since elsewhere (a CI runner)
	// no job could see it anyway and the check would prove nothing.
	PlantSecret bool
	// MemoryProbe is how much a job allocates under the tenant's default
	// memory limit; PidsProbe how many processes it starts under the
	// default pids limit; Deadline the deadline the deadline job gets.
	MemoryProbe int64
	PidsProbe   int
	Deadline    time.Duration
	// Disruptive allows the restart row, which runs RestartCommand (a
	// shell command line that restarts the executor and returns once it
	// serves again).
	Disruptive     bool
	RestartCommand string
	// PublishTo is the REPO:BRANCH the export row's job names as its
	// target; without it (or without a pipeline) the row is skipped.
	PublishTo string
	// Rows, when not empty, runs only these rows.
	Rows []string
	// Progress gets one line as each row starts and ends.
	Progress io.Writer
}

// RowNames are the rows in the order they run (restart's rows, one
// executor restart for every class, come last).
var RowNames = []string{"exit-status", "isolation", "egress", "idempotency", "limits", "export", "restart"}

// Clients are the connections the selftest acts through: Client as the
// tenant's client, Approver (may be nil) as an approver of the tenant,
// Publisher (may be nil) to the publisher as a pipeline.
type Clients struct {
	Client    authorityv1.AuthorityServiceClient
	Approver  authorityv1.AuthorityServiceClient
	Publisher publisherv1.PublisherServiceClient
}

// Dial connects to service as identity as (KIND/NAME; "" for the
// config's own).
func Dial(cfg *clientconfig.Config, as, service string) (*grpc.ClientConn, error) {
	src, err := cfg.Source(as)
	if err != nil {
		return nil, err
	}
	addr, err := cfg.Address(service)
	if err != nil {
		return nil, err
	}
	return grpcclient.Dial(addr, src, identity.Service(cfg.TrustDomain, service))
}

// runner is one selftest run.
type runner struct {
	opts    Options
	cl      Clients
	run     string // this run's token, in every key, marker and path
	counter *counter

	mu   sync.Mutex
	jobs []string // every job and session started, for cleanup
}

// Run runs the plan and returns the report; it fails only when it could
// not run at all. Whatever it started is cancelled before it returns.
func Run(ctx context.Context, cl Clients, opts Options) (*Report, error) {
	if opts.Repo == "" {
		return nil, errors.New("repo: required")
	}
	if opts.Rev == "" {
		opts.Rev = "HEAD"
	}
	r := &runner{opts: opts, cl: cl, run: token()}
	if opts.CounterListen != "" {
		c, err := startCounter(opts.CounterListen, opts.CounterAddr, opts.CounterFrom)
		if err != nil {
			return nil, fmt.Errorf("--counter-listen %s: %w", opts.CounterListen, err)
		}
		defer c.close()
		r.counter = c
	}
	cleanupSecret, err := r.plantSecret()
	if err != nil {
		return nil, err
	}
	defer cleanupSecret()
	defer r.cleanup(context.WithoutCancel(ctx))

	rep := &Report{Started: time.Now(), Tenant: opts.Tenant}
	classes := opts.Runtimes
	if len(classes) == 0 {
		classes = []typesv1.RuntimeClass{typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED}
	}
	done := func(row *Row, began time.Time) {
		row.Duration = time.Since(began)
		row.settle()
		switch sum := summary(row); {
		case row.Detail == "" || row.Status != Pass:
			row.Detail = sum
		default:
			row.Detail += " (" + sum + ")"
		}
		r.progress("%s: %s (%s)", row.ID(), row.Status, row.Duration.Round(10*time.Millisecond))
		rep.Rows = append(rep.Rows, row)
	}
	for _, class := range classes {
		for _, name := range RowNames {
			if name == "restart" || (len(opts.Rows) > 0 && !contains(opts.Rows, name)) {
				continue
			}
			row := &Row{Name: name, Runtime: classWord(class)}
			r.progress("%s: running", row.ID())
			began := time.Now()
			r.row(ctx, row, class)
			done(row, began)
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
	}
	// The executor restarts once per run, whatever the classes: the
	// restart rows come last, together.
	if len(opts.Rows) == 0 || contains(opts.Rows, "restart") {
		r.progress("restart: running")
		began := time.Now()
		for _, row := range r.restartRows(ctx, classes) {
			done(row, began)
		}
	}
	rep.Duration = time.Since(rep.Started)
	return rep, ctx.Err()
}

// row runs the named row's checks into row.
func (r *runner) row(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	switch row.Name {
	case "exit-status":
		r.exitStatus(ctx, row, class)
	case "isolation":
		r.isolation(ctx, row, class)
	case "egress":
		r.egress(ctx, row, class)
	case "idempotency":
		r.idempotency(ctx, row, class)
	case "limits":
		r.limits(ctx, row, class)
	case "export":
		r.export(ctx, row, class)
	}
}

// summary is a row's detail: the failed checks, or how many passed and
// which were skipped (a row partly skipped is not fully green).
func summary(row *Row) string {
	var failed, skipped []string
	passed := 0
	for _, c := range row.Checks {
		switch c.Status {
		case Fail:
			failed = append(failed, c.Name+": "+c.Detail)
		case Pass:
			passed++
		case Skip:
			skipped = append(skipped, c.Name)
		}
	}
	switch {
	case len(failed) > 0:
		return strings.Join(failed, "; ")
	case passed == 0 && len(row.Checks) > 0:
		return row.Checks[0].Detail
	}
	s := fmt.Sprintf("%d checks passed", passed)
	if passed == 1 {
		s = "1 check passed"
	}
	if len(skipped) > 0 {
		s = fmt.Sprintf("%d passed, %d skipped: %s", passed, len(skipped), strings.Join(skipped, ", "))
	}
	return s
}

func (r *runner) progress(format string, args ...any) {
	if r.opts.Progress != nil {
		fmt.Fprintf(r.opts.Progress, "selftest: "+format+"\n", args...)
	}
}

// token is 12 random hex digits.
func token() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// classWord is a runtime class's word, "default" for none.
func classWord(c typesv1.RuntimeClass) string {
	if c == typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED {
		return "default"
	}
	return strings.ToLower(strings.TrimPrefix(c.String(), "RUNTIME_CLASS_"))
}

// key is the idempotency key of the row's job named what in this run.
func (r *runner) key(row *Row, what string) string {
	return "selftest-" + r.run + "-" + row.Runtime + "-" + row.Name + "-" + what
}

// spec is a job spec running argv as the selftest does: in class, on the
// repository and revision, marked with AIRLOCK_SELFTEST, with the
// tenant's defaults for everything else.
func (r *runner) spec(class typesv1.RuntimeClass, argv ...string) *authorityv1.JobSpec {
	return &authorityv1.JobSpec{
		Repository: r.opts.Repo, Revision: r.opts.Rev, Command: argv, RuntimeClass: class,
		Resources: &typesv1.ResourceLimits{}, Env: map[string]string{"AIRLOCK_SELFTEST": "selftest-" + r.run},
	}
}

// sh is argv running script with bash.
func sh(script string) []string { return []string{"bash", "-c", script} }

// submit submits spec under key and remembers the job for cleanup.
func (r *runner) submit(ctx context.Context, spec *authorityv1.JobSpec, key string) (*authorityv1.SubmitJobResponse, error) {
	resp, err := r.cl.Client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: r.opts.Tenant, Spec: spec, IdempotencyKey: key})
	if err != nil {
		return nil, err
	}
	r.remember(resp.GetJob().GetJobId())
	return resp, nil
}

func (r *runner) remember(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !contains(r.jobs, id) {
		r.jobs = append(r.jobs, id)
	}
}

// jobWait bounds how long one job of the selftest may take, queueing
// included.
const jobWait = 3 * time.Minute

// ran is a job that ended, with its standard output.
type ran struct {
	job    *authorityv1.Job
	stdout string
	err    error
}

// run submits spec under key, waits for it to end and returns it with
// its output.
func (r *runner) runJob(ctx context.Context, spec *authorityv1.JobSpec, key string) ran {
	resp, err := r.submit(ctx, spec, key)
	if err != nil {
		return ran{err: err}
	}
	return r.wait(ctx, resp.GetJob().GetJobId())
}

// runJobs runs specs at once, keyed by keys, and returns them in order.
func (r *runner) runJobs(ctx context.Context, specs []*authorityv1.JobSpec, keys []string) []ran {
	out := make([]ran, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = r.runJob(ctx, specs[i], keys[i])
		}()
	}
	wg.Wait()
	return out
}

// wait follows job id until it ends, gathering its standard output.
func (r *runner) wait(ctx context.Context, id string) ran {
	ctx, cancel := context.WithTimeout(ctx, jobWait)
	defer cancel()
	var out strings.Builder
	var last *authorityv1.Job
	for attempt := 0; ; attempt++ {
		stream, err := r.cl.Client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: id, StdoutOffset: int64(out.Len())})
		if err != nil {
			return ran{err: err}
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				if last != nil && terminal(last.GetState()) {
					return ran{job: last, stdout: out.String()}
				}
				if ctx.Err() != nil || attempt > 20 {
					return ran{job: last, stdout: out.String(), err: fmt.Errorf("job %s: %w", id, err)}
				}
				break
			}
			if j := msg.GetJob(); j != nil {
				last = j
			}
			if o := msg.GetOutput(); o != nil && o.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDOUT && o.GetOffset() == int64(out.Len()) {
				out.Write(o.GetData())
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func terminal(s authorityv1.JobState) bool {
	return s == authorityv1.JobState_JOB_STATE_FINISHED || s == authorityv1.JobState_JOB_STATE_FAILED || s == authorityv1.JobState_JOB_STATE_CANCELLED
}

// session creates a session on spec (its command empty) and remembers it.
func (r *runner) session(ctx context.Context, spec *authorityv1.JobSpec, key string) (*authorityv1.Job, error) {
	spec.Command = nil
	spec.Session = &typesv1.SessionSpec{}
	resp, err := r.cl.Client.CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: r.opts.Tenant, Spec: spec, IdempotencyKey: key})
	if err != nil {
		return nil, err
	}
	r.remember(resp.GetSession().GetJobId())
	return r.waitRunning(ctx, resp.GetSession().GetJobId())
}

// waitRunning waits for session id to run, and not be suspended: it takes
// execs then.
func (r *runner) waitRunning(ctx context.Context, id string) (*authorityv1.Job, error) {
	ctx, cancel := context.WithTimeout(ctx, jobWait)
	defer cancel()
	var sess *authorityv1.Job
	suspended := true
	for sess == nil || sess.GetState() != authorityv1.JobState_JOB_STATE_RUNNING || suspended {
		if sess != nil && terminal(sess.GetState()) {
			return nil, fmt.Errorf("session %s ended before it ran: %s", sess.GetJobId(), sess.GetMessage())
		}
		if sess != nil {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("session %s: still %s (suspended %v): %w", id, sess.GetState(), suspended, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
		got, err := r.cl.Client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: id})
		if err != nil {
			return nil, err
		}
		sess, suspended = got.GetSession(), got.GetSuspended()
	}
	return sess, nil
}

// execRun is one RunExec call's outcome.
type execRun struct {
	exec    *typesv1.Exec
	created bool
	stdout  string
}

// exec runs argv in session sid as exec id in one RunExec call and
// returns the exec once it ended, with its output.
func (r *runner) exec(ctx context.Context, sid, id string, argv ...string) (execRun, error) {
	ctx, cancel := context.WithTimeout(ctx, jobWait)
	defer cancel()
	stream, err := r.cl.Client.RunExec(ctx)
	if err != nil {
		return execRun{}, err
	}
	spec := &typesv1.ExecSpec{ExecId: id, Argv: argv, Env: map[string]string{"AIRLOCK_SELFTEST": "selftest-" + r.run}}
	if err := stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{SessionId: sid, Spec: spec}}}); err != nil {
		return execRun{}, err
	}
	if err := stream.CloseSend(); err != nil {
		return execRun{}, err
	}
	var res execRun
	var out strings.Builder
	for {
		msg, err := stream.Recv()
		if err != nil {
			return res, fmt.Errorf("exec %s: %w", id, err)
		}
		switch {
		case msg.GetStarted() != nil:
			res.created = msg.GetStarted().GetCreated()
		case msg.GetOutput() != nil:
			if o := msg.GetOutput(); o.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDOUT {
				out.Write(o.GetData())
			}
		case msg.GetExec() != nil:
			res.exec, res.stdout = msg.GetExec(), out.String()
			return res, nil
		}
	}
}

// cleanup ends whatever the run started that still runs, and denies any
// approval its jobs opened, so the run leaves nothing behind.
func (r *runner) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r.mu.Lock()
	ids := append([]string(nil), r.jobs...)
	r.mu.Unlock()
	// A submission whose answer was lost (or interrupted) is found by its
	// key: every job and session of the tenant still open whose
	// idempotency key is this run's.
	for _, id := range r.openByKey(ctx) {
		if !contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		got, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
		if err != nil {
			r.progress("cleanup: job %s: %v", id, err)
			continue
		}
		j := got.GetJob()
		if !terminal(j.GetState()) {
			reason := "airlock selftest " + r.run + " is done"
			if j.GetSession() != nil {
				_, err = r.cl.Client.CancelSession(ctx, &authorityv1.CancelSessionRequest{SessionId: id, Reason: reason})
			} else {
				_, err = r.cl.Client.CancelJob(ctx, &authorityv1.CancelJobRequest{JobId: id, Reason: reason})
			}
			if err != nil {
				r.progress("cleanup: cancel %s: %v", id, err)
			}
		}
		if a := j.GetApprovalId(); a != "" {
			r.deny(ctx, a)
		}
	}
}

// openByKey lists the tenant's jobs and sessions not yet ended whose
// idempotency key starts with this run's prefix.
func (r *runner) openByKey(ctx context.Context) []string {
	prefix := "selftest-" + r.run + "-"
	open := []authorityv1.JobState{authorityv1.JobState_JOB_STATE_QUEUED, authorityv1.JobState_JOB_STATE_STAGING, authorityv1.JobState_JOB_STATE_RUNNING}
	var ids []string
	pages := map[string]func(page string) ([]*authorityv1.Job, string, error){
		"jobs": func(page string) ([]*authorityv1.Job, string, error) {
			got, err := r.cl.Client.ListJobs(ctx, &authorityv1.ListJobsRequest{Tenant: r.opts.Tenant, States: open, PageToken: page, PageSize: 500})
			return got.GetJobs(), got.GetNextPageToken(), err
		},
		"sessions": func(page string) ([]*authorityv1.Job, string, error) {
			got, err := r.cl.Client.ListSessions(ctx, &authorityv1.ListSessionsRequest{Tenant: r.opts.Tenant, States: open, PageToken: page, PageSize: 500})
			return got.GetSessions(), got.GetNextPageToken(), err
		},
	}
	for what, list := range pages {
		for page := ""; ; {
			jobs, next, err := list(page)
			if err != nil {
				r.progress("cleanup: list %s: %v", what, err)
				break
			}
			for _, j := range jobs {
				if strings.HasPrefix(j.GetIdempotencyKey(), prefix) && !contains(ids, j.GetJobId()) {
					ids = append(ids, j.GetJobId())
				}
			}
			if page = next; page == "" {
				break
			}
		}
	}
	return ids
}

// deny denies approval id as the approver, when it is still pending.
func (r *runner) deny(ctx context.Context, id string) {
	if r.cl.Approver == nil {
		r.progress("cleanup: approval %s left pending: no approver identity (--approver)", id)
		return
	}
	got, err := r.cl.Approver.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: id})
	if err != nil || got.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING {
		return
	}
	a := got.GetApproval()
	if _, err := r.cl.Approver.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{
		ApprovalId: id, BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_DENY,
		Comment: "airlock selftest " + r.run + ": test material, never to be published",
	}); err != nil {
		r.progress("cleanup: deny approval %s: %v", id, err)
	}
}

// record adds a job that ran to row's record: the runtime and its
// version, the template or image (the first job's), its shape and policy
// digest, and the row's policy digest over all its jobs so far.
func record(row *Row, j *authorityv1.Job) {
	if j == nil || j.GetJobId() == "" {
		return
	}
	rec := &row.Record
	rec.Jobs = append(rec.Jobs, j.GetJobId())
	res := j.GetResult()
	if rec.RuntimeClass == "" && res.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED {
		rec.RuntimeClass = classWord(res.GetRuntimeClass())
		rec.RuntimeVersion = res.GetRuntimeVersion()
		rec.Template = res.GetTemplateVersion()
		if res.GetImage() != "" {
			rec.Template = res.GetImage()
		}
	}
	one := JobRecord{Job: j.GetJobId(), Shape: shape(j.GetLimits()), PolicyDigest: policyDigest(j)}
	rec.Each = append(rec.Each, one)
	if rec.Shape == "" {
		rec.Shape = one.Shape
	}
	h := sha256.New()
	for _, e := range rec.Each {
		h.Write([]byte(e.PolicyDigest + "\n"))
	}
	rec.PolicyDigest = "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// shape is limits as one line: "cpu 1, memory 512MiB, pids 256, disk
// 1GiB, deadline 10m0s".
func shape(l *typesv1.ResourceLimits) string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("cpu %g, memory %s, pids %d, disk %s, deadline %s",
		float64(l.GetCpuMillis())/1000, config.FormatByteSize(l.GetMemoryBytes()), l.GetPids(), config.FormatByteSize(l.GetDiskBytes()), l.GetDeadline().AsDuration())
}

// policyDigest is "sha256:" and the hex sha256 of the policy job j ran
// with as the authority returned it, canonically serialized: its
// effective limits, the network policy in force (or asked for, while
// none is yet), user, runtime class (the one it ran in, else the one
// asked for) and image grant.
func policyDigest(j *authorityv1.Job) string {
	np := j.GetNetworkPolicyStatus().GetPolicy()
	if np == nil {
		np = j.GetSpec().GetNetworkPolicy()
	}
	class := j.GetResult().GetRuntimeClass()
	if class == typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED {
		class = j.GetSpec().GetRuntimeClass()
	}
	p := &authorityv1.Job{
		Limits: j.GetLimits(), User: j.GetUser(), Image: j.GetImage(),
		NetworkPolicyStatus: &typesv1.NetworkPolicyStatus{Policy: np},
		Spec:                &authorityv1.JobSpec{RuntimeClass: class},
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
