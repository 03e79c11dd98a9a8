package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/execspec"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The authority keeps its own durable record of every exec asked of a
// session, beside the executor's: written when the exec is asked, in the
// same transaction as its audit entry and before it reaches the executor,
// and brought up to date with what the executor says of it (StartExec,
// GetExec, WatchExec, CancelExec and listing answers, and the session's
// final report). So a retry under a used exec id is checked here even
// with the executor down, and the authority can say what ran when the
// executor cannot.

// ExecSpec is one exec as the authority records it: stdin by its size and
// SHA-256 (hex) only.
type ExecSpec struct {
	ID          string
	Argv        []string
	Env         map[string]string
	Cwd         string
	Timeout     time.Duration
	StdinSize   int64
	StdinSHA256 string
	// StdinStream says stdin comes as a stream (RunExec): its size and
	// digest are known only once it closes, so the spec's stdin is the
	// stream itself, not its bytes.
	StdinStream bool
}

// ExecSeen is an exec as the executor last reported it.
type ExecSeen struct {
	Spec ExecSpec
	// SpecCut is set when the report cut argv or env short (a listing or
	// a review): its spec then says nothing of the whole.
	SpecCut  bool
	Seq      int64
	Ended    bool
	Reason   string
	ExitCode int32
	Message  string

	StartedAt, EndedAt               time.Time
	StdoutSize, StderrSize           int64
	StdoutTruncated, StderrTruncated bool
	StdoutSHA256, StderrSHA256       string

	// What the executor reports beyond what the record keeps.
	SessionID              string
	Usage                  *Usage
	StdoutTail, StderrTail []byte
}

// Upload is one record of the files a session's client uploaded, as the
// executor keeps them: uploads of one path may be folded into one record
// that counts them (Count), the others' fields then the last one's.
type Upload struct {
	Path   string
	Size   int64
	SHA256 string
	At     time.Time
	// AfterExec is how many execs had started before the (last) upload,
	// FirstAfterExec before the first of Count.
	AfterExec, Count, FirstAfterExec int64
}

// ExecList is what the executor lists of a session: its last execs (argv
// and env cut, no output tails) and how many it has run, and its client's
// uploads (at most 500 records) and how many there were.
type ExecList struct {
	Execs        []ExecSeen
	Total        int64
	Uploads      []Upload
	UploadsTotal int64
}

// execSummaryBytes bounds the argv and env an exec's record keeps.
const execSummaryBytes = execspec.CutBytes

// execSummary is what an exec's record keeps of its spec (store.Exec's
// Summary): argv and env cut (execspec.Cut), and a digest of each field,
// so a different retry is named by the field that differs.
type execSummary struct {
	Argv        []string          `json:"argv"`
	Env         map[string]string `json:"env,omitempty"`
	Cwd         string            `json:"cwd,omitempty"`
	Timeout     time.Duration     `json:"timeout,omitempty"`
	StdinSize   int64             `json:"stdin_size"`
	StdinSHA256 string            `json:"stdin_sha256"`
	// StdinStream: stdin was streamed; its size and digest are known once
	// the executor reports them.
	StdinStream bool `json:"stdin_stream,omitempty"`
	// Cut is set when Argv or Env were cut short.
	Cut bool `json:"cut,omitempty"`
	// Fields maps each field (execspec.Digests) to a digest of it.
	Fields map[string]string `json:"fields,omitempty"`
}

// rule is x as the shared exec rules (pkg/execspec) read it.
func (x ExecSpec) rule() execspec.Spec {
	return execspec.Spec{Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, Timeout: x.Timeout, StdinStream: x.StdinStream, StdinSize: x.StdinSize, StdinSHA256: x.StdinSHA256}
}

// summarize is x's record summary and digest.
func (x ExecSpec) summarize() ([]byte, string) {
	fields, digest := x.rule().Digests()
	sm := execSummary{Cwd: x.Cwd, Timeout: x.Timeout, StdinSize: x.StdinSize, StdinSHA256: x.StdinSHA256, StdinStream: x.StdinStream, Fields: fields}
	var cut bool
	sm.Argv, sm.Env, cut = execspec.Cut(x.Argv, x.Env, execSummaryBytes)
	if len(sm.Cwd) > 1024 {
		sm.Cwd, cut = strings.ToValidUTF8(sm.Cwd[:1024], ""), true
	}
	sm.Cut = cut
	b, _ := json.Marshal(sm) // plain values: never fails
	return b, digest
}

// ExecRecordSpec returns what exec record x keeps of its spec, and
// whether that is short of the whole: argv or env cut, or learnt from a
// report that had cut them. A record whose summary cannot be read gives an
// empty spec, cut.
func ExecRecordSpec(x store.Exec) (ExecSpec, bool) {
	var sm execSummary
	if err := json.Unmarshal(x.Summary, &sm); err != nil {
		return ExecSpec{ID: x.ExecID}, true
	}
	return ExecSpec{ID: x.ExecID, Argv: sm.Argv, Env: sm.Env, Cwd: sm.Cwd, Timeout: sm.Timeout,
		StdinSize: sm.StdinSize, StdinSHA256: sm.StdinSHA256, StdinStream: sm.StdinStream}, sm.Cut || x.SpecDigest == ""
}

// differingField names the field in which spec differs from the one
// record x was asked with ("spec.argv", ...; execspec.Differs), or "spec"
// when x does not say.
func differingField(x store.Exec, spec ExecSpec) string {
	var sm execSummary
	if err := json.Unmarshal(x.Summary, &sm); err != nil {
		return "spec"
	}
	return cmp.Or(execspec.Differs(sm.Fields, spec.rule()), "spec")
}

// RequestExec records that caller asked session j for the exec spec with
// stdin, with its audit entry, before it may reach the executor: a
// request that cannot be recorded is refused. The first request of an id
// creates the record (created true); a retry with the same spec finds it
// and is audited again; a retry with another spec is ErrAlreadyExists
// naming the field that differs, whether or not the executor could be
// reached. (Whether the exec runs is the executor's to decide: it runs
// each id once.)
func (s *Service) RequestExec(ctx context.Context, caller identity.ID, j store.Job, spec ExecSpec, stdin []byte) (store.Exec, bool, error) {
	if !runspec.ValidExecID(spec.ID) {
		return store.Exec{}, false, invalid("spec.exec_id", "%q: want 1 to 128 of [A-Za-z0-9._:-]", spec.ID)
	}
	if !spec.StdinStream {
		sum := sha256.Sum256(stdin)
		spec.StdinSize, spec.StdinSHA256 = int64(len(stdin)), hex.EncodeToString(sum[:])
	}
	summary, digest := spec.summarize()
	now := s.now()
	rec := store.Exec{
		SessionID: j.ID, ExecID: spec.ID, SpecDigest: digest, Summary: summary, State: store.ExecRequested, ExitCode: -1,
		RequestedBy: caller.String(), RequestedAt: now, UpdatedAt: now,
	}
	reason := fmt.Sprintf("exec %q requested: argv %q", spec.ID, spec.Argv)
	if len(reason) > 2048 {
		reason = strings.ToValidUTF8(reason[:2048], "") + "…"
	}
	event := audit.Event{Kind: audit.KindExecRequested, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID, Time: now,
		Outcome: audit.OutcomeAllowed, Reason: reason}
	x, created, err := s.cfg.Store.CreateExecAudited(ctx, rec, func(existing *store.Exec) (audit.Event, error) {
		if existing != nil && existing.SpecDigest != "" && existing.SpecDigest != digest {
			return audit.Event{}, fmt.Errorf("%w: spec.exec_id %q: an exec of this id was requested with a different %s",
				errdefs.ErrAlreadyExists, spec.ID, differingField(*existing, spec))
		}
		if existing != nil {
			event.Reason = "retry: " + event.Reason
		}
		return event, nil
	})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		if aerr := s.auditRefusal(ctx, audit.Event{Kind: audit.KindExecRequested, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID,
			Outcome: audit.OutcomeDenied, Reason: err.Error()}); aerr != nil {
			return store.Exec{}, false, aerr
		}
		return store.Exec{}, false, err
	}
	if err != nil {
		return store.Exec{}, false, fmt.Errorf("record the exec request: %w", err)
	}
	return x, created, nil
}

// execRank orders exec states: a record never moves back.
func execRank(st store.ExecState) int {
	return slices.Index([]store.ExecState{store.ExecRequested, store.ExecRunning, store.ExecEnded}, st)
}

// ObserveExec brings session sessionID's record of an exec up to date with
// what the executor reported of it, creating the record if the authority
// never saw it asked. A report older than the record (running for an
// exec recorded ended) changes nothing.
func (s *Service) ObserveExec(ctx context.Context, sessionID string, seen ExecSeen) error {
	if !runspec.ValidExecID(seen.Spec.ID) {
		return fmt.Errorf("jobs: the executor reported exec id %q", seen.Spec.ID)
	}
	state := store.ExecRunning
	if seen.Ended {
		state = store.ExecEnded
	}
	_, err := s.cfg.Store.UpdateExec(ctx, sessionID, seen.Spec.ID, func(x *store.Exec, found bool) error {
		if !found || (x.SpecDigest == "" && !seen.SpecCut) {
			// Learnt from the executor: its spec, as far as the report
			// gives it whole.
			x.Summary, x.SpecDigest = seen.Spec.summarize()
			if seen.SpecCut {
				x.SpecDigest = ""
			}
		}
		if !found {
			x.RequestedAt = seen.StartedAt
		}
		if seen.Spec.StdinStream && seen.Ended {
			// A streamed stdin's size and digest, once it closed: the
			// summary says what the command read; the spec digest (the
			// stream itself) stays.
			var sm execSummary
			if json.Unmarshal(x.Summary, &sm) == nil && sm.StdinStream {
				sm.StdinSize, sm.StdinSHA256 = seen.Spec.StdinSize, seen.Spec.StdinSHA256
				x.Summary, _ = json.Marshal(sm)
			}
		}
		if found && (execRank(state) < execRank(x.State) || (x.State == store.ExecEnded && x.Seq == seen.Seq)) {
			return errUnchanged
		}
		x.State, x.Seq, x.Reason, x.ExitCode, x.Message = state, seen.Seq, seen.Reason, seen.ExitCode, seen.Message
		x.StartedAt, x.EndedAt = seen.StartedAt, seen.EndedAt
		x.StdoutSize, x.StderrSize, x.StdoutTruncated, x.StderrTruncated = seen.StdoutSize, seen.StderrSize, seen.StdoutTruncated, seen.StderrTruncated
		x.StdoutSHA256, x.StderrSHA256 = seen.StdoutSHA256, seen.StderrSHA256
		x.UpdatedAt = s.now()
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return err
}

// ObserveExecs is ObserveExec for each of a listing's or a final report's
// execs, skipping those already recorded as they are reported.
func (s *Service) ObserveExecs(ctx context.Context, sessionID string, seen []ExecSeen) error {
	if len(seen) == 0 {
		return nil
	}
	have, _, err := s.cfg.Store.ListExecs(ctx, sessionID, 2*len(seen))
	if err != nil {
		return err
	}
	known := map[string]store.Exec{}
	for _, x := range have {
		known[x.ExecID] = x
	}
	var errs []error
	for _, x := range seen {
		if k, ok := known[x.Spec.ID]; ok && k.State == store.ExecEnded && k.Seq == x.Seq {
			continue
		}
		errs = append(errs, s.ObserveExec(ctx, sessionID, x))
	}
	return errors.Join(errs...)
}

// Exec returns session j's record of exec id, or ErrNotFound.
func (s *Service) Exec(ctx context.Context, j store.Job, id string) (store.Exec, error) {
	if id == "" {
		return store.Exec{}, invalid("exec_id", "required")
	}
	return s.cfg.Store.GetExec(ctx, j.ID, id)
}

// Execs returns session j's last execs, at most last, oldest first, and how
// many it has in all.
func (s *Service) Execs(ctx context.Context, j store.Job, last int) ([]store.Exec, int64, error) {
	return s.cfg.Store.ListExecs(ctx, j.ID, last)
}
