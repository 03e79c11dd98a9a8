package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func newSession(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Run many commands in one sandbox, then hand its result to review",
		Long: `A session is a job whose sandbox stays up: create it on a repository at a
revision, run commands in it one after another (or several at once) with
session exec, then finish it. Finishing builds the result bundle as a job's
is (the patch against the base, /out, the grant) with every exec's record,
and, with --publish-to, opens the approval. Files in /work, /tmp and $HOME
carry from one exec to the next; the session ends when finished, cancelled,
past its deadline (--timeout) or idle longer than --idle-timeout.

Every exec has an id: the same id with the same command returns the same
exec, running or ended, and never runs it twice, so an exec whose outcome
is unknown (a dropped connection, a killed CLI) is retried safely with
session exec --exec-id ID, or followed with session watch.`,
	}
	cmd.AddCommand(newSessionCreate(g), newSessionExec(g), newSessionWatch(g), newSessionGet(g), newSessionList(g),
		newSessionFinish(g), newSessionCancel(g), newSessionCp(g), newSessionLs(g), newSessionSuspend(g), newSessionResume(g),
		newSessionPortForward(g), newSessionForwards(g), newSessionCloseForward(g))
	return cmd
}

func newSessionCreate(g *globals) *cobra.Command {
	var f submitFlags
	var idle time.Duration
	var maxExecs int32
	var noWait bool
	var onIdle string
	cmd := &cobra.Command{
		Use:   "create --repo R --rev REV [flags]",
		Short: "Create a session and wait until it runs; prints its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := f.spec(nil)
			if err != nil {
				return err
			}
			if idle < 0 || maxExecs < 0 {
				return usageError{errors.New("--idle-timeout and --max-execs must not be negative")}
			}
			action, ok := idleActionOf(onIdle)
			if !ok {
				return usageError{fmt.Errorf("--on-idle %q: want end or sleep", onIdle)}
			}
			spec.Session = &typesv1.SessionSpec{MaxConcurrentExecs: maxExecs, OnIdle: action}
			if idle > 0 {
				spec.Session.IdleTimeout = durationpb.New(idle)
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
				tenant, err := self.tenant(f.tenant)
				if err != nil {
					return err
				}
				resp, err := client.CreateSession(cmd.Context(), &authorityv1.CreateSessionRequest{Tenant: tenant, Spec: spec, IdempotencyKey: f.idempotencyKey()})
				if err != nil {
					return err
				}
				warnBudget(g, resp.GetBudgetWarning())
				s := resp.GetSession()
				if !noWait {
					if s, err = waitRunning(cmd.Context(), g, client, s.GetJobId()); err != nil {
						return err
					}
				}
				return g.PrintProto(s, func(w io.Writer) { fmt.Fprintln(w, termtext.Line(s.GetJobId())) })
			})
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.DurationVar(&idle, "idle-timeout", 0, "end the session after this long with no exec running (default: the tenant's, 15m unless its policy says)")
	fl.Int32Var(&maxExecs, "max-execs", 0, "how many execs may run at once (default: the tenant's, 4 unless its policy says)")
	fl.BoolVar(&noWait, "no-wait", false, "print the id at once, without waiting for the sandbox to run")
	fl.StringVar(&onIdle, "on-idle", "", "once idle past --idle-timeout: end, or sleep (suspended with /work and /out kept; the next exec or file call wakes it) (default: the tenant's, end unless its policy says)")
	return cmd
}

// waitRunning polls a session until its sandbox runs; an end first is an
// error saying how it ended.
func waitRunning(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, id string) (*authorityv1.Job, error) {
	var printed authorityv1.JobState
	for {
		resp, err := client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: id})
		if err != nil {
			return nil, err
		}
		s := resp.GetSession()
		if st := s.GetState(); st != printed && g.Output == "text" {
			fmt.Fprintf(g.Stderr, "[airlock] session %s %s\n", termtext.Line(id), jobStateWord(st))
			printed = st
		}
		switch {
		case s.GetState() == authorityv1.JobState_JOB_STATE_RUNNING:
			return s, nil
		case terminal(s.GetState()):
			return nil, remoteError{fmt.Errorf("session %s ended before it ran: %s", termtext.Line(id), termtext.Line(outcome(s)))}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func newSessionExec(g *globals) *cobra.Command {
	var (
		execID, cwd, stdin   string
		env                  []string
		timeout              time.Duration
		raw, detach, noStdin bool
	)
	cmd := &cobra.Command{
		Use:   "exec SESSION [flags] -- CMD [ARGS...]",
		Short: "Run a command in a session, stream its output and exit with its exit status",
		Long: `Runs CMD in the session's sandbox, streams its output, and exits with its
exit status: 124 for its timeout, 137 for OOM, 130 when cancelled, 1 when
it could not run.

--exec-id names the exec. Without it one is generated and printed on
stderr first; retrying with it returns the same exec (its recorded output
and status once it has ended) and never runs the command again. The same
id with a different command, env, cwd, stdin or timeout is refused.

Standard input, when it is a pipe or a file (not a terminal), is streamed
to the command as it is read, up to 64MiB; so is --stdin FILE. The exec's
record keeps its size and SHA-256. A retry attaches to the exec without
sending stdin again; a stream cut off before its end cancels the exec, as
the command must not take part of its input for the whole. --no-stdin
gives the command none. With --detach, --stdin FILE (at most 1MiB) is sent
whole and piped input is not read.

` + streamHelp,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := parseEnv(env)
			if err != nil {
				return err
			}
			if timeout < 0 {
				return usageError{errors.New("--exec-timeout must not be negative")}
			}
			spec := &typesv1.ExecSpec{ExecId: execID, Argv: args[1:], Env: e, Cwd: cwd}
			if timeout > 0 {
				spec.Timeout = durationpb.New(timeout)
			}
			if stdin != "" && noStdin {
				return usageError{errors.New("--stdin and --no-stdin: at most one")}
			}
			if spec.ExecId == "" {
				spec.ExecId = randomID("x-")
				fmt.Fprintf(g.Stderr, "[airlock] exec id %s (retry with --exec-id %s)\n", spec.ExecId, spec.ExecId)
			}
			if !detach {
				in, closeIn, err := execStdin(stdin, noStdin)
				if err != nil {
					return err
				}
				defer closeIn()
				spec.StdinStream = in != nil
				return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
					return runExec(cmd.Context(), g, client, args[0], spec, in, raw)
				})
			}
			if stdin != "" {
				var data []byte
				if stdin == "-" {
					data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20+1))
				} else {
					data, err = os.ReadFile(stdin)
				}
				if err != nil {
					return usageError{fmt.Errorf("--stdin %q: %v", stdin, err)}
				}
				if len(data) > 1<<20 {
					return usageError{fmt.Errorf("--stdin %q: more than 1MiB", stdin)}
				}
				spec.Stdin = data
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := startExec(cmd.Context(), client, &authorityv1.StartExecRequest{SessionId: args[0], Spec: spec})
				if err != nil {
					return err
				}
				if !resp.GetCreated() && g.Output == "text" {
					fmt.Fprintf(g.Stderr, "[airlock] exec %s was started before: following it, not running it again\n", termtext.Line(spec.ExecId))
				}
				return g.PrintProto(resp.GetExec(), func(w io.Writer) { fmt.Fprintln(w, termtext.Line(spec.ExecId)) })
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&execID, "exec-id", "", "the exec's id, 1 to 128 of [A-Za-z0-9._:-] (default: generated and printed)")
	fl.StringVar(&cwd, "cwd", "", "working directory: /work or a path under it (default /work)")
	fl.StringArrayVar(&env, "env", nil, "KEY=VALUE for the command (repeatable; never a credential)")
	fl.DurationVar(&timeout, "exec-timeout", 0, "kill the exec's process group after this long; the session lives on")
	fl.StringVar(&stdin, "stdin", "", "a file (or - for standard input, even a terminal) streamed to the command, at most 64MiB")
	fl.BoolVar(&noStdin, "no-stdin", false, "give the command no stdin, even when standard input is a pipe")
	fl.BoolVar(&raw, "raw", false, "copy the exec's output to a terminal unescaped")
	fl.BoolVar(&detach, "detach", false, "print the exec id once it has started; follow it later with session watch")
	return cmd
}

// startExec starts an exec, retrying while the authority cannot be
// reached: the exec id makes every attempt the same exec.
func startExec(ctx context.Context, client authorityv1.AuthorityServiceClient, req *authorityv1.StartExecRequest) (*authorityv1.StartExecResponse, error) {
	for attempt := 0; ; attempt++ {
		resp, err := client.StartExec(ctx, req)
		if err == nil {
			return resp, nil
		}
		if status.Code(err) != codes.Unavailable || attempt >= 10 {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}

func newSessionWatch(g *globals) *cobra.Command {
	var raw bool
	cmd := &cobra.Command{
		Use:   "watch SESSION EXEC_ID",
		Short: "Stream an exec's output from the start and exit with its exit status",
		Long:  "Streams an exec's output, from its start, and exits with its exit status as session exec does.\n\n" + streamHelp,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				return followExec(cmd.Context(), g, client, args[0], args[1], raw)
			})
		},
	}
	cmd.Flags().BoolVar(&raw, "raw", false, "copy the exec's output to a terminal unescaped")
	return cmd
}

// followExec streams an exec's output until it ends, resuming from the
// offsets it reached when the stream drops, and turns its ending into the
// exit status.
func followExec(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, sessionID, execID string, raw bool) error {
	out := newOutputSink(g, raw)
	defer out.flush()
	for attempt := 0; ; attempt++ {
		stream, err := client.WatchExec(ctx, &authorityv1.WatchExecRequest{
			SessionId: sessionID, ExecId: execID,
			StdoutOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDOUT), StderrOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDERR),
		})
		if err != nil {
			return err
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				if status.Code(err) == codes.Unavailable && attempt < 10 {
					break
				}
				return err
			}
			switch ev := msg.GetEvent().(type) {
			case *authorityv1.WatchExecResponse_Output:
				out.write(ev.Output)
			case *authorityv1.WatchExecResponse_Exec:
				out.flush()
				return finishExec(g, ev.Exec)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}

// finishExec prints an ended exec's summary and turns its ending into the
// exit status.
func finishExec(g *globals, x *typesv1.Exec) error {
	if err := g.PrintProto(x, func(io.Writer) {
		if g.Output == "text" {
			fmt.Fprintf(g.Stderr, "[airlock] exec %s: %s\n", termtext.Line(x.GetSpec().GetExecId()), termtext.Line(execOutcome(x)))
		}
	}); err != nil {
		return err
	}
	code := 1
	switch x.GetReason() {
	case typesv1.TerminationReason_TERMINATION_REASON_EXITED:
		if c := x.GetExitCode(); c >= 0 && c < 256 {
			code = int(c)
		}
	case typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT:
		code = 124
	case typesv1.TerminationReason_TERMINATION_REASON_OOM:
		code = 137
	case typesv1.TerminationReason_TERMINATION_REASON_CANCELLED:
		code = 130
	}
	if code == 0 {
		return nil
	}
	return &exitError{code: code, err: remoteError{fmt.Errorf("exec %s: %s", termtext.Line(x.GetSpec().GetExecId()), termtext.Line(execOutcome(x)))}}
}

func execOutcome(x *typesv1.Exec) string {
	switch x.GetState() {
	case typesv1.ExecState_EXEC_STATE_ENDED:
	case typesv1.ExecState_EXEC_STATE_REQUESTED:
		return "requested (not seen started at the executor)"
	default:
		return "running"
	}
	s := reasonWord(x.GetReason())
	if x.GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED {
		s += fmt.Sprintf(" with status %d", x.GetExitCode())
	}
	if m := x.GetMessage(); m != "" && !strings.HasPrefix(m, "exited with status") {
		s += " (" + m + ")"
	}
	return s + fmt.Sprintf(", wall %s", x.GetUsage().GetWallTime().AsDuration().Round(time.Millisecond))
}

func newSessionGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get SESSION",
		Short: "Show a session and its execs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := client.GetSession(cmd.Context(), &authorityv1.GetSessionRequest{SessionId: args[0]})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) { writeSessionGet(w, resp) })
			})
		},
	}
}

// writeSessionGet writes a session and its execs for people, as session
// get shows them, every job- or caller-chosen string escaped.
func writeSessionGet(w io.Writer, resp *authorityv1.GetSessionResponse) {
	s := resp.GetSession()
	fmt.Fprintf(w, "session    %s\n", termtext.Line(s.GetJobId()))
	fmt.Fprintf(w, "repository %s @ %s (%s)\n", termtext.Line(s.GetSpec().GetRepository()), termtext.Line(s.GetSpec().GetRevision()),
		termtext.Line(short(s.GetCommit())))
	state := jobStateWord(s.GetState())
	if resp.GetSuspended() {
		state += ", " + suspensionWord(resp.GetSuspendReason(), resp.GetSuspendedAt())
	}
	if resp.GetSuspensionUnknown() {
		state += ", suspended or not: unknown (its executor could not say)"
	}
	if resp.GetSuspendReason() == typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED {
		state += ": its executor restarted, keeping /work and /out (session resume goes on)"
	}
	fmt.Fprintf(w, "state      %s\n", state)
	writePlacement(w, s)
	writeWith(w, s)
	writeLimits(w, s)
	if resp.GetExecsStale() {
		fmt.Fprintln(w, "note       the executor could not answer: these are the authority's records of the execs, which may be behind")
	}
	execs := fmt.Sprintf("%d", max(resp.GetExecsTotal(), int64(len(resp.GetExecs()))))
	if n := resp.GetFileWritesTotal(); n > 0 {
		execs += fmt.Sprintf(", with the client's %d uploads among them", n)
	}
	fmt.Fprintf(w, "execs      %s\n", execs)
	ups := &uploadList{w: w, left: resp.GetFileWrites()}
	writeExecLines(w, resp.GetExecs(), resp.GetExecsTotal(), ups)
	ups.end(resp.GetFileWritesTotal(), "")
	if terminal(s.GetState()) {
		writeSummary(w, s)
	}
}

// writeExecLines lists execs, one line each with its status, every
// job-chosen string escaped, and says how many of total are not listed;
// with ups, the uploads made before each exec come before it.
func writeExecLines(w io.Writer, execs []*typesv1.Exec, total int64, ups *uploadList) {
	for _, x := range execs {
		if ups != nil {
			ups.before(x.GetSeq())
		}
		fmt.Fprintf(w, "  %3d  %s  %s  %s\n", x.GetSeq(), termtext.Line(x.GetSpec().GetExecId()), termtext.Line(execOutcome(x)), commandText(x.GetSpec().GetArgv()))
	}
	if n := total - int64(len(execs)); n > 0 {
		fmt.Fprintf(w, "       ... and %d more execs, not listed here\n", n)
	}
}

func newSessionList(g *globals) *cobra.Command {
	var suspended []*authorityv1.SessionSuspension
	return listCommand(g, "sessions",
		func(ctx context.Context, c authorityv1.AuthorityServiceClient, tenant, token string, size int32) ([]*authorityv1.Job, string, error) {
			r, err := c.ListSessions(ctx, &authorityv1.ListSessionsRequest{Tenant: tenant, PageSize: size, PageToken: token})
			suspended = append(suspended, r.GetSuspended()...)
			return r.GetSessions(), r.GetNextPageToken(), err
		},
		func(list []*authorityv1.Job) proto.Message {
			return &authorityv1.ListSessionsResponse{Sessions: list, Suspended: suspended}
		},
		func(w io.Writer, list []*authorityv1.Job) {
			at := map[string]*authorityv1.SessionSuspension{}
			for _, x := range suspended {
				at[x.GetSessionId()] = x
			}
			fmt.Fprintln(w, "SESSION\tSTATE\tREPOSITORY\tCOMMIT\tCREATED")
			for _, s := range list {
				state := jobStateWord(s.GetState())
				if x := at[s.GetJobId()]; x != nil {
					state += ", " + suspensionWord(x.GetSuspendReason(), x.GetSuspendedAt())
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", termtext.Line(s.GetJobId()), state,
					termtext.Line(s.GetSpec().GetRepository()), termtext.Line(short(s.GetCommit())), s.GetCreatedAt().AsTime().Local().Format(time.DateTime))
			}
		})
}

func newSessionFinish(g *globals) *cobra.Command {
	var noWait bool
	cmd := &cobra.Command{
		Use:   "finish SESSION",
		Short: "Finish a session: stop its sandbox, build its result and wait for it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := client.FinishSession(cmd.Context(), &authorityv1.FinishSessionRequest{SessionId: args[0]})
				if err != nil {
					return err
				}
				if noWait {
					return g.PrintProto(resp.GetSession(), func(w io.Writer) { fmt.Fprintf(w, "finishing %s\n", termtext.Line(args[0])) })
				}
				for {
					r, err := client.GetSession(cmd.Context(), &authorityv1.GetSessionRequest{SessionId: args[0]})
					if err != nil {
						return err
					}
					if s := r.GetSession(); terminal(s.GetState()) {
						return g.PrintProto(s, func(w io.Writer) { writeSummary(w, s) })
					}
					select {
					case <-cmd.Context().Done():
						return cmd.Context().Err()
					case <-time.After(200 * time.Millisecond):
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once finishing has begun")
	return cmd
}

func newSessionCancel(g *globals) *cobra.Command {
	var reason, execID string
	cmd := &cobra.Command{
		Use:   "cancel SESSION [--exec EXEC_ID]",
		Short: "Cancel a session (its sandbox and every exec in it are killed), or with --exec one exec",
		Long: `Cancels a session: its sandbox and every exec in it are killed and its
result is built as a job's is when cancelled. With --exec, only that exec
is stopped: its process group gets SIGTERM, then SIGKILL after 10 seconds,
and the session lives on.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				if execID != "" {
					resp, err := client.CancelExec(cmd.Context(), &authorityv1.CancelExecRequest{SessionId: args[0], ExecId: execID})
					if err != nil {
						return err
					}
					return g.PrintProto(resp.GetExec(), func(w io.Writer) {
						fmt.Fprintf(w, "cancel requested for exec %s (%s)\n", termtext.Line(execID), termtext.Line(execOutcome(resp.GetExec())))
					})
				}
				resp, err := client.CancelSession(cmd.Context(), &authorityv1.CancelSessionRequest{SessionId: args[0], Reason: reason})
				if err != nil {
					return err
				}
				return g.PrintProto(resp.GetSession(), func(w io.Writer) {
					fmt.Fprintf(w, "cancel requested for %s (state %s)\n", termtext.Line(args[0]), jobStateWord(resp.GetSession().GetState()))
				})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "cancelled from the CLI", "why, for the record")
	cmd.Flags().StringVar(&execID, "exec", "", "cancel only this exec")
	return cmd
}

func newSessionCp(g *globals) *cobra.Command {
	var mode uint32
	var raw bool
	var maxSizeOf func() (int64, error)
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy one file into or out of a session's /work or /out",
		Long: `Copies one file between this machine and a running session. One side names
the session's file as SESSION:/work/PATH or SESSION:/out/PATH, the other a
local file; - is standard input or output.

An upload replaces the session's file atomically, owned by the sandbox's
root (mode --mode, default 0644); it counts against the disk limit, and one
that is refused leaves nothing behind. A download is written to a new file
beside DST and renamed over it only once complete; a file larger than
--max-size (default 1GiB; a sparse file counts at its full size) is refused
before anything is written. Paths are resolved inside the sandbox's /work
and /out: a symlink or ".." that leads out is refused.
A download to a terminal is escaped unless --raw.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcSess, srcPath, srcRemote := strings.Cut(args[0], ":")
			dstSess, dstPath, dstRemote := strings.Cut(args[1], ":")
			srcRemote = srcRemote && strings.HasPrefix(srcPath, "/")
			dstRemote = dstRemote && strings.HasPrefix(dstPath, "/")
			if srcRemote == dstRemote {
				return usageError{errors.New("exactly one of SRC and DST must be SESSION:/work/... or SESSION:/out/...")}
			}
			remote := srcPath
			if dstRemote {
				remote = dstPath
			}
			if !utf8.ValidString(remote) {
				return usageError{fmt.Errorf("path %q: not valid UTF-8 (a session's file is named by text)", remote)}
			}
			maxSize, err := maxSizeOf()
			if err != nil {
				return err
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				if dstRemote {
					return uploadFile(cmd.Context(), g, client, args[0], dstSess, dstPath, mode)
				}
				return downloadFile(cmd.Context(), g, client, srcSess, srcPath, args[1], raw, maxSize)
			})
		},
	}
	maxSizeOf = maxSizeFlag(cmd)
	cmd.Flags().Uint32Var(&mode, "mode", 0o644, "permission bits of an uploaded file")
	cmd.Flags().BoolVar(&raw, "raw", false, "copy a download to a terminal unescaped")
	return cmd
}

func uploadFile(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, local, sess, path string, mode uint32) error {
	var r io.Reader = os.Stdin
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return usageError{err}
		}
		defer f.Close()
		r = f
	}
	stream, err := client.WriteFile(ctx)
	if err != nil {
		return rpcError(err)
	}
	send := func(m *authorityv1.WriteFileRequest) error {
		if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
			return rpcError(err)
		} else if err != nil {
			return io.EOF // refused: the status follows
		}
		return nil
	}
	if err := send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Header{Header: &authorityv1.WriteFileHeader{SessionId: sess, Path: path, Mode: mode}}}); err != nil && err != io.EOF {
		return err
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Chunk{Chunk: buf[:n]}}); err == io.EOF {
				break
			} else if err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return rpcError(err)
	}
	return g.PrintProto(resp, func(w io.Writer) {
		fmt.Fprintf(w, "%s:%s: %d bytes written\n", termtext.Line(sess), termtext.Line(path), resp.GetSize())
	})
}

func downloadFile(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, sess, path, local string, raw bool, maxSize int64) error {
	stream, err := client.ReadFile(ctx, &authorityv1.ReadFileRequest{SessionId: sess, Path: path})
	if err != nil {
		return rpcError(err)
	}
	var w io.Writer
	var tmp *os.File
	if local == "-" {
		w = jobOutput(g.Stdout, raw)
		defer flushOutput(w)
	} else {
		if tmp, err = os.CreateTemp(filepath.Dir(local), ".airlock-cp-*"); err != nil {
			return err
		}
		defer func() {
			if tmp != nil {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		w = tmp
	}
	var n int64
	size := int64(-1)
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rpcError(err)
		}
		if h := msg.GetHeader(); h != nil {
			size = h.GetSize()
			if err := overMaxSize(termtext.Line(sess)+":"+termtext.Line(path), size, maxSize); err != nil {
				return err
			}
		}
		if c := msg.GetChunk(); len(c) > 0 {
			// Never more than the size checked against --max-size.
			if size < 0 || n+int64(len(c)) > size {
				return remoteError{fmt.Errorf("%s: the server sent more than the %d bytes it announced; nothing was written", termtext.Line(sess)+":"+termtext.Line(path), max(size, 0))}
			}
			if _, err := w.Write(c); err != nil {
				return err
			}
			n += int64(len(c))
		}
	}
	if size >= 0 && n != size {
		// The file changed while it was read: what came is not it.
		return remoteError{fmt.Errorf("%s:%s: read %d bytes of a file that had %d when opened (it changed meanwhile); nothing was written", termtext.Line(sess), termtext.Line(path), n, size)}
	}
	if tmp != nil {
		if err := tmp.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp.Name(), local); err != nil {
			return err
		}
		tmp = nil
		fmt.Fprintf(g.Stderr, "%s: %d bytes\n", termtext.Line(local), n)
	}
	return nil
}

func newSessionLs(g *globals) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "ls SESSION [PATH]",
		Short: "List a directory of a running session's /work or /out (default /work)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/work"
			if len(args) == 2 {
				path = args[1]
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				resp, err := client.ListFiles(cmd.Context(), &authorityv1.ListFilesRequest{SessionId: args[0], Path: path, Recursive: recursive})
				if err != nil {
					return err
				}
				return g.PrintProto(resp, func(w io.Writer) {
					for _, f := range resp.GetEntries() {
						line := fmt.Sprintf("%-7s %04o %10d  %s", f.GetType(), f.GetMode(), f.GetSize(), termtext.Line(f.GetPath()))
						if f.GetType() == "symlink" {
							line += " -> " + termtext.Line(f.GetTarget())
						}
						fmt.Fprintln(w, line)
					}
					if resp.GetTruncated() {
						fmt.Fprintln(w, "... more entries not listed")
					}
				})
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "R", false, "list everything below")
	return cmd
}

func newSessionSuspend(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "suspend SESSION",
		Short: "Stop a session's sandbox, keeping only its /work changes and /out",
		Long: `Suspends a session: its sandbox stops, every exec in it ends cancelled and
every process is gone. Its /work changes and /out are kept for resume;
/tmp and $HOME are not. A suspended session's deadline counts on; its idle
timeout does not. It can be resumed, finished or cancelled.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return suspendOrResume(cmd.Context(), g, args[0], true)
		},
	}
}

func newSessionResume(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume SESSION",
		Short: "Start a suspended session's sandbox again, fresh, with its /work changes and /out",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return suspendOrResume(cmd.Context(), g, args[0], false)
		},
	}
}

// suspendOrResume asks for either and waits until the session is there.
func suspendOrResume(ctx context.Context, g *globals, id string, suspend bool) error {
	return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) (err error) {
		if suspend {
			_, err = client.SuspendSession(ctx, &authorityv1.SuspendSessionRequest{SessionId: id})
		} else {
			_, err = client.ResumeSession(ctx, &authorityv1.ResumeSessionRequest{SessionId: id})
		}
		if err != nil {
			return err
		}
		for {
			resp, err := client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: id})
			if err != nil {
				return err
			}
			s := resp.GetSession()
			if terminal(s.GetState()) {
				return remoteError{fmt.Errorf("session %s ended: %s", termtext.Line(id), termtext.Line(outcome(s)))}
			}
			if resp.GetSuspended() == suspend {
				word := map[bool]string{true: "suspended", false: "running"}[suspend]
				return g.PrintProto(resp, func(w io.Writer) { fmt.Fprintf(w, "session %s %s\n", termtext.Line(id), word) })
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}
