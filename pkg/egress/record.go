package egress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// The ways a Record's connection or query reached the executor.
const (
	ViaConnect     = "connect"     // the explicit proxy's CONNECT (TLS)
	ViaHTTP        = "http"        // the explicit proxy's absolute-URI request
	ViaTransparent = "transparent" // TCP 80 or 443 the kernel redirected
	ViaDNS         = "dns"         // a query to the job's DNS server
)

// Record is one line of a job's egress.jsonl, the record of everything the
// job's domain policy decided: one connection through the egress proxy or
// one query to its DNS server. Strings in it come from the job (a name, an
// SNI): show them escaped.
type Record struct {
	Time time.Time `json:"time"`
	// Via is one of the Via constants.
	Via string `json:"via"`
	// Name is the name decided on (normalised when it is one; as the job
	// sent it otherwise); "" when none was read.
	Name string `json:"name,omitempty"`
	// Port is the TCP port asked for (connections only).
	Port uint16 `json:"port,omitempty"`
	// QType is the question's type, "A" or "AAAA" (queries only).
	QType   string `json:"qtype,omitempty"`
	Allowed bool   `json:"allowed"`
	// Reason is the rule that allowed it, or what refused it.
	Reason string `json:"reason"`
	// Addr is the vetted address the proxy connected to; Answers the
	// addresses a query was answered with.
	Addr    string   `json:"addr,omitempty"`
	Answers []string `json:"answers,omitempty"`
	// BytesIn went to the job, BytesOut from it (connections only).
	BytesIn  int64 `json:"bytes_in,omitempty"`
	BytesOut int64 `json:"bytes_out,omitempty"`
	// DurationMS is how long the connection was open.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// End says how an allowed connection ended.
	End string `json:"end,omitempty"`
	// Suppressed, when not zero, makes this a summary of that many
	// refusals not recorded one by one (the cap per name per minute).
	Suppressed int `json:"suppressed,omitempty"`
}

// Refusals counts the refusals r stands for: one, or the ones a summary
// counts.
func (r Record) Refusals() int {
	switch {
	case r.Allowed:
		return 0
	case r.Suppressed > 0:
		return r.Suppressed
	}
	return 1
}

// MaxRecordLine is the longest line ReadRecords takes.
const MaxRecordLine = 64 << 10

// ReadRecords reads egress.jsonl, at most max records (0: all); more says
// whether records were left unread.
func ReadRecords(r io.Reader, max int) (recs []Record, more bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxRecordLine)
	line := 0
	for sc.Scan() {
		line++
		if max > 0 && len(recs) == max {
			return recs, true, nil
		}
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return recs, false, fmt.Errorf("egress.jsonl line %d: %v", line, err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return recs, false, fmt.Errorf("egress.jsonl line %d: %v", line+1, err)
	}
	return recs, false, nil
}

// NameSummary is what a job's records say about one name.
type NameSummary struct {
	Name              string
	Allowed, Refused  int
	BytesIn, BytesOut int64
}

// Summarize totals records by name, the names in order of first use.
func Summarize(recs []Record) []NameSummary {
	var out []NameSummary
	at := map[string]int{}
	for _, r := range recs {
		i, ok := at[r.Name]
		if !ok {
			i = len(out)
			at[r.Name] = i
			out = append(out, NameSummary{Name: r.Name})
		}
		s := &out[i]
		if r.Allowed {
			s.Allowed++
		}
		s.Refused += r.Refusals()
		s.BytesIn += r.BytesIn
		s.BytesOut += r.BytesOut
	}
	return slices.Clip(out)
}
