// Package convert owns the executor's one mapping between the run
// manager's types and the API's messages, used by both the server-side API
// adapter and the client of the authority: among them, a signed grant is
// verified and checked here and becomes a runs.Grant. Only those two and
// the composition root (which decodes old run records with it) import it.
package convert

import (
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/execspec"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

var reasons = map[string]typesv1.TerminationReason{
	"exited":                             typesv1.TerminationReason_TERMINATION_REASON_EXITED,
	"timeout":                            typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT,
	"oom":                                typesv1.TerminationReason_TERMINATION_REASON_OOM,
	"disk_full":                          typesv1.TerminationReason_TERMINATION_REASON_DISK_FULL,
	"cancelled":                          typesv1.TerminationReason_TERMINATION_REASON_CANCELLED,
	string(runs.ReasonExecutorRestarted): typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED,
	"sandbox_error":                      typesv1.TerminationReason_TERMINATION_REASON_SANDBOX_ERROR,
	string(runs.ReasonFinished):          typesv1.TerminationReason_TERMINATION_REASON_FINISHED,
	string(runs.ReasonIdleTimeout):       typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT,
	// The API has no reason of its own for it yet: the job never ran
	// because the executor could not put it together, and the result's
	// message names the credential.
	string(runs.ReasonCredentialUnavailable): typesv1.TerminationReason_TERMINATION_REASON_SANDBOX_ERROR,
}

// RuntimeClass is the API's name of a sandbox class (classOf the other
// way).
func RuntimeClass(c sandbox.Class) typesv1.RuntimeClass {
	switch c {
	case sandbox.ClassRunsc:
		return typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC
	case sandbox.ClassVM:
		return typesv1.RuntimeClass_RUNTIME_CLASS_VM
	}
	return typesv1.RuntimeClass_RUNTIME_CLASS_RUNC
}

// RunResult converts a run manager result to the API's.
func RunResult(r *runs.Result) *typesv1.RunResult {
	if r == nil {
		return nil
	}
	class := RuntimeClass(r.Class)
	return &typesv1.RunResult{
		Reason:   reasons[string(r.Reason)],
		ExitCode: int32(r.ExitCode),
		Usage: &typesv1.ResourceUsage{
			CpuTime:              durationpb.New(r.Usage.CPUTime),
			PeakMemoryBytes:      r.Usage.PeakMemoryBytes,
			WallTime:             durationpb.New(r.Usage.WallTime),
			DiskBytes:            r.Usage.DiskBytes,
			PeakPids:             r.Usage.PeakPids,
			AwakeTime:            durationpb.New(r.AwakeTime),
			AsleepTime:           durationpb.New(r.AsleepTime),
			NetworkSentBytes:     r.NetworkSentBytes,
			NetworkReceivedBytes: r.NetworkReceivedBytes,
		},
		RuntimeClass:    class,
		RuntimeVersion:  r.RuntimeVersion,
		TemplateVersion: r.TemplateVersion,
		Image:           r.Image,
		BundleDigest:    r.BundleDigest,
		BundleSize:      r.BundleSize,
		DiffStat:        &typesv1.DiffStat{FilesChanged: r.FilesChanged, Insertions: r.Insertions, Deletions: r.Deletions},
		Message:         r.Message,
		Caches:          cacheUses(r.Caches),
	}
}

func cacheUses(in []runs.CacheUse) []*typesv1.CacheUse {
	var out []*typesv1.CacheUse
	for _, u := range in {
		out = append(out, &typesv1.CacheUse{Name: u.Name, Path: u.Path, SizeBefore: u.SizeBefore, SizeAfter: u.SizeAfter,
			Committed: u.Committed, Evicted: u.Evicted, Message: u.Message})
	}
	return out
}

var states = map[runs.State]executorv1.RunState{
	runs.Staging:   executorv1.RunState_RUN_STATE_STAGING,
	runs.Running:   executorv1.RunState_RUN_STATE_RUNNING,
	runs.Finished:  executorv1.RunState_RUN_STATE_FINISHED,
	runs.Failed:    executorv1.RunState_RUN_STATE_FAILED,
	runs.Cancelled: executorv1.RunState_RUN_STATE_CANCELLED,
}

// Run converts a run record to the API's; a run not ended has its awake
// and asleep time until now.
func Run(r runs.Run) *executorv1.Run {
	out := &executorv1.Run{
		JobId:     r.JobID,
		State:     states[r.State],
		CreatedAt: timestamppb.New(r.CreatedAt),
		Result:    RunResult(r.Result),
		Suspended: r.Suspended,
	}
	if r.Suspended && r.SuspendReason != "" {
		out.SuspendReason = reasons[string(r.SuspendReason)]
	}
	if r.Suspended && !r.SuspendedAt.IsZero() {
		out.SuspendedAt = timestamppb.New(r.SuspendedAt)
	}
	if !r.State.Terminal() && !r.StartedAt.IsZero() {
		awake, asleep := r.Times(time.Now())
		out.Usage = &typesv1.ResourceUsage{WallTime: durationpb.New(awake + asleep), AwakeTime: durationpb.New(awake), AsleepTime: durationpb.New(asleep)}
	}
	if sg, err := signedGrant(r); err == nil {
		out.Grant = sg
	}
	out.NetworkPolicyStatus = NetworkPolicyStatus(r)
	if !r.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(r.StartedAt)
	}
	if !r.FinishedAt.IsZero() {
		out.FinishedAt = timestamppb.New(r.FinishedAt)
	}
	return out
}

// NetworkPolicyStatus is the status of the network policy of r's grant. A
// run's grant changes only once its policy is in force (runs.Manager.Update),
// so the grant's policy is the applied one, unless it never could be.
func NetworkPolicyStatus(r runs.Run) *typesv1.NetworkPolicyStatus {
	st := &typesv1.NetworkPolicyStatus{
		State:     typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED,
		UpdatedAt: timestamppb.New(r.CreatedAt),
	}
	sg, err := signedGrant(r)
	if err != nil {
		return st
	}
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return st
	}
	st.Policy, st.Generation = g.GetNetworkPolicy(), g.GetNetworkPolicyGeneration()
	if !r.NetworkUpdatedAt.IsZero() {
		st.UpdatedAt = timestamppb.New(r.NetworkUpdatedAt)
	}
	if r.NetworkFailure != "" {
		st.State, st.Message = typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED, r.NetworkFailure
	}
	return st
}

// ExecSpec converts a request's exec spec for the run manager.
func ExecSpec(x *typesv1.ExecSpec) runs.ExecSpec {
	return runs.ExecSpec{
		ID: x.GetExecId(), Argv: x.GetArgv(), Env: x.GetEnv(), Cwd: x.GetCwd(),
		Stdin: x.GetStdin(), Timeout: x.GetTimeout().AsDuration(), StdinStream: x.GetStdinStream(),
	}
}

// Exec converts an exec record for the wire.
func Exec(x runs.Exec) *typesv1.Exec {
	out := &typesv1.Exec{
		SessionId: x.SessionID,
		Spec: &typesv1.ExecSpec{
			ExecId: x.Spec.ID, Argv: x.Spec.Argv, Env: x.Spec.Env, Cwd: x.Spec.Cwd, StdinStream: x.Spec.StdinStream,
		},
		Seq:      x.Seq,
		State:    typesv1.ExecState_EXEC_STATE_RUNNING,
		ExitCode: int32(x.ExitCode), Message: x.Message,
		StartedAt:  timestamppb.New(x.StartedAt),
		StdoutSize: x.StdoutSize, StderrSize: x.StderrSize,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated,
		StdoutSha256: x.StdoutSHA256, StderrSha256: x.StderrSHA256,
		StdinSize: x.StdinSize, StdinSha256: x.StdinSHA256,
		StdoutTail: x.StdoutTail, StderrTail: x.StderrTail,
	}
	if x.Spec.Timeout > 0 {
		out.Spec.Timeout = durationpb.New(x.Spec.Timeout)
	}
	if x.State == runs.ExecEnded {
		out.State = typesv1.ExecState_EXEC_STATE_ENDED
		out.Reason = reasons[string(x.Reason)]
		out.EndedAt = timestamppb.New(x.EndedAt)
		out.Usage = &typesv1.ResourceUsage{WallTime: durationpb.New(x.WallTime), CpuTime: durationpb.New(x.CPUTime)}
	}
	return out
}

// ExecSpecCut is how much of an exec's argv and env a listing or a review
// carries (pkg/execspec's, as the authority's records keep).
const ExecSpecCut = execspec.CutBytes

// CutSpec cuts x's argv and env to about max bytes in all (whole
// arguments and variables, execspec.Cut; a cut argv ends with "…"),
// marking x as cut when anything was.
func CutSpec(x *typesv1.Exec, max int) {
	spec := x.GetSpec()
	if spec == nil {
		return
	}
	argv, env, cut := execspec.Cut(spec.GetArgv(), spec.GetEnv(), max)
	if len(argv) < len(spec.GetArgv()) {
		argv = append(argv, "…")
	}
	if len(spec.GetEnv()) > 0 {
		spec.Env = env
	}
	spec.Argv = argv
	if cut {
		x.SpecCut = true
	}
}

// ListedWrites is how many upload records a review or a session's listing
// carries: more are folded (runs.FoldWrites) into records that each count
// their uploads, so none is left out unsaid.
const ListedWrites = 500

// FileWrites converts a session's upload records, folded to at most max,
// and returns how many uploads they stand for in all. A path that is not
// valid UTF-8 has its bad bytes replaced (proto strings are UTF-8).
func FileWrites(ws []runs.FileWrite, max int) ([]*typesv1.FileWrite, int64) {
	var total int64
	for i := range ws {
		total += ws[i].Uploads()
	}
	folded, _ := runs.FoldWrites(ws, max)
	out := make([]*typesv1.FileWrite, 0, len(folded))
	for _, w := range folded {
		out = append(out, &typesv1.FileWrite{
			Path: strings.ToValidUTF8(w.Path, "\uFFFD"), Size: w.Size, Sha256: w.SHA256, WrittenAt: timestamppb.New(w.At), AfterExec: w.AfterExec,
			Count: w.Count, FirstAfterExec: w.FirstAfterExec,
		})
	}
	return out, total
}

// CacheInfos converts a tenant's caches for the API.
func CacheInfos(in []cache.Info) []*typesv1.CacheInfo {
	out := make([]*typesv1.CacheInfo, 0, len(in))
	for _, c := range in {
		out = append(out, &typesv1.CacheInfo{Repository: c.Repository, Name: c.Name, SizeBytes: c.Size, LastUsed: timestamppb.New(c.LastUsed)})
	}
	return out
}
