package convert

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

var jobIDFormat = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Grant verifies sg's signature, format and expiry at now, and that it is
// for executor self, and converts it for the run manager. A bad
// signature, an unknown key or a grant for another executor (or none) is
// PermissionDenied, an expired grant FailedPrecondition, a job id or
// network policy the executor cannot take InvalidArgument.
func Grant(v *grant.Verifier, self identity.ID, sg *typesv1.SignedGrant, now time.Time) (runs.Grant, error) {
	g, err := v.Verify(sg, now)
	if err != nil {
		// The verifier's errors begin "grant: ".
		switch {
		case errors.Is(err, grant.ErrExpired):
			return runs.Grant{}, fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err)
		default:
			return runs.Grant{}, fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err)
		}
	}
	// A grant is for one executor: another one of the fleet that got it
	// (replayed, or sent where the authority no longer places the job)
	// must not run the job beside the one it was placed on.
	switch to := g.GetExecutor(); {
	case to == "":
		return runs.Grant{}, fmt.Errorf("%w: the grant names no executor; this is %s", errdefs.ErrPermissionDenied, self)
	case to != self.String():
		return runs.Grant{}, fmt.Errorf("%w: grant is for executor %s; this is %s", errdefs.ErrPermissionDenied, to, self)
	}
	if !jobIDFormat.MatchString(g.GetJobId()) {
		return runs.Grant{}, fmt.Errorf("%w: grant job_id %q: want 1-64 of [A-Za-z0-9_-]", errdefs.ErrInvalidArgument, g.GetJobId())
	}
	return grantOf(sg, g)
}

// DecodeGrant converts the signed grant of a run record written before
// records kept the run manager's Grant (runs.Config.DecodeGrant). The grant
// was verified when the run was accepted, and may have expired since.
func DecodeGrant(signed []byte) (runs.Grant, error) {
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(signed, sg); err != nil {
		return runs.Grant{}, err
	}
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return runs.Grant{}, err
	}
	return grantOf(sg, g)
}

// grantOf is g, the body of sg, for the run manager.
func grantOf(sg *typesv1.SignedGrant, g *typesv1.Grant) (runs.Grant, error) {
	policy, err := policyFromProto(g.GetNetworkPolicy())
	if err != nil {
		return runs.Grant{}, err
	}
	signed, err := proto.MarshalOptions{Deterministic: true}.Marshal(sg)
	if err != nil {
		return runs.Grant{}, err
	}
	fixed, err := fixedFields(g)
	if err != nil {
		return runs.Grant{}, err
	}
	if d := g.GetGitHistoryDepth(); d > stage.MaxHistoryDepth {
		return runs.Grant{}, fmt.Errorf("%w: grant git_history_depth %d: at most %d", errdefs.ErrInvalidArgument, d, stage.MaxHistoryDepth)
	}
	class, err := classOf(g.GetRuntimeClass())
	if err != nil {
		return runs.Grant{}, err
	}
	limits := limitsOf(g.GetLimits())
	docker, err := dockerOf(class, g.GetWith(), limits)
	if err != nil {
		return runs.Grant{}, err
	}
	out := runs.Grant{
		JobID: g.GetJobId(), Tenant: g.GetTenant(), Requester: g.GetRequester(),
		Repository: g.GetRepository(), Commit: g.GetCommit(), Command: g.GetCommand(), Env: g.GetEnv(),
		Class:             class,
		Limits:            limits,
		Docker:            docker,
		Network:           policy,
		NetworkGeneration: g.GetNetworkPolicyGeneration(),
		Generation:        g.GetGeneration(),
		HistoryDepth:      int(g.GetGitHistoryDepth()),
		WarmPool:          int(min(g.GetWarmPool(), runspec.MaxWarmPool)),
		Digest:            grant.Digest(sg),
		Fixed:             fixed,
		Signed:            signed,
	}
	if out.Credentials, err = credentialsOf(g.GetCredentials()); err != nil {
		return runs.Grant{}, err
	}
	if out.Caches, err = cachesOf(g.GetCaches()); err != nil {
		return runs.Grant{}, err
	}
	if out.User, err = userOf(g.GetUser(), out.Caches); err != nil {
		return runs.Grant{}, err
	}
	if out.Image, err = imageOf(g.GetImage()); err != nil {
		return runs.Grant{}, err
	}
	if s := g.GetSession(); s != nil {
		if d := s.GetIdleTimeout(); d != nil && (d.CheckValid() != nil || d.AsDuration() < 0) {
			return runs.Grant{}, fmt.Errorf("%w: grant session.idle_timeout: not a duration of zero or more", errdefs.ErrInvalidArgument)
		}
		out.Session = &runs.SessionSpec{IdleTimeout: s.GetIdleTimeout().AsDuration(), MaxConcurrentExecs: int(s.GetMaxConcurrentExecs())}
		switch s.GetOnIdle() {
		case typesv1.IdleAction_IDLE_ACTION_UNSPECIFIED, typesv1.IdleAction_IDLE_ACTION_END:
			// A grant from before on_idle ends its session, as it did.
		case typesv1.IdleAction_IDLE_ACTION_SLEEP:
			out.Session.SleepOnIdle = true
		default:
			return runs.Grant{}, fmt.Errorf("%w: grant session.on_idle %d: not an action this build knows", errdefs.ErrInvalidArgument, s.GetOnIdle())
		}
	}
	return out, nil
}

// maxCredentials is how many brokered credentials a job may name (the
// authority's bound on JobSpec.credentials).
const maxCredentials = 16

// credentialFormat is a brokered credential's name as the executor takes
// it: it becomes part of a variable's name and of a placeholder.
var credentialFormat = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// credentialsOf checks a grant's brokered credentials' names: at most
// maxCredentials, each once, each of credentialFormat.
func credentialsOf(names []string) ([]string, error) {
	if len(names) > maxCredentials {
		return nil, fmt.Errorf("%w: grant credentials: %d named, at most %d", errdefs.ErrInvalidArgument, len(names), maxCredentials)
	}
	for i, n := range names {
		if !credentialFormat.MatchString(n) {
			return nil, fmt.Errorf("%w: grant credentials[%d] %q: want 1-64 of [A-Za-z0-9_.-], beginning with a letter or digit", errdefs.ErrInvalidArgument, i, n)
		}
		if slices.Contains(names[:i], n) {
			return nil, fmt.Errorf("%w: grant credentials[%d] %q: named twice", errdefs.ErrInvalidArgument, i, n)
		}
	}
	return slices.Clone(names), nil
}

// imageOf checks a grant's image: a registry, a repository and a sha256
// manifest digest, each well formed (the store reads them from disk paths
// and the authority from its policy, but neither trusts them blindly).
func imageOf(i *typesv1.ImageGrant) (*runs.ImageRef, error) {
	if i == nil {
		return nil, nil
	}
	ref := &runs.ImageRef{Registry: i.GetRegistry(), Repository: i.GetRepository(), Digest: i.GetDigest()}
	switch {
	case !digest.Valid(ref.Digest):
		return nil, fmt.Errorf("%w: grant image.digest %q: not a sha256 digest", errdefs.ErrInvalidArgument, ref.Digest)
	case ref.Registry == "" || len(ref.Registry) > 255 || strings.ContainsAny(ref.Registry, "/@ \n"):
		return nil, fmt.Errorf("%w: grant image.registry %q: not a registry host", errdefs.ErrInvalidArgument, ref.Registry)
	case ref.Repository == "" || len(ref.Repository) > 255 || strings.ContainsAny(ref.Repository, "@: \n"):
		return nil, fmt.Errorf("%w: grant image.repository %q: not a repository path", errdefs.ErrInvalidArgument, ref.Repository)
	}
	return ref, nil
}

// changeable are the Grant fields a newer grant of a running job may
// change. Every other field, including any added later, must stay as it
// was: a grant cannot make a job run something else, somewhere else, for
// someone else.
var changeable = map[protoreflect.Name]bool{
	"limits":                    true,
	"network_policy":            true,
	"network_policy_generation": true,
	"generation":                true,
	"issued_at":                 true,
	"expires_at":                true,

	// A session's idle timeout and concurrent execs; a job cannot become
	// a session nor a session a job (runs checks).
	"session": true,
}

// fixedFields are g's fields but the changeable ones, each as the
// deterministic encoding of a grant holding it alone (so a set but empty
// message differs from an unset one), then its unknown fields.
func fixedFields(g *typesv1.Grant) ([]runs.Field, error) {
	m := g.ProtoReflect()
	fields := m.Descriptor().Fields()
	var out []runs.Field
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if changeable[fd.Name()] {
			continue
		}
		one := &typesv1.Grant{}
		if m.Has(fd) {
			one.ProtoReflect().Set(fd, m.Get(fd))
		}
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(one)
		if err != nil {
			return nil, err
		}
		out = append(out, runs.Field{Name: string(fd.Name()), Value: v})
	}
	return append(out, runs.Field{Name: "(unknown fields)", Value: m.GetUnknown()}), nil
}

// userOf checks who a grant says the job runs as (unset is root) as the
// authority did (pkg/runspec): ids every sandbox maps, and no cache in a
// home the user has not.
func userOf(u *typesv1.JobUser, caches []runs.CacheGrant) (runspec.User, error) {
	out := runspec.User{UID: u.GetUid(), GID: u.GetGid()}
	if err := runspec.CheckUser(out); err != nil {
		return runspec.User{}, fmt.Errorf("%w: grant user %v", errdefs.ErrInvalidArgument, err)
	}
	for i, c := range caches {
		if err := runspec.CheckCacheUser(c.Path, out); err != nil {
			return runspec.User{}, fmt.Errorf("%w: grant caches[%d].path %v", errdefs.ErrInvalidArgument, i, err)
		}
	}
	return out, nil
}

// cachesOf checks a grant's caches as the authority checked the tenant's
// policy (pkg/runspec): the executor trusts the signature, not the shape.
func cachesOf(in []*typesv1.CacheGrant) ([]runs.CacheGrant, error) {
	if len(in) > runspec.MaxCaches {
		return nil, fmt.Errorf("%w: grant caches: %d, at most %d", errdefs.ErrInvalidArgument, len(in), runspec.MaxCaches)
	}
	var out []runs.CacheGrant
	for i, c := range in {
		field := fmt.Sprintf("grant caches[%d]", i)
		if err := runspec.CheckCacheName(c.GetName()); err != nil {
			return nil, fmt.Errorf("%w: %s.name %v", errdefs.ErrInvalidArgument, field, err)
		}
		if err := runspec.CheckCachePath(c.GetPath()); err != nil {
			return nil, fmt.Errorf("%w: %s.path %v", errdefs.ErrInvalidArgument, field, err)
		}
		if r := runspec.CacheSizeReason(c.GetMaxSizeBytes()); r != "" {
			return nil, fmt.Errorf("%w: %s.max_size_bytes %s", errdefs.ErrInvalidArgument, field, r)
		}
		for j, o := range out {
			if o.Name == c.GetName() || runspec.CachePathsOverlap(o.Path, c.GetPath()) {
				return nil, fmt.Errorf("%w: %s: same name as, or a path overlapping, grant caches[%d]", errdefs.ErrInvalidArgument, field, j)
			}
		}
		out = append(out, runs.CacheGrant{Name: c.GetName(), Path: c.GetPath(), MaxSize: c.GetMaxSizeBytes()})
	}
	return out, nil
}

// classOf is a grant's runtime class for the sandbox (RuntimeClass the
// other way): unspecified, in a grant from before the field, is runc; a
// class this build does not know is refused rather than run as another.
func classOf(c typesv1.RuntimeClass) (sandbox.Class, error) {
	switch c {
	case typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED, typesv1.RuntimeClass_RUNTIME_CLASS_RUNC:
		return sandbox.ClassRunc, nil
	case typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC:
		return sandbox.ClassRunsc, nil
	case typesv1.RuntimeClass_RUNTIME_CLASS_VM:
		return sandbox.ClassVM, nil
	}
	return "", fmt.Errorf("%w: grant runtime_class %d: not a class this executor knows", errdefs.ErrInvalidArgument, c)
}

// dockerOf checks what a grant asks to run beside the job as the
// authority did (pkg/runspec) and says whether it asks for Docker.
func dockerOf(c sandbox.Class, with []string, l sandbox.Limits) (bool, error) {
	err := runspec.CheckWith(string(c), with, runspec.Limits{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids,
		DiskBytes: l.DiskBytes, Deadline: l.Deadline})
	var fe *runspec.FieldError
	switch {
	case errors.As(err, &fe) && strings.HasPrefix(fe.Field, "with"):
		return false, fmt.Errorf("%w: grant %s: %s", errdefs.ErrInvalidArgument, fe.Field, fe.Reason)
	case errors.As(err, &fe):
		return false, fmt.Errorf("%w: grant limits.%s: %s", errdefs.ErrInvalidArgument, fe.Field, fe.Reason)
	}
	return runspec.HasDocker(with), nil
}

func limitsOf(l *typesv1.ResourceLimits) sandbox.Limits {
	return sandbox.Limits{
		CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), Pids: l.GetPids(),
		DiskBytes: l.GetDiskBytes(), Deadline: l.GetDeadline().AsDuration(),
	}
}

// policyFromProto converts a grant's network policy, checking it as the
// authority does (package egress).
func policyFromProto(np *typesv1.NetworkPolicy) (runs.NetworkPolicy, error) {
	switch {
	case np.GetDenyAll() != nil:
		return runs.NetworkPolicy{}, nil
	case np.GetAllow() != nil:
		rules := np.GetAllow().GetRules()
		if len(rules) == 0 {
			return runs.NetworkPolicy{}, fmt.Errorf("%w: network_policy.allow.rules: need at least one rule", errdefs.ErrInvalidArgument)
		}
		var p netpolicy.Policy
		for i, r := range rules {
			pfx, err := egress.ParsePrefix(r.GetCidr())
			if err != nil {
				return runs.NetworkPolicy{}, fmt.Errorf("%w: network_policy.allow.rules[%d].cidr: %v", errdefs.ErrInvalidArgument, i, err)
			}
			ports, err := portsOf(fmt.Sprintf("network_policy.allow.rules[%d].ports", i), r.GetPorts())
			if err != nil {
				return runs.NetworkPolicy{}, err
			}
			p.Allow = append(p.Allow, netpolicy.Rule{Prefix: pfx, Ports: ports})
		}
		if err := p.Validate(); err != nil {
			return runs.NetworkPolicy{}, err
		}
		return runs.NetworkPolicy{Net: p}, nil
	case np.GetDomains() != nil:
		d := np.GetDomains()
		if len(d.GetDomains()) == 0 {
			return runs.NetworkPolicy{}, fmt.Errorf("%w: network_policy.domains.domains: need at least one name", errdefs.ErrInvalidArgument)
		}
		ports, err := portsOf("network_policy.domains.ports", d.GetPorts())
		if err != nil {
			return runs.NetworkPolicy{}, err
		}
		var names egress.Policy
		for _, n := range d.GetDomains() {
			names.Names = append(names.Names, egress.Name{Name: n, Ports: ports})
		}
		names, err = names.Normalize()
		if err != nil {
			return runs.NetworkPolicy{}, fmt.Errorf("%w: network_policy.domains: %v", errdefs.ErrInvalidArgument, err)
		}
		return runs.NetworkPolicy{Net: netpolicy.Policy{Proxied: true}, Names: names}, nil
	default:
		return runs.NetworkPolicy{}, fmt.Errorf("%w: network_policy: exactly one mode is required", errdefs.ErrInvalidArgument)
	}
}

func portsOf(field string, in []uint32) ([]uint16, error) {
	ports, err := egress.Ports(in)
	var pe *egress.PortError
	if errors.As(err, &pe) {
		return nil, fmt.Errorf("%w: %s[%d]: %v", errdefs.ErrInvalidArgument, field, pe.Index, err)
	}
	return ports, err
}

// signedGrant is r's signed grant.
func signedGrant(r runs.Run) (*typesv1.SignedGrant, error) {
	sg := &typesv1.SignedGrant{}
	return sg, proto.Unmarshal(r.SignedGrant, sg)
}
