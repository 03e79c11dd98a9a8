package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

func uploads(ws []FileWrite) int64 {
	var n int64
	for i := range ws {
		n += ws[i].Uploads()
	}
	return n
}

// TestRecordWritesLosesNoUpload: past 2,000 uploads (the old cut) and any
// number of them, every upload is counted and the last one before an exec
// is recorded before it; repeated uploads of one path fold into one record
// that says how many and from when; a new path past MaxWriteRecords is
// refused before anything is written, never recorded and then dropped.
func TestRecordWritesLosesNoUpload(t *testing.T) {
	m := &Manager{runs: map[string]*entry{"s": {}}}
	e := m.runs["s"]
	write := func(path string, afterExec int64) {
		t.Helper()
		if err := m.reserveWritePath("s", path); err != nil {
			t.Fatalf("upload %s: %v", path, err)
		}
		e.recordWrite(FileWrite{Path: path, Size: afterExec, AfterExec: afterExec})
	}
	total := int64(0)
	for i := range 2000 {
		write(fmt.Sprintf("/out/f%d", i), 0)
		total++
	}
	for i := range 3000 { // the same path, an exec between each
		write("/work/notes", int64(i/100))
		total++
	}
	write("/work/run.sh", 30)
	total++
	if got := uploads(e.writes); got != total {
		t.Fatalf("the records stand for %d uploads, want %d", got, total)
	}
	last := e.writes[len(e.writes)-1]
	if last.Path != "/work/run.sh" || last.AfterExec != 30 {
		t.Fatalf("the last record is %+v, want /work/run.sh after 30 execs", last)
	}
	if len(e.writes) != 2000+30+1 {
		t.Errorf("%d records, want one per path per exec gap (2031)", len(e.writes))
	}

	// Past MaxWriteRecords records, each path's fold into one, placed at
	// its last upload.
	for i := range MaxWriteRecords - 2002 {
		write(fmt.Sprintf("/out/g%d", i), 31+int64(i))
		total++
	}
	write("/work/run.sh", 40000)
	total++
	if len(e.writes) > MaxWriteRecords || uploads(e.writes) != total {
		t.Fatalf("%d records for %d uploads, want at most %d for %d", len(e.writes), uploads(e.writes), MaxWriteRecords, total)
	}
	var notes FileWrite
	for _, w := range e.writes {
		if w.Path == "/work/notes" {
			notes = w
		}
	}
	if notes.Count != 3000 || notes.FirstAfterExec != 0 || notes.AfterExec != 29 {
		t.Errorf("/work/notes folded as %+v, want 3000 uploads, the first after 0 execs, the last after 29", notes)
	}
	if last := e.writes[len(e.writes)-1]; last.Path != "/work/run.sh" || last.AfterExec != 40000 || last.Count != 2 || last.FirstAfterExec != 30 {
		t.Errorf("the last record is %+v, want /work/run.sh twice, after 30 and 40000 execs", last)
	}

	// One path more is refused, naming it; an upload to a path already
	// written is still taken.
	if err := m.reserveWritePath("s", "/out/one-more"); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), `path "/out/one-more"`) {
		t.Errorf("a path past the most: %v, want resource exhausted naming it", err)
	}
	write("/out/f7", 40001)
	if uploads(e.writes) != total+1 {
		t.Errorf("an upload to a known path was not counted")
	}
}

// TestFoldWrites: a sequence within the bound is kept as it is; beyond it
// each path's records fold into one at its last upload; beyond that the
// first quarter and the last paths are kept and what is left out counted.
func TestFoldWrites(t *testing.T) {
	ws := []FileWrite{{Path: "/a", AfterExec: 0}, {Path: "/b", AfterExec: 1}, {Path: "/a", AfterExec: 2}, {Path: "/c", AfterExec: 3}}
	if got, cut := FoldWrites(ws, 4); len(got) != 4 || cut != 0 {
		t.Errorf("within the bound: %+v cut %d", got, cut)
	}
	got, cut := FoldWrites(ws, 3)
	want := []FileWrite{{Path: "/b", AfterExec: 1}, {Path: "/a", AfterExec: 2, Count: 2, FirstAfterExec: 0}, {Path: "/c", AfterExec: 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) || cut != 0 {
		t.Errorf("folded: %+v cut %d, want %+v", got, cut, want)
	}
	if ws[0].Count != 0 {
		t.Errorf("FoldWrites changed its input: %+v", ws[0])
	}
	var many []FileWrite
	for i := range 100 {
		many = append(many, FileWrite{Path: fmt.Sprintf("/p%d", i), AfterExec: int64(i)})
	}
	many = append(many, FileWrite{Path: "/p3", AfterExec: 100, Count: 5, FirstAfterExec: 50})
	got, cut = FoldWrites(many, 8)
	paths := []string{}
	for _, w := range got {
		paths = append(paths, w.Path)
	}
	if strings.Join(paths, " ") != "/p0 /p1 /p95 /p96 /p97 /p98 /p99 /p3" || cut+uploads(got) != uploads(many) {
		t.Errorf("cut to 8: %v, %d left out of %d", paths, cut, uploads(many))
	}
	if p3 := got[len(got)-1]; p3.Count != 6 || p3.FirstAfterExec != 3 || p3.AfterExec != 100 {
		t.Errorf("/p3 folded as %+v, want 6 uploads from after 3 execs to after 100", p3)
	}
}

// TestSessionUploadAfter2000IsBeforeItsExec is the attack of issue 20: a
// client uploads 2,000 files, then /work/run.sh, then runs it. The bundle
// and the report, and the running session's listing, record run.sh
// uploaded before that exec, and count every upload.
func TestSessionUploadAfter2000IsBeforeItsExec(t *testing.T) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	for i := range 2000 {
		if _, err := h.m.WriteFile(context.Background(), sid, fmt.Sprintf("/out/f%d", i), 0, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.m.WriteFile(context.Background(), sid, "/work/run.sh", 0o755, strings.NewReader("echo ran\n")); err != nil {
		t.Fatal(err)
	}
	if x := h.execWait(t, sid, ExecSpec{ID: "t1", Argv: []string{"sh", "/work/run.sh"}}); x.ExitCode != 0 {
		t.Fatalf("t1: %+v", x)
	}
	// The listing of the running session (session get) has them too.
	_, listed, err := h.m.ListExecs(sid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, sid)
	meta := h.bundleMeta(t, sid)
	reports := h.waitReports(t, 1)
	for name, ws := range map[string][]FileWrite{"bundle": meta.FileWrites, "report": reports[0].FileWrites, "listing": listed} {
		if len(ws) == 0 || uploads(ws) != 2001 {
			t.Fatalf("%s: %d records for %d uploads, want 2001 uploads", name, len(ws), uploads(ws))
		}
		if last := ws[len(ws)-1]; last.Path != "/work/run.sh" || last.AfterExec != 0 {
			t.Errorf("%s: the last upload is %+v, want /work/run.sh before exec 1", name, last)
		}
	}
}

// bundleMeta reads result.json from run id's bundle.
func (h *harness) bundleMeta(t *testing.T, id string) bundleMeta {
	t.Helper()
	data, err := bundle.ReadEntry(filepath.Join(h.m.runDir(id), "bundle.tar"), "result.json")
	if err != nil {
		t.Fatal(err)
	}
	var meta bundleMeta
	if err := json.Unmarshal(data, &meta); err != nil {
		t.Fatal(err)
	}
	return meta
}
