package api_test

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/authz"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/fakeexecutor"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

const digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
const digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

func exited(digest string) *typesv1.RunResult {
	return &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED, ExitCode: 0, BundleDigest: digest,
		RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, RuntimeVersion: "runc 1.2.3", BundleSize: 42}
}

// noFiles is the review detail of a result whose patch changes nothing,
// with "ok\n" on stdout.
func noFiles() *authorityv1.ReviewDetail {
	return &authorityv1.ReviewDetail{PatchSize: 19, Stdout: &authorityv1.OutputTail{Data: []byte("ok\n"), Size: 3}, Stderr: &authorityv1.OutputTail{}}
}

func TestSubmitDispatchesSignedGrant(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	s := spec()
	s.Resources = &typesv1.ResourceLimits{MemoryBytes: 1 << 30, Deadline: durationpb.New(20 * time.Minute)}
	s.PublishTarget = &typesv1.PublishTarget{Repository: "demo", Branch: "main"}
	resp := h.submit(dev, "k1", s)
	j := resp.GetJob()
	if !resp.GetCreated() || j.GetState() != authorityv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("submit: created=%v state=%v, want a new QUEUED job", resp.GetCreated(), j.GetState())
	}
	commit := h.origin.RevParse("main")
	if j.GetCommit() != commit || j.GetTenant() != "dev" || j.GetRequester() != devID.String() || j.GetIdempotencyKey() != "k1" {
		t.Fatalf("job = %v", j)
	}
	if !proto.Equal(j.GetSpec(), s) {
		t.Errorf("spec not kept as submitted: %v", j.GetSpec())
	}
	if np := j.GetNetworkPolicyStatus(); np.GetPolicy().GetDenyAll() == nil || np.GetGeneration() != 1 {
		t.Errorf("network policy status = %v, want deny_all generation 1", np)
	}

	eventually(t, "StartJob", func() bool { return len(h.fake.Grants(j.GetJobId())) > 0 })
	g := h.fake.Grants(j.GetJobId())[0]
	want := &typesv1.Grant{
		Version: 1, JobId: j.GetJobId(), Tenant: "dev", Requester: devID.String(), Repository: "demo", Commit: commit,
		Command: s.GetCommand(), Env: s.GetEnv(),
		Limits: &typesv1.ResourceLimits{
			CpuMillis: policy.DefaultLimits.CPUMillis, MemoryBytes: 1 << 30, Pids: policy.DefaultLimits.Pids,
			DiskBytes: policy.DefaultLimits.DiskBytes, Deadline: durationpb.New(20 * time.Minute),
		},
		NetworkPolicy:           &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		NetworkPolicyGeneration: 1,
		Generation:              1,
		RuntimeClass:            typesv1.RuntimeClass_RUNTIME_CLASS_RUNC,
		PublishTarget:           s.GetPublishTarget(),
		GitHistoryDepth:         1,
		User:                    &typesv1.JobUser{},  // root, dev's default, signed explicitly
		Executor:                executorID.String(), // the fleet's one executor, named in the grant
		IssuedAt:                g.GetIssuedAt(),
		ExpiresAt:               g.GetExpiresAt(),
	}
	if !proto.Equal(g, want) {
		t.Errorf("grant = %v\nwant    %v", g, want)
	}
	if ttl := g.GetExpiresAt().AsTime().Sub(g.GetIssuedAt().AsTime()); ttl != 10*time.Minute {
		t.Errorf("grant lives %v, want the grant TTL of 10m", ttl)
	}
	if d := time.Since(g.GetIssuedAt().AsTime()); d < 0 || d > time.Minute {
		t.Errorf("grant issued %v ago", d)
	}

	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)

	rep := &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Patch: []byte("diff --git a/x b/x\n"),
		Detail: noFiles(), Provenance: []byte(`{"payloadType":"application/vnd.in-toto+json"}`)}
	rr, err := executor.ReportResult(t.Context(), rep)
	if err != nil {
		t.Fatalf("ReportResult: %v", err)
	}
	if rr.GetJob().GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
		t.Fatalf("after ReportResult: %v", rr.GetJob().GetState())
	}
	got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FINISHED)
	if !proto.Equal(got.GetResult(), exited(digestA)) || got.GetMessage() != "exited with status 0" {
		t.Errorf("finished job: result %v, message %q", got.GetResult(), got.GetMessage())
	}
	if !got.GetUpdatedAt().AsTime().After(got.GetCreatedAt().AsTime()) {
		t.Errorf("updated_at %v not after created_at %v", got.GetUpdatedAt().AsTime(), got.GetCreatedAt().AsTime())
	}

	// The same report again is fine; a different one is not.
	if _, err := executor.ReportResult(t.Context(), rep); err != nil {
		t.Errorf("repeated identical report: %v", err)
	}
	rep2 := proto.Clone(rep).(*authorityv1.ReportResultRequest)
	rep2.Result = exited(digestB)
	_, err = executor.ReportResult(t.Context(), rep2)
	wantStatus(t, err, codes.FailedPrecondition, "already has a result")
	if len(h.fake.Rejections()) != 0 {
		t.Errorf("the executor rejected grants: %v", h.fake.Rejections())
	}
}

func TestIdempotency(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	first := h.submit(dev, "same", spec())
	again := h.submit(dev, "same", spec())
	if again.GetCreated() || again.GetJob().GetJobId() != first.GetJob().GetJobId() {
		t.Fatalf("same key: created=%v id=%s, want the first job %s", again.GetCreated(), again.GetJob().GetJobId(), first.GetJob().GetJobId())
	}
	id := first.GetJob().GetJobId()
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	h.submit(dev, "same", spec())
	time.Sleep(100 * time.Millisecond) // room for a wrong second dispatch
	if n := h.fake.Attempts(id); n != 1 {
		t.Errorf("StartJob called %d times for one job, want 1", n)
	}

	different := spec()
	different.Command = []string{"rm", "-rf", "/"}
	_, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: different, IdempotencyKey: "same"})
	wantStatus(t, err, codes.AlreadyExists, "idempotency_key", id)

	// Keys are per tenant.
	other := h.client(otherID)
	os := spec()
	os.Repository = "tools"
	resp, err := other.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "other", Spec: os, IdempotencyKey: "same"})
	if err != nil || !resp.GetCreated() {
		t.Fatalf("another tenant's same key: %v", err)
	}
}

func TestPolicyRefusals(t *testing.T) {
	h := newHarness(t)
	clients := map[string]authorityv1.AuthorityServiceClient{"dev": h.client(devID), "other": h.client(otherID)}
	with := func(edit func(s *authorityv1.JobSpec)) *authorityv1.JobSpec {
		s := spec()
		edit(s)
		return s
	}
	env := func(k, v string) *authorityv1.JobSpec {
		return with(func(s *authorityv1.JobSpec) { s.Env = map[string]string{"PLAIN": "x", k: v} })
	}
	allow := func(cidr string) *authorityv1.JobSpec {
		return with(func(s *authorityv1.JobSpec) {
			s.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{
				Rules: []*typesv1.AllowRule{{Cidr: cidr, Ports: []uint32{443}}}}}}
		})
	}
	const ghToken = "ghp_0123456789abcdefABCDEF0123456789abcd"
	for _, tc := range []struct {
		name      string
		caller    string
		tenant    string
		key       string
		spec      *authorityv1.JobSpec
		code      codes.Code
		want      []string
		forbidden string
	}{
		{name: "foreign tenant", caller: "other", spec: spec(), code: codes.PermissionDenied, want: []string{"tenant:", `"dev"`}},
		{name: "unknown tenant", tenant: "nope", spec: spec(), code: codes.PermissionDenied, want: []string{`tenant: client/dev does not act for tenant "nope"`}},
		{name: "no tenant", tenant: "-", spec: spec(), code: codes.InvalidArgument, want: []string{"tenant: required"}},
		{name: "no spec", code: codes.InvalidArgument, want: []string{"spec: required"}},
		{name: "no idempotency key", key: "-", spec: spec(), code: codes.InvalidArgument, want: []string{"idempotency_key: required"}},
		{name: "foreign repository", spec: with(func(s *authorityv1.JobSpec) { s.Repository = "tools" }), code: codes.PermissionDenied,
			want: []string{"spec.repository", `"tools" is not a repository of tenant "dev"`}},
		{name: "no revision", spec: with(func(s *authorityv1.JobSpec) { s.Revision = "" }), code: codes.InvalidArgument, want: []string{"spec.revision: required"}},
		{name: "unknown revision", spec: with(func(s *authorityv1.JobSpec) { s.Revision = "no-such-branch" }), code: codes.InvalidArgument,
			want: []string{"spec.revision", `"no-such-branch" does not name a commit`}},
		{name: "option-looking revision", spec: with(func(s *authorityv1.JobSpec) { s.Revision = "--upload-pack=touch /tmp/x" }),
			code: codes.InvalidArgument, want: []string{"spec.revision", "nothing starting with '-'"}},
		{name: "range revision", spec: with(func(s *authorityv1.JobSpec) { s.Revision = "main..feature" }), code: codes.InvalidArgument, want: []string{"spec.revision"}},
		{name: "empty command", spec: with(func(s *authorityv1.JobSpec) { s.Command = nil }), code: codes.InvalidArgument, want: []string{"spec.command"}},
		{name: "memory above ceiling", spec: with(func(s *authorityv1.JobSpec) { s.Resources = &typesv1.ResourceLimits{MemoryBytes: 3 << 30} }),
			code: codes.InvalidArgument, want: []string{"spec.resources.memory_bytes: 3221225472 (3GiB) is above the tenant's ceiling of 2147483648 (2GiB)"}},
		{name: "deadline above ceiling", spec: with(func(s *authorityv1.JobSpec) {
			s.Resources = &typesv1.ResourceLimits{Deadline: durationpb.New(2 * time.Hour)}
		}), code: codes.InvalidArgument, want: []string{"spec.resources.deadline: 2h0m0s is above the tenant's ceiling of 1h0m0s"}},
		// What the executor could not run is refused here, not later.
		{name: "memory the runtime cannot start in", spec: with(func(s *authorityv1.JobSpec) { s.Resources = &typesv1.ResourceLimits{MemoryBytes: 1} }),
			code: codes.InvalidArgument, want: []string{"spec.resources.memory_bytes: 1: must be at least 16777216 under runc"}},
		{name: "one pid", spec: with(func(s *authorityv1.JobSpec) { s.Resources = &typesv1.ResourceLimits{Pids: 1} }),
			code: codes.InvalidArgument, want: []string{"spec.resources.pids: 1: must be at least 8"}},
		{name: "one byte of disk", spec: with(func(s *authorityv1.JobSpec) { s.Resources = &typesv1.ResourceLimits{DiskBytes: 1} }),
			code: codes.InvalidArgument, want: []string{"spec.resources.disk_bytes: 1: must be at least"}},
		{name: "negative pids", spec: with(func(s *authorityv1.JobSpec) { s.Resources = &typesv1.ResourceLimits{Pids: -1} }),
			code: codes.InvalidArgument, want: []string{"spec.resources.pids: must not be negative"}},
		{name: "credential-looking env name", spec: env("GITHUB_TOKEN", "x"), code: codes.InvalidArgument, want: []string{"spec.env.GITHUB_TOKEN", "looks like a credential"}},
		{name: "password env name", spec: env("DB_PASS", "x"), code: codes.InvalidArgument, want: []string{"spec.env.DB_PASS"}},
		{name: "GitHub token value", spec: env("FOO", ghToken), code: codes.InvalidArgument, want: []string{"spec.env.FOO", "GitHub token"}, forbidden: ghToken},
		{name: "PEM value", spec: env("MATERIAL", "-----BEGIN OPENSSH PRIVATE KEY-----\nabc"), code: codes.InvalidArgument, want: []string{"spec.env.MATERIAL", "PEM"}},
		{name: "AWS key id value", spec: env("ID", "AKIAIOSFODNN7EXAMPLE"), code: codes.InvalidArgument, want: []string{"spec.env.ID", "AWS"}},
		{name: "Slack token value", spec: env("HOOK", "xoxb-123456789012-abcdefghij"), code: codes.InvalidArgument, want: []string{"spec.env.HOOK", "Slack"}},
		{name: "API key value", spec: env("MODEL", "sk-proj-abcdefghijklmnop1234"), code: codes.InvalidArgument, want: []string{"spec.env.MODEL"}},
		{name: "random base64 value", spec: env("BLOB", "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWpr"), code: codes.InvalidArgument, want: []string{"spec.env.BLOB", "random"}},
		{name: "URL with password", spec: env("REMOTE", "https://me:pa55word@git.example.com/x.git"), code: codes.InvalidArgument, want: []string{"spec.env.REMOTE"}, forbidden: "pa55word"},
		{name: "bad env name", spec: env("1X", "y"), code: codes.InvalidArgument, want: []string{"spec.env", `"1X" is not a variable name`}},
		{name: "disallowed runtime class", caller: "other", tenant: "other", spec: with(func(s *authorityv1.JobSpec) {
			s.Repository, s.RuntimeClass = "tools", typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC
		}), code: codes.PermissionDenied, want: []string{"spec.runtime_class", "runsc is not allowed"}},
		{name: "vm where the policy does not allow it", caller: "other", tenant: "other", spec: with(func(s *authorityv1.JobSpec) {
			s.Repository, s.RuntimeClass = "tools", typesv1.RuntimeClass_RUNTIME_CLASS_VM
		}), code: codes.PermissionDenied, want: []string{"spec.runtime_class", `vm is not allowed for tenant "other" (allowed: runc)`}},
		{name: "vm memory below a guest's", spec: with(func(s *authorityv1.JobSpec) {
			s.RuntimeClass, s.Resources = typesv1.RuntimeClass_RUNTIME_CLASS_VM, &typesv1.ResourceLimits{MemoryBytes: 128 << 20}
		}), code: codes.InvalidArgument, want: []string{"spec.resources.memory_bytes: 134217728: must be at least 268435456 under vm"}},
		{name: "docker under runc", spec: with(func(s *authorityv1.JobSpec) { s.With = []string{"docker"} }),
			code: codes.InvalidArgument, want: []string{"spec.with: docker runs only in the vm runtime class: its own kernel and cgroups"}},
		{name: "docker under runsc", spec: with(func(s *authorityv1.JobSpec) {
			s.RuntimeClass, s.With = typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC, []string{"docker"}
		}), code: codes.InvalidArgument, want: []string{"spec.with: docker runs only in the vm runtime class"}},
		{name: "docker below 1GiB", spec: with(func(s *authorityv1.JobSpec) {
			s.RuntimeClass, s.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker"} // dev's default is 512MiB
		}), code: codes.InvalidArgument, want: []string{"spec.resources.memory_bytes: 536870912: must be at least 1073741824 with docker"}},
		{name: "unknown with", spec: with(func(s *authorityv1.JobSpec) {
			s.RuntimeClass, s.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"podman"}
		}), code: codes.InvalidArgument, want: []string{"spec.with[0]", `"podman" is not "docker"`}},
		{name: "docker twice", spec: with(func(s *authorityv1.JobSpec) {
			s.RuntimeClass, s.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker", "docker"}
			s.Resources = &typesv1.ResourceLimits{MemoryBytes: 1 << 30}
		}), code: codes.InvalidArgument, want: []string{"spec.with[1]", "asked for twice"}},
		{name: "allow outside egress", spec: allow("192.168.0.0/16"), code: codes.PermissionDenied,
			want: []string{"spec.network_policy.allow.rules[0].cidr", "outside"}},
		{name: "allow wider than egress", spec: allow("10.0.0.0/7"), code: codes.PermissionDenied, want: []string{"spec.network_policy.allow.rules[0].cidr"}},
		{name: "bad cidr", spec: allow("10.0.0.0/99"), code: codes.InvalidArgument, want: []string{"spec.network_policy.allow.rules[0].cidr"}},
		{name: "domain outside egress", spec: with(func(s *authorityv1.JobSpec) {
			s.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: []string{"proxy.golang.org", "evil.example.org"}}}}
		}), code: codes.PermissionDenied, want: []string{"spec.network_policy.domains.domains[1]"}},
		{name: "empty network mode", spec: with(func(s *authorityv1.JobSpec) { s.NetworkPolicy = &typesv1.NetworkPolicy{} }),
			code: codes.InvalidArgument, want: []string{"spec.network_policy"}},
		{name: "publish to a foreign repository", spec: with(func(s *authorityv1.JobSpec) {
			s.PublishTarget = &typesv1.PublishTarget{Repository: "tools", Branch: "main"}
		}), code: codes.PermissionDenied, want: []string{"spec.publish_target.repository"}},
		{name: "publish without branch", spec: with(func(s *authorityv1.JobSpec) {
			s.PublishTarget = &typesv1.PublishTarget{Repository: "demo"}
		}), code: codes.InvalidArgument, want: []string{"spec.publish_target.branch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caller, tenant, key := tc.caller, tc.tenant, tc.key
			if caller == "" {
				caller = "dev"
			}
			switch tenant {
			case "":
				tenant = "dev"
			case "-":
				tenant = ""
			}
			switch key {
			case "":
				key = "key-" + tc.name
			case "-":
				key = ""
			}
			_, err := clients[caller].SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: tenant, Spec: tc.spec, IdempotencyKey: key})
			wantStatus(t, err, tc.code, tc.want...)
			if tc.forbidden != "" && strings.Contains(status.Convert(err).Message(), tc.forbidden) {
				t.Errorf("the refusal repeats the secret: %v", err)
			}
			if strings.HasPrefix(status.Convert(err).Message(), authz.DeniedPrefix) {
				t.Errorf("refused by the authorization table, not by policy: %v", err)
			}
		})
	}
	for name, c := range clients {
		resp, err := c.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: name})
		if err != nil || len(resp.GetJobs()) != 0 {
			t.Errorf("refused submissions were recorded for %s: %v %v", name, resp.GetJobs(), err)
		}
	}
	if strings.Contains(h.logs.String(), "ghp_0123456789") {
		t.Errorf("a credential-looking env value reached the log")
	}
}

func TestPlainEnvIsAccepted(t *testing.T) {
	h := newHarness(t)
	s := spec()
	s.Env = map[string]string{
		"GIT_AUTHOR_NAME": "Agent Smith", "PATH": "/usr/local/bin:/usr/bin:/bin", "BASE_SHA": strings.Repeat("0123456789abcdef", 4),
		"REQUEST_ID": "123e4567-e89b-12d3-a456-426614174000", "GOPROXY": "https://proxy.golang.org,direct", "BYPASS_CACHE": "1",
		"SENTENCE": "the quick brown fox jumps over the lazy dog", "CGO_ENABLED": "0",
	}
	resp := h.submit(h.client(devID), "plain", s)
	if !maps.Equal(resp.GetJob().GetSpec().GetEnv(), s.Env) {
		t.Fatalf("env = %v", resp.GetJob().GetSpec().GetEnv())
	}
}

func TestAllowAndDomainsPoliciesAreDispatched(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)

	for _, tc := range []struct {
		key string
		np  *typesv1.NetworkPolicy
	}{
		{"net-allow", &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: []*typesv1.AllowRule{{Cidr: "10.1.0.0/16", Ports: []uint32{443}}}}}}},
		{"net-domains", &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: []string{"proxy.golang.org", "api.example.com"}}}}},
	} {
		s := spec()
		s.NetworkPolicy = tc.np
		j := h.submit(dev, tc.key, s).GetJob()
		h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
		grants := h.fake.Grants(j.GetJobId())
		if len(grants) == 0 || !proto.Equal(grants[0].GetNetworkPolicy(), tc.np) || grants[0].GetGeneration() != 1 || grants[0].GetNetworkPolicyGeneration() != 1 {
			t.Fatalf("%s: dispatched grants = %v; want the policy at generation 1", tc.key, grants)
		}
		if !proto.Equal(j.GetSpec().GetNetworkPolicy(), tc.np) {
			t.Errorf("%s: the policy was not stored as asked: %v", tc.key, j.GetSpec().GetNetworkPolicy())
		}
	}
}

func TestExecutorRefusalFailsTheJob(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	s := spec()
	s.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC // allowed by policy; this executor lacks it
	j := h.submit(dev, "runsc", s).GetJob()
	got := h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FAILED)
	if !strings.Contains(got.GetMessage(), "runtime class runsc is not installed") {
		t.Errorf("message = %q, want the executor's reason", got.GetMessage())
	}
	time.Sleep(50 * time.Millisecond)
	if n := h.fake.Attempts(j.GetJobId()); n != 1 {
		t.Errorf("a refused job was retried: %d attempts", n)
	}
}

func readSource(t *testing.T, c authorityv1.AuthorityServiceClient, id string) (*authorityv1.SourceHeader, []byte, error) {
	t.Helper()
	stream, err := c.FetchSource(t.Context(), &authorityv1.FetchSourceRequest{JobId: id})
	if err != nil {
		return nil, nil, err
	}
	var header *authorityv1.SourceHeader
	var data bytes.Buffer
	for i := 0; ; i++ {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return header, data.Bytes(), nil
		}
		if err != nil {
			return header, data.Bytes(), err
		}
		switch p := msg.GetPart().(type) {
		case *authorityv1.FetchSourceResponse_Header:
			if i != 0 {
				t.Errorf("header as message %d", i)
			}
			header = p.Header
		case *authorityv1.FetchSourceResponse_Chunk:
			if i == 0 {
				t.Errorf("a chunk before the header")
			}
			if len(p.Chunk) > 256<<10 || len(p.Chunk) == 0 {
				t.Errorf("chunk of %d bytes", len(p.Chunk))
			}
			data.Write(p.Chunk)
		}
	}
}

func TestFetchSource(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	for _, repo := range []string{"demo", "mirrored"} {
		t.Run(repo, func(t *testing.T) {
			s := spec()
			s.Repository, s.Revision = repo, "feature"
			j := h.submit(dev, "src-"+repo, s).GetJob()
			h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
			header, data, err := readSource(t, executor, j.GetJobId())
			if err != nil {
				t.Fatalf("FetchSource: %v", err)
			}
			commit := h.origin.RevParse("feature")
			if header.GetCommit() != commit || header.GetTreeHash() != h.origin.RevParse(commit+"^{tree}") || header.GetFormat() != "tar" {
				t.Errorf("header = %v", header)
			}
			if want := h.origin.Run("archive", "--format=tar", commit); !bytes.Equal(data, []byte(want)) {
				t.Errorf("archive: %d bytes, want the %d bytes of git archive", len(data), len(want))
			}
			if len(data) <= 256<<10 {
				t.Errorf("the archive fits one chunk; chunking is not tested")
			}
			if bytes.Contains(data, []byte(secret)) {
				t.Errorf("the credential reached the source stream")
			}
		})
	}
	if strings.Contains(h.logs.String(), secret) {
		t.Errorf("the credential reached the log")
	}

	j := h.submit(dev, "src-denied", spec()).GetJob()
	_, _, err := readSource(t, dev, j.GetJobId())
	wantStatus(t, err, codes.PermissionDenied, authz.DeniedPrefix)

	_, _, err = readSource(t, executor, "no-such-job")
	wantStatus(t, err, codes.NotFound, "no-such-job")

	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	_, _, err = readSource(t, executor, j.GetJobId())
	wantStatus(t, err, codes.FailedPrecondition, "finished")
}

func TestReportResultChecks(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	j := h.submit(dev, "rr", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)

	_, err := dev.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Detail: noFiles()})
	wantStatus(t, err, codes.PermissionDenied, authz.DeniedPrefix)
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: "nope", Result: exited(digestA), Detail: noFiles()})
	wantStatus(t, err, codes.NotFound)
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId()})
	wantStatus(t, err, codes.InvalidArgument, "result: required")
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited("")})
	wantStatus(t, err, codes.InvalidArgument, "result.bundle_digest: required")
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited("md5:x")})
	wantStatus(t, err, codes.InvalidArgument, "result.bundle_digest")
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: &typesv1.RunResult{BundleDigest: digestA}})
	wantStatus(t, err, codes.InvalidArgument, "result.reason")

	// Review detail a reviewer would read as untrue is refused, the
	// field named; a bundle without any is refused too.
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA)})
	wantStatus(t, err, codes.InvalidArgument, "detail: required with a bundle")
	withStat := exited(digestA)
	withStat.DiffStat = &typesv1.DiffStat{FilesChanged: 2}
	file := func(path string, st authorityv1.FileStatus, share int64) *authorityv1.FileChange {
		return &authorityv1.FileChange{Path: path, Status: st, PatchBytes: share}
	}
	added := authorityv1.FileStatus_FILE_STATUS_ADDED
	for _, tc := range []struct {
		result *typesv1.RunResult
		patch  []byte
		detail *authorityv1.ReviewDetail
		field  string
	}{
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 1, Files: []*authorityv1.FileChange{file("a", added, 1), file("b", added, 1)}}, "detail.files_total"},
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 3}, "detail.files_total: 3, but result.diff_stat counts 2"},
		{withStat, []byte("0123456789"), &authorityv1.ReviewDetail{FilesTotal: 2, PatchSize: 5}, "detail.patch_size"},
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 2, Files: []*authorityv1.FileChange{file("", added, 1)}}, "detail.files[0]"},
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 2, Files: []*authorityv1.FileChange{file("a", added, 1), file("b", 0, 1)}}, "detail.files[1]"},
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 2, Files: []*authorityv1.FileChange{file("a", added, 0)}}, "detail.files[0]"},
		{withStat, nil, &authorityv1.ReviewDetail{FilesTotal: 2, Stdout: &authorityv1.OutputTail{Data: []byte("abc"), Size: 2}}, "detail.stdout.size"},
	} {
		_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: tc.result, Patch: tc.patch, Detail: tc.detail})
		wantStatus(t, err, codes.InvalidArgument, tc.field)
	}

	// A sandbox error needs no bundle and fails the job.
	sandbox := &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_SANDBOX_ERROR, ExitCode: -1, Message: "runc create: no cgroup"}
	resp, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: sandbox})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetJob(); got.GetState() != authorityv1.JobState_JOB_STATE_FAILED || !strings.Contains(got.GetMessage(), "runc create: no cgroup") {
		t.Errorf("after a sandbox error: %v %q", got.GetState(), got.GetMessage())
	}
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: sandbox}); err != nil {
		t.Errorf("the same sandbox error again: %v", err)
	}
	_, err = executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: exited(digestA), Detail: noFiles()})
	wantStatus(t, err, codes.FailedPrecondition)
}

// watch collects a WatchJob stream until it ends.
type watched struct {
	jobs   []*authorityv1.Job
	stdout bytes.Buffer
	stderr bytes.Buffer
	chunks []*typesv1.OutputChunk
	err    error
}

func watch(t *testing.T, c authorityv1.AuthorityServiceClient, req *authorityv1.WatchJobRequest) <-chan *watched {
	t.Helper()
	stream, err := c.WatchJob(t.Context(), req)
	if err != nil {
		t.Fatalf("WatchJob: %v", err)
	}
	out := make(chan *watched, 1)
	go func() {
		w := &watched{}
		defer func() { out <- w }()
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				w.err = err
				return
			}
			switch e := msg.GetEvent().(type) {
			case *authorityv1.WatchJobResponse_Job:
				w.jobs = append(w.jobs, e.Job)
			case *authorityv1.WatchJobResponse_Output:
				w.chunks = append(w.chunks, e.Output)
				if e.Output.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDERR {
					w.stderr.Write(e.Output.GetData())
				} else {
					w.stdout.Write(e.Output.GetData())
				}
			}
		}
	}()
	return out
}

func states(jobs []*authorityv1.Job) []authorityv1.JobState {
	var out []authorityv1.JobState
	for _, j := range jobs {
		out = append(out, j.GetState())
	}
	return out
}

func TestWatchJob(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	j := h.submit(dev, "watch", spec()).GetJob()
	id := j.GetJobId()
	done := watch(t, dev, &authorityv1.WatchJobRequest{JobId: id})

	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: id, Result: exited(digestA), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.fake.End(id, executorv1.RunState_RUN_STATE_FINISHED)

	var w *watched
	select {
	case w = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchJob did not end after the job finished and its output was drained")
	}
	if w.err != nil {
		t.Fatalf("WatchJob: %v", w.err)
	}
	got := states(w.jobs)
	if len(got) < 2 || got[len(got)-1] != authorityv1.JobState_JOB_STATE_FINISHED || !slices.Contains(got, authorityv1.JobState_JOB_STATE_RUNNING) {
		t.Errorf("watched states %v, want RUNNING then FINISHED last", got)
	}
	if !slices.IsSorted(got) {
		t.Errorf("watched states %v go backwards", got)
	}
	if w.stdout.String() != string(bytes.Join(fakeexecutor.Stdout, nil)) || w.stderr.String() != string(bytes.Join(fakeexecutor.Stderr, nil)) {
		t.Errorf("output stdout=%q stderr=%q", w.stdout.String(), w.stderr.String())
	}

	// A watcher that reconnects with offsets gets only the rest.
	w = <-watch(t, dev, &authorityv1.WatchJobRequest{JobId: id, StdoutOffset: 8, StderrOffset: 5})
	if w.err != nil {
		t.Fatalf("resumed WatchJob: %v", w.err)
	}
	if len(w.jobs) != 1 || w.jobs[0].GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
		t.Errorf("resumed watch jobs = %v, want the finished job once", states(w.jobs))
	}
	if w.stdout.String() != "rld\n" || w.stderr.Len() != 0 {
		t.Errorf("resumed output stdout=%q stderr=%q, want stdout from offset 8 only", w.stdout.String(), w.stderr.String())
	}
	if len(w.chunks) != 1 || w.chunks[0].GetOffset() != 8 {
		t.Errorf("resumed chunks = %v, want one at offset 8", w.chunks)
	}

	if !slices.ContainsFunc(h.fake.Watches(id), func(r *executorv1.WatchRunRequest) bool {
		return r.GetStdoutOffset() == 8 && r.GetStderrOffset() == 5
	}) {
		t.Errorf("the watcher's offsets were not passed to the executor: %v", h.fake.Watches(id))
	}

	stream, err := dev.WatchJob(t.Context(), &authorityv1.WatchJobRequest{JobId: id, StdoutOffset: -1})
	if err == nil {
		_, err = stream.Recv()
	}
	wantStatus(t, err, codes.InvalidArgument, "stdout_offset")
}

func TestWatchRefusedJobEndsAtOnce(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	s := spec()
	s.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC // allowed by policy; the fake executor refuses it
	j := h.submit(dev, "refused", s).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_FAILED)
	select {
	case w := <-watch(t, dev, &authorityv1.WatchJobRequest{JobId: j.GetJobId()}):
		if w.err != nil || len(w.jobs) != 1 || w.jobs[0].GetState() != authorityv1.JobState_JOB_STATE_FAILED {
			t.Fatalf("watch of a failed job: %v %v", states(w.jobs), w.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watching a job that never ran did not end")
	}
}

func TestCancelQueuedJob(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	h.fake.FailStarts(status.Error(codes.Unavailable, "executor is restarting"))
	j := h.submit(dev, "cancel-queued", spec()).GetJob()
	eventually(t, "a dispatch attempt", func() bool { return h.fake.Attempts(j.GetJobId()) > 0 })

	resp, err := dev.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: j.GetJobId(), Reason: "changed my mind"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetJob(); got.GetState() != authorityv1.JobState_JOB_STATE_CANCELLED || got.GetMessage() != "cancelled by client/dev: changed my mind" {
		t.Fatalf("cancel: %v %q", got.GetState(), got.GetMessage())
	}
	// One StartJob may already be past the authority's last read of the
	// job as the cancel lands (CI caught it): the executor, told of the
	// cancel first, refuses it. No run may start, and the attempts stop.
	h.fake.FailStarts(nil)
	time.Sleep(200 * time.Millisecond) // many retry periods
	attempts := h.fake.Attempts(j.GetJobId())
	time.Sleep(200 * time.Millisecond)
	if h.fake.HasRun(j.GetJobId()) || h.fake.Attempts(j.GetJobId()) != attempts {
		t.Fatalf("a cancelled job was dispatched after all")
	}
	if again, err := dev.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: j.GetJobId()}); err != nil || again.GetJob().GetState() != authorityv1.JobState_JOB_STATE_CANCELLED {
		t.Errorf("cancelling twice: %v", err)
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_CANCELLED)
}

func TestCancelRunningJob(t *testing.T) {
	h := newHarness(t)
	dev, executor := h.client(devID), h.client(executorID)
	j := h.submit(dev, "cancel-running", spec()).GetJob()
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	resp, err := dev.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: j.GetJobId(), Reason: "too slow"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetJob().GetState() != authorityv1.JobState_JOB_STATE_RUNNING || !strings.Contains(resp.GetJob().GetMessage(), "cancel requested") {
		t.Errorf("after cancel: %v %q; the state must wait for the executor's result", resp.GetJob().GetState(), resp.GetJob().GetMessage())
	}
	if !slices.Contains(h.fake.Cancels(), j.GetJobId()) {
		t.Fatalf("the executor was not asked to cancel: %v", h.fake.Cancels())
	}
	cancelled := &typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_CANCELLED, ExitCode: -1, BundleDigest: digestA,
		Message: "every process of the job was killed"}
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j.GetJobId(), Result: cancelled, Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, j.GetJobId(), authorityv1.JobState_JOB_STATE_CANCELLED)
	// Who cancelled it and what the executor did, each said once.
	if got, _ := dev.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: j.GetJobId()}); got.GetJob().GetMessage() != "cancelled by client/dev: too slow; every process of the job was killed" {
		t.Errorf("the cancelled job's message: %q", got.GetJob().GetMessage())
	}
	_, err = dev.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: j.GetJobId()})
	if err != nil {
		t.Errorf("cancelling a cancelled job: %v", err)
	}
	j2 := h.submit(dev, "finished", spec()).GetJob()
	h.waitState(dev, j2.GetJobId(), authorityv1.JobState_JOB_STATE_RUNNING)
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: j2.GetJobId(), Result: exited(digestB), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	_, err = dev.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: j2.GetJobId()})
	wantStatus(t, err, codes.FailedPrecondition, "already ended")
}

func TestOtherTenantSeesNothing(t *testing.T) {
	h := newHarness(t)
	dev, other := h.client(devID), h.client(otherID)
	j := h.submit(dev, "private", spec()).GetJob()
	id := j.GetJobId()

	_, err := other.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: id})
	wantStatus(t, err, codes.NotFound, id)
	_, err = other.CancelJob(t.Context(), &authorityv1.CancelJobRequest{JobId: id})
	wantStatus(t, err, codes.NotFound, id)
	stream, err := other.WatchJob(t.Context(), &authorityv1.WatchJobRequest{JobId: id})
	if err == nil {
		_, err = stream.Recv()
	}
	wantStatus(t, err, codes.NotFound, id)
	_, err = other.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "dev"})
	wantStatus(t, err, codes.PermissionDenied, "tenant")
	// An unknown id answers exactly like a foreign one.
	_, errForeign := other.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: id})
	_, errUnknown := other.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: "zzzz"})
	if strings.ReplaceAll(status.Convert(errUnknown).Message(), "zzzz", id) != status.Convert(errForeign).Message() {
		t.Errorf("unknown and foreign job ids answer differently: %v / %v", errForeign, errUnknown)
	}

	list, err := other.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "other"})
	if err != nil || len(list.GetJobs()) != 0 {
		t.Errorf("other's own list: %v %v", list, err)
	}
	mine, err := dev.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "dev"})
	if err != nil || len(mine.GetJobs()) != 1 || mine.GetJobs()[0].GetJobId() != id {
		t.Errorf("dev's list: %v %v", mine, err)
	}
	if got, _ := h.client(devID).GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: id}); got.GetJob().GetState() == authorityv1.JobState_JOB_STATE_CANCELLED {
		t.Errorf("another tenant's cancel took effect")
	}
}

func TestListJobs(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	var ids []string
	for i := range 5 {
		s := spec()
		if i%2 == 1 {
			s.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC // the fake executor refuses it
		}
		ids = append(ids, h.submit(dev, "list-"+string(rune('a'+i)), s).GetJob().GetJobId())
		if i%2 == 1 {
			h.waitState(dev, ids[i], authorityv1.JobState_JOB_STATE_FAILED)
		}
	}
	var seen []string
	token := ""
	for range 10 {
		resp, err := dev.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "dev", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range resp.GetJobs() {
			seen = append(seen, j.GetJobId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	slices.Reverse(ids)
	if !slices.Equal(seen, ids) {
		t.Errorf("listed %v, want newest first %v", seen, ids)
	}
	failed, err := dev.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "dev", States: []authorityv1.JobState{authorityv1.JobState_JOB_STATE_FAILED}})
	if err != nil || len(failed.GetJobs()) != 2 {
		t.Errorf("failed jobs: %v %v", failed, err)
	}
	_, err = dev.ListJobs(t.Context(), &authorityv1.ListJobsRequest{Tenant: "dev", PageToken: "bogus!"})
	wantStatus(t, err, codes.InvalidArgument, "page_token")
}

func TestRestartRedispatchesQueuedJobs(t *testing.T) {
	h := newHarness(t)
	dev := h.client(devID)
	h.fake.FailStarts(status.Error(codes.Unavailable, "executor is down"))
	j := h.submit(dev, "survivor", spec()).GetJob()
	id := j.GetJobId()
	eventually(t, "a dispatch attempt", func() bool { return h.fake.Attempts(id) > 0 })

	h.auth.stop()
	h.fake.FailStarts(nil)
	time.Sleep(50 * time.Millisecond)
	if h.fake.HasRun(id) {
		t.Fatal("the job was dispatched while the authority was stopped")
	}
	h.start()
	dev = h.client(devID)
	got, err := dev.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("the job did not survive the restart: %v", err)
	}
	if got.GetJob().GetCommit() != j.GetCommit() || !proto.Equal(got.GetJob().GetSpec(), j.GetSpec()) {
		t.Errorf("the job changed across the restart: %v", got.GetJob())
	}
	eventually(t, "the restarted authority to dispatch the queued job", func() bool { return h.fake.HasRun(id) })
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_RUNNING)
	if g := h.fake.Grants(id); len(g) != 1 || g[0].GetJobId() != id {
		t.Errorf("grants after restart = %v", g)
	}
	// The idempotency key still maps to the job.
	if again := h.submit(dev, "survivor", spec()); again.GetCreated() || again.GetJob().GetJobId() != id {
		t.Errorf("idempotency key forgotten across the restart")
	}

	// A running job is followed again after a restart, and its result lands.
	h.restart()
	dev, executor := h.client(devID), h.client(executorID)
	if _, err := executor.ReportResult(t.Context(), &authorityv1.ReportResultRequest{JobId: id, Result: exited(digestA), Detail: noFiles()}); err != nil {
		t.Fatal(err)
	}
	h.waitState(dev, id, authorityv1.JobState_JOB_STATE_FINISHED)
}
