package egress

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// A line that is not a record (too long to be a bounded one, or not JSON)
// is skipped and counted; every record around it is still read.
func TestScanRecordsSkipsWhatIsNotARecord(t *testing.T) {
	in := `{"via":"connect","name":"a.test","allowed":true,"reason":"ok"}` + "\n" +
		`{"via":"connect","name":"` + strings.Repeat("x", 100<<10) + `"}` + "\n" +
		"not json\n" +
		`{"via":"dns","name":"b.test","allowed":false,"reason":"no"}` + "\n" +
		`{"via":"dns","name":"c.test","allowed":false,"reason":"no"}` // no final newline
	var names []string
	lines, err := ScanRecords(strings.NewReader(in), func(r Record) { names = append(names, r.Name) })
	if lines != 5 || strings.Join(names, ",") != "a.test,b.test,c.test" {
		t.Errorf("lines %d, records %v; want 5 lines and a.test,b.test,c.test", lines, names)
	}
	if err == nil || !strings.Contains(err.Error(), "2 lines are not records (the first: line 2)") {
		t.Errorf("err = %v", err)
	}
	if lines, err := ScanRecords(strings.NewReader(""), func(Record) { t.Error("a record in nothing") }); lines != 0 || err != nil {
		t.Errorf("empty: %d, %v", lines, err)
	}
}

func TestCutAndBounded(t *testing.T) {
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := Cut(long, MaxText)
	if len(got) > MaxText || !utf8.ValidString(got) || !strings.HasSuffix(got, " [cut]") {
		t.Errorf("Cut: %d bytes, valid %v, %q...", len(got), utf8.ValidString(got), got[len(got)-10:])
	}
	if Cut("short", MaxText) != "short" {
		t.Error("Cut changed a short string")
	}
	r := Record{Name: long, Reason: long, Addr: long, End: long, QType: strings.Repeat("A", 100), Answers: make([]string, 40)}.Bounded()
	for what, s := range map[string]string{"name": r.Name, "reason": r.Reason, "addr": r.Addr, "end": r.End} {
		if len(s) > MaxText {
			t.Errorf("Bounded %s: %d bytes", what, len(s))
		}
	}
	if len(r.QType) > 16 || len(r.Answers) != 16 {
		t.Errorf("Bounded qtype %d bytes, %d answers", len(r.QType), len(r.Answers))
	}
}

// A Summary counts what summary lines stand for; it keeps at most MaxNames
// entries, names only refused at most half of them, so an allowed name
// that comes after a flood of refused ones still has its own entry, and the
// rest are totalled under OtherNames. Every decision is counted.
func TestSummary(t *testing.T) {
	var s Summary
	s.Add(Record{Name: "a.test", Allowed: true, BytesIn: 10, BytesOut: 1})
	s.Add(Record{Name: "a.test", Allowed: true, Suppressed: 5, BytesIn: 100})
	s.Add(Record{Name: "a.test", Reason: "no"})
	s.Add(Record{Name: "b.test", Suppressed: 7})
	for i := range 2 * MaxNames {
		s.Add(Record{Name: fmt.Sprintf("junk%d.test", i)})
	}
	s.Add(Record{Name: "late.test", Allowed: true, BytesOut: 1 << 30})
	for i := range 2 * MaxNames {
		s.Add(Record{Name: fmt.Sprintf("used%d.test", i), Allowed: true})
	}
	names := s.Names()
	if len(names) > MaxNames {
		t.Fatalf("%d entries, want at most %d", len(names), MaxNames)
	}
	at := map[string]NameSummary{}
	refusedOnly, total := 0, 0
	for _, n := range names {
		at[n.Name] = n
		if n.Allowed == 0 && n.Name != OtherNames {
			refusedOnly++
		}
		total += n.Allowed + n.Refused
	}
	if a := at["a.test"]; a.Allowed != 6 || a.Refused != 1 || a.BytesIn != 110 || a.BytesOut != 1 {
		t.Errorf("a.test: %+v", a)
	}
	if b := at["b.test"]; b.Refused != 7 {
		t.Errorf("b.test: %+v", b)
	}
	if l, ok := at["late.test"]; !ok || l.BytesOut != 1<<30 {
		t.Errorf("late.test, allowed after a flood of refused names, has no entry of its own: %+v", l)
	}
	if refusedOnly > MaxNames/2 {
		t.Errorf("%d entries of names only refused, want at most %d", refusedOnly, MaxNames/2)
	}
	if want := 6 + 1 + 7 + 2*MaxNames + 1 + 2*MaxNames; total != want {
		t.Errorf("%d decisions counted, want %d", total, want)
	}
	if _, ok := at[OtherNames]; !ok {
		t.Errorf("no %s entry", OtherNames)
	}
}
