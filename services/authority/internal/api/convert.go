package api

import (
	"fmt"
	"github.com/airlockhq/airlock/pkg/identity"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

var stateToProto = map[store.State]authorityv1.JobState{
	store.StateQueued:    authorityv1.JobState_JOB_STATE_QUEUED,
	store.StateStaging:   authorityv1.JobState_JOB_STATE_STAGING,
	store.StateRunning:   authorityv1.JobState_JOB_STATE_RUNNING,
	store.StateFinished:  authorityv1.JobState_JOB_STATE_FINISHED,
	store.StateFailed:    authorityv1.JobState_JOB_STATE_FAILED,
	store.StateCancelled: authorityv1.JobState_JOB_STATE_CANCELLED,
}

var stateFromProto = func() map[authorityv1.JobState]store.State {
	m := map[authorityv1.JobState]store.State{}
	for k, v := range stateToProto {
		m[v] = k
	}
	return m
}()

var networkStateToProto = map[string]typesv1.NetworkPolicyState{
	"pending": typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING,
	"applied": typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED,
	"failed":  typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED,
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

// specFromProto reads what the domain checks out of a spec; anything it
// cannot read at all is an invalid argument naming the field.
func specFromProto(p *authorityv1.JobSpec) (jobs.Spec, error) {
	s := jobs.Spec{
		Repository:  p.GetRepository(),
		Revision:    p.GetRevision(),
		Command:     p.GetCommand(),
		Env:         p.GetEnv(),
		Caches:      p.GetCaches(),
		Image:       p.GetImage(),
		With:        p.GetWith(),
		Credentials: p.GetCredentials(),
	}
	if u := p.GetUser(); u != nil {
		s.User = &runspec.User{UID: u.GetUid(), GID: u.GetGid()}
	}
	if r := p.GetResources(); r != nil {
		s.Resources = policy.Limits{CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
		if d := r.GetDeadline(); d != nil {
			if err := d.CheckValid(); err != nil {
				return s, invalid("spec.resources.deadline", "%v", err)
			}
			s.Resources.Deadline = d.AsDuration()
		}
	}
	rc, ok := executorclient.RuntimeClassFromProto(p.GetRuntimeClass())
	if !ok {
		return s, invalid("spec.runtime_class", "%d is not a runtime class", p.GetRuntimeClass())
	}
	s.RuntimeClass = rc
	if np := p.GetNetworkPolicy(); np != nil {
		n, err := executorclient.NetworkFromProto("spec.network_policy", np)
		if err != nil {
			return s, err
		}
		s.Network = n
	}
	if t := p.GetPublishTarget(); t != nil {
		s.PublishTarget = &jobs.PublishTarget{Repository: t.GetRepository(), Branch: t.GetBranch()}
	}
	if x := p.GetSession(); x != nil {
		sess, err := sessionFromProto("spec.session", x)
		if err != nil {
			return s, err
		}
		s.Session = sess
	}
	return s, nil
}

// sessionFromProto reads a session spec; errors name fields under prefix.
func sessionFromProto(prefix string, x *typesv1.SessionSpec) (*jobs.Session, error) {
	s := &jobs.Session{MaxConcurrentExecs: int(x.GetMaxConcurrentExecs())}
	onIdle, ok := executorclient.OnIdleFromProto(x.GetOnIdle())
	if !ok {
		return nil, invalid(prefix+".on_idle", "%d: not an action this server knows (END or SLEEP)", x.GetOnIdle())
	}
	s.OnIdle = onIdle
	if d := x.GetIdleTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, invalid(prefix+".idle_timeout", "%v", err)
		}
		s.IdleTimeout = d.AsDuration()
	}
	return s, nil
}

// changeToProto is the API's view of a recorded change.
func changeToProto(c jobs.Change) *authorityv1.JobChange {
	return &authorityv1.JobChange{
		BaseGeneration: c.BaseGeneration,
		FromLimits:     executorclient.LimitsToProto(c.FromLimits), ToLimits: executorclient.LimitsToProto(c.ToLimits),
		FromNetworkPolicy: executorclient.NetworkToProto(c.FromNetwork), ToNetworkPolicy: executorclient.NetworkToProto(c.ToNetwork),
		Widens:      c.Widens,
		FromSession: executorclient.SessionToProto(c.FromSession), ToSession: executorclient.SessionToProto(c.ToSession),
	}
}

// jobToProto builds the API's view of a stored job.
func jobToProto(j store.Job) (*authorityv1.Job, error) {
	spec := &authorityv1.JobSpec{}
	if err := proto.Unmarshal(j.Spec, spec); err != nil {
		return nil, fmt.Errorf("api: stored spec of job %s: %w", j.ID, err)
	}
	out := &authorityv1.Job{
		JobId:          j.ID,
		Tenant:         j.Tenant,
		Requester:      j.Requester,
		Spec:           spec,
		Commit:         j.Commit,
		State:          stateToProto[j.State],
		IdempotencyKey: j.IdempotencyKey,
		CreatedAt:      timestamppb.New(j.CreatedAt),
		UpdatedAt:      timestamppb.New(j.UpdatedAt),
		Message:        j.Message,
	}
	if j.Executor != "" {
		if x, err := identity.Parse(j.Executor); err == nil {
			out.Executor = fleet.NameOf(x)
		}
	}
	if len(j.Result) > 0 {
		r := &typesv1.RunResult{}
		if err := proto.Unmarshal(j.Result, r); err != nil {
			return nil, fmt.Errorf("api: stored result of job %s: %w", j.ID, err)
		}
		out.Result = r
	}
	// The grant in force says what the job runs under: its limits, and its
	// network policy with that policy's generation. A job refused before it
	// was granted shows what it asked for (unset means deny-all).
	np, gen := spec.GetNetworkPolicy(), int64(1)
	if np == nil {
		np = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}
	}
	if len(j.Grant) > 0 {
		sg, g := &typesv1.SignedGrant{}, &typesv1.Grant{}
		if err := proto.Unmarshal(j.Grant, sg); err != nil {
			return nil, fmt.Errorf("api: stored grant of job %s: %w", j.ID, err)
		}
		if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
			return nil, fmt.Errorf("api: stored grant of job %s: %w", j.ID, err)
		}
		np, gen = g.GetNetworkPolicy(), g.GetNetworkPolicyGeneration()
		out.Limits, out.GrantGeneration, out.Session = g.GetLimits(), max(g.GetGeneration(), 1), g.GetSession()
		out.User = g.GetUser()
		out.Image = g.GetImage()
	}
	out.NetworkPolicyStatus = &typesv1.NetworkPolicyStatus{
		Policy: np, Generation: gen, State: networkStateToProto[j.NetworkState], UpdatedAt: timestamppb.New(j.UpdatedAt),
	}
	if j.NetworkState == "failed" {
		out.NetworkPolicyStatus.Message = j.Message
	}
	return out, nil
}

func outputToProto(o jobs.Output) *typesv1.OutputChunk {
	stream := typesv1.OutputStream_OUTPUT_STREAM_STDOUT
	if o.Stream == jobs.Stderr {
		stream = typesv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	return &typesv1.OutputChunk{Stream: stream, Offset: o.Offset, Data: o.Data, Truncated: o.Truncated}
}
