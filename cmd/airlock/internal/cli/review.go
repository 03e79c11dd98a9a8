package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/bundle/bundlepb"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// The review of a publish request as approval show prints it: the complete
// file list first, then the patch and the output, with every cut said
// where it is and how much it left out. Every byte of paths, patch and
// output is the job's, so all of it goes through termtext.

// patchShown says how much of a file's part of the patch a patch of shown
// bytes holds, the part starting at offset.
func patchShown(offset, length, shown int64) string {
	switch {
	case offset+length <= shown:
		return ""
	case offset < shown:
		return "patch shown in part"
	default:
		return "patch not shown"
	}
}

// fileTable writes files as a table; note(i) is a remark for file i.
type fileTable struct {
	tw *tabwriter.Writer
}

func newFileTable(w io.Writer) *fileTable {
	t := &fileTable{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	fmt.Fprintln(t.tw, "  STATUS\tMODE\tLINES\tSIZE\tPATH\t")
	return t
}

func (t *fileTable) row(f *authorityv1.FileChange, note string) {
	mode := fmt.Sprintf("%06o", f.GetNewMode())
	switch {
	case f.GetNewMode() == 0:
		mode = fmt.Sprintf("%06o", f.GetOldMode())
	case f.GetOldMode() != 0 && f.GetOldMode() != f.GetNewMode():
		mode = fmt.Sprintf("%06o->%06o", f.GetOldMode(), f.GetNewMode())
	}
	lines := fmt.Sprintf("+%d -%d", f.GetLinesAdded(), f.GetLinesDeleted())
	if f.GetBinary() {
		lines = "binary"
	}
	if note != "" {
		note = "(" + note + ")"
	}
	status := string(bundlepb.Status(f.GetStatus()))
	if status == "" {
		status = "?"
	}
	fmt.Fprintf(t.tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", status, mode, lines, f.GetSize(), termtext.Line(bundlepb.Path(f)), note)
}

func (t *fileTable) flush() { t.tw.Flush() }

// writeReviewHeader prints what a publish request's job was and how it
// ended: its command and exit status, or a session's execs and theirs.
func writeReviewHeader(w io.Writer, a *authorityv1.Approval, rv *authorityv1.ReviewMaterial) {
	r := rv.GetResult()
	fmt.Fprintf(w, "job        %s by %s\n", termtext.Line(a.GetJobId()), termtext.Line(a.GetRequester()))
	fmt.Fprintf(w, "target     %s:%s\n", termtext.Line(a.GetTarget().GetRepository()), termtext.Line(a.GetTarget().GetBranch()))
	fmt.Fprintf(w, "bundle     %s\n", termtext.Line(a.GetBundleDigest()))
	fmt.Fprintf(w, "base       %s\n", termtext.Line(rv.GetCommit()))
	runtime := runtimeVersionText(r.GetRuntimeVersion())
	if len(rv.GetCommand()) > 0 {
		fmt.Fprintf(w, "command    %s\n", commandText(rv.GetCommand()))
		fmt.Fprintf(w, "result     %s, exit %d, %s\n", reasonWord(r.GetReason()), r.GetExitCode(), runtime)
		return
	}
	// A session has no command of its own: its execs are what ran, and
	// their statuses are its result.
	d := rv.GetDetail()
	fmt.Fprintf(w, "command    session of %d execs\n", d.GetExecsTotal())
	writeExecLines(w, d.GetExecs(), d.GetExecsTotal(), nil)
	fmt.Fprintf(w, "result     session %s, %s\n", reasonWord(r.GetReason()), runtime)
}

// writeLegend explains the escapes, after a review printed through a
// termtext.Watcher that saw any.
func writeLegend(w io.Writer) {
	if v, ok := w.(*termtext.Watcher); ok && v.Escaped() {
		fmt.Fprintf(w, "\nlegend     %s\n", termtext.Legend)
	}
}

// writeReview prints a publish request's review material.
func writeReview(w io.Writer, a *authorityv1.Approval, rv *authorityv1.ReviewMaterial) {
	d, st := rv.GetDetail(), rv.GetResult().GetDiffStat()
	patch := rv.GetPatch()
	id := termtext.Line(a.GetApprovalId())
	full := "airlock approval show --full " + id
	writeCacheUses(w, rv.GetResult())
	if d == nil {
		// A result recorded before the authority kept file lists: say
		// what is not known rather than guess it.
		fmt.Fprintf(w, "\nfiles      %d changed, %d insertions(+), %d deletions(-)\n", st.GetFilesChanged(), st.GetInsertions(), st.GetDeletions())
		fmt.Fprintf(w, "           no file list was recorded with this result; %s streams the whole patch from the bundle\n", full)
		fmt.Fprintf(w, "\n--- patch: %d bytes shown; how long the whole patch is was not recorded, so it may be cut: %s shows every byte ---\n", len(patch), full)
		writePatch(w, patch)
		fmt.Fprintf(w, "--- end of what was recorded of the patch ---\n\n--- output: not recorded with this result; %s shows it ---\n", full)
		return
	}
	fmt.Fprintf(w, "\nfiles      %d changed, %d insertions(+), %d deletions(-); patch %d bytes\n",
		st.GetFilesChanged(), st.GetInsertions(), st.GetDeletions(), d.GetPatchSize())
	{
		t := newFileTable(w)
		off := int64(0)
		for _, f := range d.GetFiles() {
			t.row(f, patchShown(off, f.GetPatchBytes(), int64(len(patch))))
			off += f.GetPatchBytes()
		}
		t.flush()
		if n := d.GetFilesTotal() - int64(len(d.GetFiles())); n > 0 {
			fmt.Fprintf(w, "  ... and %d more files, not listed here: %s lists every file\n", n, full)
		}
	}
	switch size := d.GetPatchSize(); {
	case len(patch) == 0 && size == 0:
		fmt.Fprintf(w, "\n--- patch: empty ---\n")
	case int64(len(patch)) < size:
		fmt.Fprintf(w, "\n--- patch: the first %d of %d bytes; the files marked above are shown in part or not at all ---\n", len(patch), size)
		writePatch(w, patch)
		fmt.Fprintf(w, "--- patch cut here: %d bytes not shown; %s shows every byte ---\n", size-int64(len(patch)), full)
	default:
		fmt.Fprintf(w, "\n--- patch: %d bytes ---\n", len(patch))
		writePatch(w, patch)
		fmt.Fprintf(w, "--- end of patch ---\n")
	}
	if e := d.GetEgress(); e != nil {
		fmt.Fprintln(w)
		writeEgressSummary(w, e)
	}
	writeReviewExecs(w, d)
	for _, o := range []struct {
		name string
		t    *authorityv1.OutputTail
	}{{"stdout", d.GetStdout()}, {"stderr", d.GetStderr()}} {
		writeTail(w, o.name, o.t, full)
	}
}

// writeReviewExecs prints a session's execs in the order they ran, each
// with the end of its output: the sequence of commands, not the agent's
// account of it.
func writeReviewExecs(w io.Writer, d *authorityv1.ReviewDetail) {
	total := d.GetExecsTotal()
	if total == 0 && d.GetFileWritesTotal() == 0 {
		return
	}
	fmt.Fprintf(w, "\nexecs      %d, in the order they ran, with the client's %d uploads among them\n", total, d.GetFileWritesTotal())
	ups := &uploadList{w: w, left: d.GetFileWrites(), sep: "\n"}
	for _, x := range d.GetExecs() {
		ups.before(x.GetSeq())
		fmt.Fprintf(w, "\n  exec %d  %s  %s\n", x.GetSeq(), termtext.Line(x.GetSpec().GetExecId()), termtext.Line(execOutcome(x)))
		fmt.Fprintf(w, "  argv    %s\n", commandText(x.GetSpec().GetArgv()))
		if env := x.GetSpec().GetEnv(); len(env) > 0 {
			keys := make([]string, 0, len(env))
			for k := range env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(w, "  env     %s=%s\n", termtext.Line(k), shellWord(env[k]))
			}
		}
		if x.GetSpecCut() {
			fmt.Fprintf(w, "  (argv and env cut here; the bundle's result.json has them whole)\n")
		}
		if c := x.GetSpec().GetCwd(); c != "" {
			fmt.Fprintf(w, "  cwd     %s\n", termtext.Line(c))
		}
		switch n := x.GetStdinSize(); {
		case x.GetSpec().GetStdinStream():
			fmt.Fprintf(w, "  stdin   %d bytes streamed, sha256 %s\n", n, termtext.Line(x.GetStdinSha256()))
		case n > 0:
			fmt.Fprintf(w, "  stdin   %d bytes, sha256 %s\n", n, termtext.Line(x.GetStdinSha256()))
		}
		for _, o := range []struct {
			name string
			tail []byte
			size int64
			cut  bool
			sha  string
		}{{"stdout", x.GetStdoutTail(), x.GetStdoutSize(), x.GetStdoutTruncated(), x.GetStdoutSha256()},
			{"stderr", x.GetStderrTail(), x.GetStderrSize(), x.GetStderrTruncated(), x.GetStderrSha256()}} {
			if o.size == 0 {
				continue
			}
			shown := int64(len(o.tail))
			fmt.Fprintf(w, "  --- %s: the last %d of %d bytes (sha256 %s of all of them) ---\n", o.name, shown, o.size, termtext.Line(o.sha))
			writeBody(w, string(o.tail))
			if o.cut {
				fmt.Fprintf(w, "  --- %s: the exec wrote more than the executor records; what came after byte %d was never kept ---\n", o.name, o.size)
			}
		}
	}
	ups.before(total + 1)
	if n := total - int64(len(d.GetExecs())); n > 0 {
		fmt.Fprintf(w, "\n  ... and %d more execs, not listed here: the bundle's result.json records every one\n", n)
	}
	ups.end(d.GetFileWritesTotal(), ": the bundle's result.json records every one")
}

// uploadList writes a session's uploads among its execs, as the review and
// session get list them: each just before the first exec that started
// after it, sep before each.
type uploadList struct {
	w      io.Writer
	left   []*typesv1.FileWrite
	sep    string
	listed int64 // uploads written so far (a folded record counts each)
}

// before writes the uploads made before exec seq started.
func (u *uploadList) before(seq int64) {
	for len(u.left) > 0 && u.left[0].GetAfterExec() < seq {
		f := u.left[0]
		u.left = u.left[1:]
		fmt.Fprintf(u.w, "%s  upload  %s  %d bytes, sha256 %s\n", u.sep, termtext.Line(f.GetPath()), f.GetSize(), termtext.Line(f.GetSha256()))
		if n := f.GetCount(); n > 1 {
			fmt.Fprintf(u.w, "          the last of %d uploads of this path, the first after %d execs had started\n", n, f.GetFirstAfterExec())
		}
		u.listed += max(f.GetCount(), 1)
	}
}

// end writes the uploads left and says how many of total are not listed,
// and where they are (where).
func (u *uploadList) end(total int64, where string) {
	u.before(math.MaxInt64)
	if n := total - u.listed; n > 0 {
		fmt.Fprintf(u.w, "  ... and %d more uploads, not listed here%s\n", n, where)
	}
}

// gutterPrefix starts every line of a job's text that approval show
// prints, and none of ours: a job can write any line it likes, but never
// one that reads as a mark, a vote or the verification.
const gutterPrefix = "| "

// gutter writes text (already escaped) with gutterPrefix before each line.
type gutter struct {
	w       io.Writer
	midLine bool
}

func (g *gutter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if !g.midLine {
			if _, err := io.WriteString(g.w, gutterPrefix); err != nil {
				return 0, err
			}
			g.midLine = true
		}
		i := bytes.IndexByte(p, '\n')
		line := p
		if i >= 0 {
			line, g.midLine = p[:i+1], false
		}
		if _, err := g.w.Write(line); err != nil {
			return 0, err
		}
		p = p[len(line):]
	}
	return n, nil
}

// end finishes a last line that had no newline, saying so.
func (g *gutter) end() {
	if g.midLine {
		io.WriteString(g.w, "\n"+gutterPrefix+"(no newline at the end)\n")
		g.midLine = false
	}
}

// writeBody writes a job's text, escaped, behind the gutter.
func writeBody(w io.Writer, s string) { writeEscaped(w, termtext.Block(s)) }

// writePatch writes a patch as writeBody writes text, with every carriage
// return shown: a line that changes only its CRLF end looks changed.
func writePatch(w io.Writer, patch []byte) { writeEscaped(w, termtext.Patch(string(patch))) }

// writeEscaped writes already escaped text in the gutter.
func writeEscaped(w io.Writer, text string) {
	g := &gutter{w: w}
	io.WriteString(g, text)
	g.end()
}

func writeTail(w io.Writer, name string, t *authorityv1.OutputTail, full string) {
	size, n := t.GetSize(), int64(len(t.GetData()))
	switch {
	case size == 0:
		fmt.Fprintf(w, "\n--- %s: empty ---\n", name)
		return
	case n < size:
		fmt.Fprintf(w, "\n--- %s: the last %d of %d bytes; the first %d are not shown (%s shows them) ---\n", name, n, size, size-n, full)
	default:
		fmt.Fprintf(w, "\n--- %s: %d bytes ---\n", name, size)
	}
	writeBody(w, string(t.GetData()))
	if t.GetCapped() {
		fmt.Fprintf(w, "--- %s: the job wrote more than the executor records; what came after byte %d was never kept ---\n", name, size)
	} else {
		fmt.Fprintf(w, "--- end of %s ---\n", name)
	}
}

// streamReview prints the whole of a request's review material from its
// bundle (ReadReview): every file, the whole patch and all the output,
// escaped unless raw. It fails unless the authority vouched, at the end,
// that every byte was the bundle the request names.
//
// With raw and one part of bytes (patch, stdout or stderr) only that part's
// bytes go to stdout, nothing around them, so they can be piped (the patch
// into git apply); what was verified goes to stderr.
func streamReview(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, a *authorityv1.Approval, raw bool, parts []string) error {
	req := &authorityv1.ReadReviewRequest{ApprovalId: a.GetApprovalId()}
	var err error
	if req.Parts, err = reviewParts(parts); err != nil {
		return err
	}
	bare := bareReview(raw, parts) && g.Output != "json"
	stream, err := client.ReadReview(ctx, req)
	if err != nil {
		return err
	}
	if bare {
		return streamBare(g, stream, a)
	}
	w := g.Stdout
	gut := &gutter{w: w}
	if raw {
		// The job's bytes as they are, not through a terminal's writer.
		gut.w = termtext.Unwrap(w)
	}
	var body io.Writer = gut
	var esc *termtext.Writer
	if !raw {
		esc = termtext.NewWriter(gut)
		body = esc
	}
	var table *fileTable
	var part authorityv1.ReviewPart
	endPart := func() {
		if esc != nil {
			esc.Flush()
		}
		gut.end()
		if table != nil {
			table.flush()
			table = nil
		}
		if part != authorityv1.ReviewPart_REVIEW_PART_UNSPECIFIED {
			fmt.Fprintf(w, "\n--- end of %s ---\n", partWord(part))
		}
	}
	verified := ""
	for received := false; ; received = true {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !received {
			return err
		}
		if err != nil {
			endPart()
			err = remoteError{fmt.Errorf("the stream of the bundle stopped, so what is shown above is incomplete and not verified: %w", rpcError(err))}
			if g.Output != "json" {
				writeLegend(w)
				fmt.Fprintf(w, "\nNOT VERIFIED: %s\n", errorText(err))
			}
			return err
		}
		if g.Output == "json" {
			b, err := protojson.Marshal(msg)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\n", b)
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.ReadReviewResponse_Start:
			if g.Output == "json" {
				part = m.Start.GetPart()
				continue
			}
			endPart()
			part = m.Start.GetPart()
			if !raw {
				esc = termtext.NewWriter(gut)
				if part == authorityv1.ReviewPart_REVIEW_PART_PATCH {
					esc = termtext.NewPatchWriter(gut)
				}
				body = esc
			}
			if part == authorityv1.ReviewPart_REVIEW_PART_FILES {
				fmt.Fprintf(w, "\n--- files: %d ---\n", m.Start.GetSize())
				table = newFileTable(w)
			} else {
				fmt.Fprintf(w, "\n--- %s: %d bytes ---\n", partWord(part), m.Start.GetSize())
			}
		case *authorityv1.ReadReviewResponse_Files:
			if table != nil {
				for _, f := range m.Files.GetFiles() {
					table.row(f, "")
				}
			}
		case *authorityv1.ReadReviewResponse_Chunk:
			if g.Output != "json" {
				if _, err := body.Write(m.Chunk); err != nil {
					return err
				}
			}
		case *authorityv1.ReadReviewResponse_VerifiedDigest:
			verified = m.VerifiedDigest
		}
	}
	if g.Output != "json" {
		endPart()
		writeLegend(w)
	}
	if verified == "" || verified != a.GetBundleDigest() {
		err := remoteError{fmt.Errorf("the authority did not confirm that what is shown above is bundle %s (it said %q): do not rely on it", a.GetBundleDigest(), verified)}
		if g.Output != "json" {
			fmt.Fprintf(w, "\nNOT VERIFIED: %s\n", errorText(err))
		}
		return err
	}
	if g.Output != "json" {
		fmt.Fprintf(w, "\nverified: everything above is bundle %s, the one this request names\n", termtext.Line(verified))
	}
	return nil
}

// reviewParts converts --part values.
func reviewParts(parts []string) ([]authorityv1.ReviewPart, error) {
	var out []authorityv1.ReviewPart
	for _, p := range parts {
		v, ok := authorityv1.ReviewPart_value["REVIEW_PART_"+strings.ToUpper(p)]
		if !ok || v == 0 || p != strings.ToLower(p) {
			return nil, usageError{fmt.Errorf("--part %q: want files, patch, stdout or stderr", p)}
		}
		out = append(out, authorityv1.ReviewPart(v))
	}
	return out, nil
}

// bareReview reports whether --full writes one part's bytes and nothing
// else.
func bareReview(raw bool, parts []string) bool {
	return raw && len(parts) == 1 && parts[0] != "files"
}

// streamBare writes one part's bytes to stdout as they come and what was
// verified to stderr.
func streamBare(g *globals, stream interface {
	Recv() (*authorityv1.ReadReviewResponse, error)
}, a *authorityv1.Approval) error {
	// Nothing reaches stdout before the whole bundle is verified: a pipe
	// into git apply must never see a byte of a bundle that is not the
	// approved one.
	spool, err := os.CreateTemp("", "airlock-review-*")
	if err != nil {
		return err
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	verified := ""
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return remoteError{fmt.Errorf("the stream of the bundle stopped, nothing was written: %w", rpcError(err))}
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.ReadReviewResponse_Chunk:
			if _, err := spool.Write(m.Chunk); err != nil {
				return err
			}
		case *authorityv1.ReadReviewResponse_VerifiedDigest:
			verified = m.VerifiedDigest
		}
	}
	if verified == "" || verified != a.GetBundleDigest() {
		return remoteError{fmt.Errorf("the authority did not confirm that the bytes are from bundle %s (it said %q): nothing was written", a.GetBundleDigest(), verified)}
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.Copy(termtext.Unwrap(g.Stdout), spool); err != nil {
		return err
	}
	fmt.Fprintf(g.Stderr, "verified: what was written is from bundle %s, the one this request names\n", termtext.Line(verified))
	return nil
}
