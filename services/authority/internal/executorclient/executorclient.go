// Package executorclient is the authority's side of the executor boundary:
// it turns the jobs domain's decisions into signed airlock.types.v1.Grant
// messages (pkg/grant) and drives the executor's gRPC API with them (runs,
// and sessions' execs and files), translating messages and status codes
// both ways. It implements jobs.Signer and jobs.Executor; only the
// authority's composition root and its api package (for the conversions
// of shared messages) import it.
package executorclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/chunkio"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/runspec"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// Signer implements jobs.Signer with the authority's grant key.
type Signer struct {
	s *grant.Signer
}

// NewSigner wraps s.
func NewSigner(s *grant.Signer) *Signer { return &Signer{s: s} }

var _ jobs.Signer = (*Signer)(nil)

// Sign implements jobs.Signer.
func (s *Signer) Sign(r jobs.GrantRequest) (jobs.SignedGrant, error) {
	rc, err := RuntimeClassToProto(r.RuntimeClass)
	if err != nil {
		return jobs.SignedGrant{}, err
	}
	g := &typesv1.Grant{
		Version:                 grant.FormatVersion,
		JobId:                   r.JobID,
		Tenant:                  r.Tenant,
		Requester:               r.Requester,
		Repository:              r.Repository,
		Commit:                  r.Commit,
		Command:                 r.Command,
		Env:                     r.Env,
		Limits:                  LimitsToProto(r.Limits),
		NetworkPolicy:           NetworkToProto(r.Network),
		NetworkPolicyGeneration: r.NetworkGeneration,
		Generation:              r.Generation,
		RuntimeClass:            rc,
		GitHistoryDepth:         uint32(max(r.HistoryDepth, 0)),
		WarmPool:                uint32(max(r.WarmPool, 0)),
		Executor:                r.Executor,
		With:                    r.With,
		Credentials:             r.Credentials,
		IssuedAt:                timestamppb.New(r.IssuedAt),
		ExpiresAt:               timestamppb.New(r.ExpiresAt),
	}
	if p := r.PublishTarget; p != nil {
		g.PublishTarget = &typesv1.PublishTarget{Repository: p.Repository, Branch: p.Branch}
	}
	g.Session = SessionToProto(r.Session)
	for _, c := range r.Caches {
		g.Caches = append(g.Caches, &typesv1.CacheGrant{Name: c.Name, Path: c.Path, MaxSizeBytes: c.MaxSize})
	}
	g.User = &typesv1.JobUser{Uid: r.User.UID, Gid: r.User.GID}
	g.Image = ImageToProto(r.Image)
	sg, err := s.s.Sign(g)
	if err != nil {
		return jobs.SignedGrant{}, err
	}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(sg)
	if err != nil {
		return jobs.SignedGrant{}, fmt.Errorf("executorclient: marshal signed grant: %w", err)
	}
	return jobs.SignedGrant{Wire: wire, Digest: grant.Digest(sg)}, nil
}

// Decode implements jobs.Signer: it reads back a grant this authority
// signed and stored. It does not verify the signature; the store is the
// authority's own record.
func (s *Signer) Decode(wire []byte) (jobs.GrantRequest, error) {
	g, err := storedGrant(wire)
	if err != nil {
		return jobs.GrantRequest{}, err
	}
	limits, err := LimitsFromProto("grant.limits", g.GetLimits())
	if err != nil {
		return jobs.GrantRequest{}, fmt.Errorf("executorclient: stored grant: %w", err)
	}
	network, err := NetworkFromProto("grant.network_policy", g.GetNetworkPolicy())
	if err != nil {
		return jobs.GrantRequest{}, fmt.Errorf("executorclient: stored grant: %w", err)
	}
	rc, ok := RuntimeClassFromProto(g.GetRuntimeClass())
	if !ok {
		return jobs.GrantRequest{}, fmt.Errorf("executorclient: stored grant: runtime_class %d is not one this build knows", g.GetRuntimeClass())
	}
	r := jobs.GrantRequest{
		JobID: g.GetJobId(), Tenant: g.GetTenant(), Requester: g.GetRequester(), Repository: g.GetRepository(),
		Commit: g.GetCommit(), Command: g.GetCommand(), Env: g.GetEnv(),
		Limits: limits, Network: network,
		NetworkGeneration: g.GetNetworkPolicyGeneration(), Generation: max(g.GetGeneration(), 1),
		// A grant from before runtime classes is runc's.
		RuntimeClass: cmp.Or(rc, policy.RuntimeRunc), HistoryDepth: int(g.GetGitHistoryDepth()), Executor: g.GetExecutor(),
		WarmPool: int(g.GetWarmPool()),
		With:     g.GetWith(), Credentials: g.GetCredentials(),
		IssuedAt: g.GetIssuedAt().AsTime(), ExpiresAt: g.GetExpiresAt().AsTime(),
	}
	if p := g.GetPublishTarget(); p != nil {
		r.PublishTarget = &jobs.PublishTarget{Repository: p.GetRepository(), Branch: p.GetBranch()}
	}
	if x := g.GetSession(); x != nil {
		// A grant from before on_idle ended its session once idle.
		onIdle, _ := OnIdleFromProto(x.GetOnIdle())
		r.Session = &jobs.Session{IdleTimeout: x.GetIdleTimeout().AsDuration(), MaxConcurrentExecs: int(x.GetMaxConcurrentExecs()),
			OnIdle: cmp.Or(onIdle, policy.OnIdleEnd)}
	}
	for _, c := range g.GetCaches() {
		r.Caches = append(r.Caches, jobs.CacheGrant{Name: c.GetName(), Path: c.GetPath(), MaxSize: c.GetMaxSizeBytes()})
	}
	r.User = runspec.User{UID: g.GetUser().GetUid(), GID: g.GetUser().GetGid()}
	if x := g.GetImage(); x != nil {
		r.Image = &jobs.ImageGrant{Name: x.GetName(), Registry: x.GetRegistry(), Repository: x.GetRepository(),
			Digest: x.GetDigest(), MediaType: x.GetMediaType(), Size: x.GetSizeBytes()}
	}
	return r, nil
}

// LeaseGrant implements leases.Config.Grants: it reads from a grant this
// authority signed and stored the names of the brokered credentials it
// carries and the job's deadline.
func LeaseGrant(wire []byte) (leases.JobGrant, error) {
	g, err := storedGrant(wire)
	if err != nil {
		return leases.JobGrant{}, err
	}
	limits, err := LimitsFromProto("grant.limits", g.GetLimits())
	if err != nil {
		return leases.JobGrant{}, fmt.Errorf("executorclient: stored grant: %w", err)
	}
	return leases.JobGrant{Credentials: g.GetCredentials(), Deadline: limits.Deadline}, nil
}

// storedGrant is the grant body of a signed grant the authority stored
// (its signature unchecked: the store is the authority's own record).
func storedGrant(wire []byte) (*typesv1.Grant, error) {
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(wire, sg); err != nil {
		return nil, fmt.Errorf("executorclient: stored grant: %w", err)
	}
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return nil, fmt.Errorf("executorclient: stored grant body: %w", err)
	}
	return g, nil
}

// ImageToProto converts a granted image; nil (the host template) stays nil.
func ImageToProto(g *jobs.ImageGrant) *typesv1.ImageGrant {
	if g == nil {
		return nil
	}
	return &typesv1.ImageGrant{Name: g.Name, Registry: g.Registry, Repository: g.Repository, Digest: g.Digest, MediaType: g.MediaType, SizeBytes: g.Size}
}

// LimitsFromProto reads limits (zero fields stay zero); errors name
// fields under field and wrap errdefs.ErrInvalidArgument.
func LimitsFromProto(field string, r *typesv1.ResourceLimits) (policy.Limits, error) {
	l := policy.Limits{CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
	if d := r.GetDeadline(); d != nil {
		if err := d.CheckValid(); err != nil {
			return l, fmt.Errorf("%w: %s.deadline: %v", errdefs.ErrInvalidArgument, field, err)
		}
		l.Deadline = d.AsDuration()
	}
	return l, nil
}

// NetworkFromProto reads a network policy, which must name exactly one
// mode; errors name field and wrap errdefs.ErrInvalidArgument.
func NetworkFromProto(field string, np *typesv1.NetworkPolicy) (jobs.Network, error) {
	var n jobs.Network
	switch m := np.GetMode().(type) {
	case *typesv1.NetworkPolicy_DenyAll:
		n.Mode = jobs.NetworkDenyAll
	case *typesv1.NetworkPolicy_Allow:
		n.Mode = jobs.NetworkAllow
		for _, r := range m.Allow.GetRules() {
			n.Rules = append(n.Rules, jobs.AllowRule{CIDR: r.GetCidr(), Ports: r.GetPorts()})
		}
	case *typesv1.NetworkPolicy_Domains:
		n.Mode = jobs.NetworkDomains
		n.Domains, n.DomainPorts = m.Domains.GetDomains(), m.Domains.GetPorts()
	default:
		return n, fmt.Errorf("%w: %s: exactly one mode (deny_all, allow or domains) is required", errdefs.ErrInvalidArgument, field)
	}
	return n, nil
}

// RuntimeClassToProto maps a policy runtime class name to the enum.
func RuntimeClassToProto(name string) (typesv1.RuntimeClass, error) {
	switch name {
	case policy.RuntimeRunc:
		return typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, nil
	case policy.RuntimeRunsc:
		return typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC, nil
	case policy.RuntimeVM:
		return typesv1.RuntimeClass_RUNTIME_CLASS_VM, nil
	}
	return 0, fmt.Errorf("executorclient: unknown runtime class %q", name)
}

// RuntimeClassFromProto maps the enum to a policy runtime class name: ""
// for unspecified, and false for a value this build does not know.
func RuntimeClassFromProto(rc typesv1.RuntimeClass) (string, bool) {
	switch rc {
	case typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED:
		return "", true
	case typesv1.RuntimeClass_RUNTIME_CLASS_RUNC:
		return policy.RuntimeRunc, true
	case typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC:
		return policy.RuntimeRunsc, true
	case typesv1.RuntimeClass_RUNTIME_CLASS_VM:
		return policy.RuntimeVM, true
	}
	return "", false
}

// SessionToProto converts a session's settings; nil (a job) stays nil.
func SessionToProto(s *jobs.Session) *typesv1.SessionSpec {
	if s == nil {
		return nil
	}
	return &typesv1.SessionSpec{IdleTimeout: durationpb.New(s.IdleTimeout), MaxConcurrentExecs: int32(s.MaxConcurrentExecs), OnIdle: OnIdleToProto(s.OnIdle)}
}

// OnIdleToProto is the API's IdleAction for policy.OnIdleEnd or
// policy.OnIdleSleep ("" is unspecified).
func OnIdleToProto(a string) typesv1.IdleAction {
	switch a {
	case policy.OnIdleEnd:
		return typesv1.IdleAction_IDLE_ACTION_END
	case policy.OnIdleSleep:
		return typesv1.IdleAction_IDLE_ACTION_SLEEP
	}
	return typesv1.IdleAction_IDLE_ACTION_UNSPECIFIED
}

// OnIdleFromProto is OnIdleToProto the other way; false for a value this
// build does not know.
func OnIdleFromProto(a typesv1.IdleAction) (string, bool) {
	switch a {
	case typesv1.IdleAction_IDLE_ACTION_UNSPECIFIED:
		return "", true
	case typesv1.IdleAction_IDLE_ACTION_END:
		return policy.OnIdleEnd, true
	case typesv1.IdleAction_IDLE_ACTION_SLEEP:
		return policy.OnIdleSleep, true
	}
	return "", false
}

// LimitsToProto converts limits.
func LimitsToProto(l policy.Limits) *typesv1.ResourceLimits {
	return &typesv1.ResourceLimits{
		CpuMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids, DiskBytes: l.DiskBytes,
		Deadline: durationpb.New(l.Deadline),
	}
}

// NetworkToProto converts a network policy; unset becomes deny-all, which
// is what unset means.
func NetworkToProto(n jobs.Network) *typesv1.NetworkPolicy {
	switch n.Mode {
	case jobs.NetworkAllow:
		rules := make([]*typesv1.AllowRule, len(n.Rules))
		for i, r := range n.Rules {
			rules[i] = &typesv1.AllowRule{Cidr: r.CIDR, Ports: r.Ports}
		}
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: rules}}}
	case jobs.NetworkDomains:
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: n.Domains, Ports: n.DomainPorts}}}
	}
	return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}
}

// Client implements jobs.Executor over the executor's gRPC API.
type Client struct {
	c executorv1.ExecutorServiceClient
}

// New returns a Client on conn, which must pin the executor's identity
// (pkg/grpcclient.Dial does).
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{c: executorv1.NewExecutorServiceClient(conn)}
}

var _ jobs.Executor = (*Client)(nil)

// Start implements jobs.Executor.
func (c *Client) Start(ctx context.Context, wire []byte) (jobs.RunState, error) {
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(wire, sg); err != nil {
		return jobs.RunUnknown, fmt.Errorf("executorclient: stored grant: %w", err)
	}
	resp, err := c.c.StartJob(ctx, &executorv1.StartJobRequest{Grant: sg})
	if err != nil {
		return jobs.RunUnknown, fromStatus(err)
	}
	return runState(resp.GetRun().GetState()), nil
}

// Watch implements jobs.Executor.
func (c *Client) Watch(ctx context.Context, jobID string, from jobs.Offsets, fn func(jobs.RunEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.c.WatchRun(ctx, &executorv1.WatchRunRequest{JobId: jobID, StdoutOffset: from.Stdout, StderrOffset: from.Stderr,
		Egress: from.Egress, EgressOffset: from.EgressIndex})
	if err != nil {
		return fromStatus(err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fromStatus(err)
		}
		var ev jobs.RunEvent
		switch e := msg.GetEvent().(type) {
		case *executorv1.WatchRunResponse_Run:
			ev.State = runState(e.Run.GetState())
			ev.NetworkState = networkState(e.Run.GetNetworkPolicyStatus().GetState())
			ev.GrantGeneration = grantGeneration(e.Run.GetGrant())
		case *executorv1.WatchRunResponse_Output:
			ev.Output = outputFromProto(e.Output)
		case *executorv1.WatchRunResponse_Egress:
			index, r, err := egresspb.FromEvent("egress", e.Egress)
			if err != nil {
				return fmt.Errorf("executorclient: WatchRun of %s sent %w", jobID, err)
			}
			ev.Egress = &jobs.EgressEntry{Index: index, Record: r}
		default:
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// Cancel implements jobs.Executor.
func (c *Client) Cancel(ctx context.Context, jobID, reason string) error {
	_, err := c.c.CancelRun(ctx, &executorv1.CancelRunRequest{JobId: jobID, Reason: reason})
	return fromStatus(err)
}

// Update implements jobs.Executor.
func (c *Client) Update(ctx context.Context, wire []byte) error {
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(wire, sg); err != nil {
		return fmt.Errorf("executorclient: grant: %w", err)
	}
	_, err := c.c.UpdateRun(ctx, &executorv1.UpdateRunRequest{Grant: sg})
	return fromStatus(err)
}

// grantGeneration is the generation of a run's grant; 1 for a grant
// without one, 0 when it cannot be read.
func grantGeneration(sg *typesv1.SignedGrant) int64 {
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return 0
	}
	return max(g.GetGeneration(), 1)
}

func runState(s executorv1.RunState) jobs.RunState {
	switch s {
	case executorv1.RunState_RUN_STATE_STAGING:
		return jobs.RunStaging
	case executorv1.RunState_RUN_STATE_RUNNING:
		return jobs.RunRunning
	case executorv1.RunState_RUN_STATE_FINISHED:
		return jobs.RunFinished
	case executorv1.RunState_RUN_STATE_FAILED:
		return jobs.RunFailed
	case executorv1.RunState_RUN_STATE_CANCELLED:
		return jobs.RunCancelled
	}
	return jobs.RunUnknown
}

func networkState(s typesv1.NetworkPolicyState) string {
	switch s {
	case typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING:
		return "pending"
	case typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED:
		return "applied"
	case typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED:
		return "failed"
	}
	return ""
}

// fromStatus maps the executor's status: the authority queues a job the
// executor has no room for, so a full executor keeps its own sentinel.
func fromStatus(err error) error { return errgrpc.FromPeerKeepingCapacity("executor", err) }

// OpenArtifact implements approvals.Artifacts: the bundle of jobID named by
// digest, streamed from the executor. The executor refuses a digest that is
// not its bundle's; the caller still checks every byte (bundle.Stream).
func (c *Client) OpenArtifact(ctx context.Context, jobID, digest string) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.c.GetArtifact(ctx, &executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	if first.GetHeader() == nil {
		cancel()
		return nil, errors.New("executorclient: GetArtifact did not start with a header")
	}
	return newArtifactReader(stream, cancel), nil
}

// artifactReader reads a GetArtifact stream's chunks as one byte stream;
// Close ends the stream.
type artifactReader struct {
	*chunkio.Reader
	cancel context.CancelFunc
}

func newArtifactReader(stream grpc.ServerStreamingClient[executorv1.GetArtifactResponse], cancel context.CancelFunc) *artifactReader {
	return &artifactReader{cancel: cancel, Reader: chunkio.NewReader(func() ([]byte, error) {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, fromStatus(err)
		}
		if msg.GetHeader() != nil {
			return nil, errors.New("executorclient: GetArtifact sent a second header")
		}
		return msg.GetChunk(), nil
	})}
}

func (r *artifactReader) Close() error {
	r.cancel()
	return nil
}
