package selftest

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/pkg/termtext"
)

// Status is how a row or one of its checks came out.
type Status string

// The statuses, one word each everywhere (text, JSON, JUnit).
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Check is one assertion of a row: what was tried, and what was seen.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Record is what a row ran on, so that a later image, runtime or policy
// change shows up as a different row: the runtime class and its version,
// the template (or image) digest, the resource shape (of the row's first
// job) and a digest of the policies all of the row's jobs ran with.
type Record struct {
	RuntimeClass   string   `json:"runtime_class,omitempty"`
	RuntimeVersion string   `json:"runtime_version,omitempty"`
	Template       string   `json:"template,omitempty"`
	Shape          string   `json:"shape,omitempty"`
	PolicyDigest   string   `json:"policy_digest,omitempty"`
	Jobs           []string `json:"jobs,omitempty"`
	// Each is every job's (and session's) own shape and policy digest;
	// PolicyDigest is the digest over all of them, in the row's order.
	Each []JobRecord `json:"each,omitempty"`
}

// JobRecord is what one job of a row ran with.
type JobRecord struct {
	Job          string `json:"job"`
	Shape        string `json:"shape,omitempty"`
	PolicyDigest string `json:"policy_digest,omitempty"`
}

// Row is one named part of the validation plan, for one runtime class.
type Row struct {
	Name     string        `json:"name"`
	Runtime  string        `json:"runtime"`
	Status   Status        `json:"status"`
	Detail   string        `json:"detail,omitempty"`
	Checks   []Check       `json:"checks"`
	Record   Record        `json:"record"`
	Duration time.Duration `json:"duration_ns"`
}

// ID is the row's name with its runtime: "limits[runc]".
func (r *Row) ID() string { return r.Name + "[" + r.Runtime + "]" }

// pass, fail and skip add a check to the row.
func (r *Row) pass(name, format string, args ...any) { r.add(name, Pass, format, args...) }
func (r *Row) fail(name, format string, args ...any) { r.add(name, Fail, format, args...) }
func (r *Row) skip(name, format string, args ...any) { r.add(name, Skip, format, args...) }

func (r *Row) add(name string, st Status, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Status: st, Detail: fmt.Sprintf(format, args...)})
}

// verdict adds a pass with passed when ok, else a fail with failed.
func (r *Row) verdict(name string, ok bool, passed, failed string) {
	if ok {
		r.add(name, Pass, "%s", passed)
	} else {
		r.add(name, Fail, "%s", failed)
	}
}

// check adds a pass when ok, else a fail, with the same detail.
func (r *Row) check(name string, ok bool, format string, args ...any) {
	if ok {
		r.pass(name, format, args...)
	} else {
		r.fail(name, format, args...)
	}
}

// settle sets the row's status from its checks: fail when any failed,
// skip when every one was skipped (or there were none), else pass.
func (r *Row) settle() {
	r.Status = Skip
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			r.Status = Fail
			return
		case Pass:
			r.Status = Pass
		}
	}
}

// Report is the outcome of one selftest run.
type Report struct {
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Tenant   string        `json:"tenant"`
	Rows     []*Row        `json:"rows"`
}

// Failed lists the ids of the rows that failed.
func (rep *Report) Failed() []string {
	var out []string
	for _, r := range rep.Rows {
		if r.Status == Fail {
			out = append(out, r.ID())
		}
	}
	return out
}

// WriteText writes the report for people: a table of rows, then every
// check of each row, then the record. Text that may come from a job or
// a server is escaped.
func (rep *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROW\tRUNTIME\tSTATUS\tTIME\tDETAIL")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Runtime, strings.ToUpper(string(r.Status)), r.Duration.Round(10*time.Millisecond), termtext.Line(r.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "\n%s: %s\n", r.ID(), r.Status)
		for _, c := range r.Checks {
			fmt.Fprintf(w, "  %-4s %s: %s\n", c.Status, c.Name, termtext.Line(c.Detail))
		}
		rec := r.Record
		fmt.Fprintf(w, "  ran on: runtime %s %s, template %s, shape %s, policy %s\n",
			orDash(rec.RuntimeClass), termtext.Line(orDash(rec.RuntimeVersion)), termtext.Line(orDash(rec.Template)), orDash(rec.Shape), orDash(rec.PolicyDigest))
	}
	failed := rep.Failed()
	if len(failed) == 0 {
		_, err := fmt.Fprintf(w, "\nselftest passed: %d rows in %s\n", len(rep.Rows), rep.Duration.Round(10*time.Millisecond))
		return err
	}
	_, err := fmt.Fprintf(w, "\nselftest FAILED: %s\n", strings.Join(failed, ", "))
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// JUnit XML, as CI systems read it: one testsuite, one testcase per row
// (classname "airlock.selftest.RUNTIME"), a failure element naming the
// failed checks, skipped for a skipped row, the record as properties and
// a skipped_checks property naming the checks a passed row skipped.

// JUnitSuites is the document's root.
type JUnitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []JUnitSuite `xml:"testsuite"`
}

// JUnitSuite is the run.
type JUnitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr"`
	Cases     []JUnitCase `xml:"testcase"`
}

// JUnitCase is one row.
type JUnitCase struct {
	Name       string          `xml:"name,attr"`
	Classname  string          `xml:"classname,attr"`
	Time       string          `xml:"time,attr"`
	Properties []JUnitProperty `xml:"properties>property,omitempty"`
	Failure    *JUnitFailure   `xml:"failure,omitempty"`
	Skipped    *JUnitSkipped   `xml:"skipped,omitempty"`
	SystemOut  string          `xml:"system-out,omitempty"`
}

// JUnitProperty is one field of a row's record.
type JUnitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

// JUnitFailure says which checks failed.
type JUnitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// JUnitSkipped says why a row did not run.
type JUnitSkipped struct {
	Message string `xml:"message,attr"`
}

// JUnit is the report as a JUnit document.
func (rep *Report) JUnit() JUnitSuites {
	suite := JUnitSuite{Name: "airlock selftest", Tests: len(rep.Rows), Time: seconds(rep.Duration), Timestamp: rep.Started.UTC().Format(time.RFC3339)}
	for _, r := range rep.Rows {
		c := JUnitCase{Name: r.Name, Classname: "airlock.selftest." + r.Runtime, Time: seconds(r.Duration)}
		rec := r.Record
		for _, p := range []JUnitProperty{
			{"runtime_class", rec.RuntimeClass}, {"runtime_version", rec.RuntimeVersion}, {"template", rec.Template},
			{"shape", rec.Shape}, {"policy_digest", rec.PolicyDigest}, {"jobs", strings.Join(rec.Jobs, " ")},
		} {
			if p.Value != "" {
				c.Properties = append(c.Properties, p)
			}
		}
		var lines, failed, skipped []string
		for _, ch := range r.Checks {
			lines = append(lines, fmt.Sprintf("%s %s: %s", ch.Status, ch.Name, ch.Detail))
			switch ch.Status {
			case Fail:
				failed = append(failed, ch.Name)
			case Skip:
				skipped = append(skipped, ch.Name)
			}
		}
		// A passed row with skipped checks says which, so CI does not
		// read it as fully green.
		if len(skipped) > 0 {
			c.Properties = append(c.Properties, JUnitProperty{"skipped_checks", strings.Join(skipped, ", ")})
		}
		c.SystemOut = strings.Join(lines, "\n")
		switch r.Status {
		case Fail:
			suite.Failures++
			c.Failure = &JUnitFailure{Message: r.ID() + " failed: " + strings.Join(failed, ", "), Text: c.SystemOut}
		case Skip:
			suite.Skipped++
			c.Skipped = &JUnitSkipped{Message: r.Detail}
		}
		suite.Cases = append(suite.Cases, c)
	}
	return JUnitSuites{Suites: []JUnitSuite{suite}}
}

// WriteJUnit writes the report as JUnit XML.
func (rep *Report) WriteJUnit(w io.Writer) error {
	data, err := xml.MarshalIndent(rep.JUnit(), "", "  ")
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }
