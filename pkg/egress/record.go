package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
	"unicode/utf8"
)

// The ways a Record's connection or query reached the executor.
const (
	ViaConnect     = "connect"     // the explicit proxy's CONNECT (TLS)
	ViaHTTP        = "http"        // the explicit proxy's absolute-URI request
	ViaTransparent = "transparent" // TCP 80 or 443 the kernel redirected
	ViaDNS         = "dns"         // a query to the job's DNS server
	// ViaRequest is one HTTP request inside an intercepted TLS connection
	// to a brokered credential's host: the connection itself has its own
	// line (connect or transparent); this one says what went over it.
	ViaRequest = "request"
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
	// ClosedFirst is the end that closed its side first, when one did (a
	// reset, an idle or a cut connection has none).
	ClosedFirst Side `json:"closed_first,omitempty"`
	// TLS is what the record layer showed of an allowed connection that
	// began with a ClientHello; nil for plain HTTP and refusals.
	TLS *TLS `json:"tls,omitempty"`
	// Suppressed, when not zero, makes this a summary of that many
	// decisions (refusals, or allowed ones when Allowed) not recorded one
	// by one: refusals past the cap per name per minute, or anything past
	// the record's own cap, whose bytes the summary carries.
	Suppressed int `json:"suppressed,omitempty"`

	// A request line's (ViaRequest) method, path without its query, the
	// upstream's status (0 when none came back) and the brokered
	// credential added to it ("" when none was). Allowed says whether it
	// went upstream; BytesIn and BytesOut are its response's and
	// request's bodies.
	Method     string `json:"method,omitempty"`
	Path       string `json:"path,omitempty"`
	Status     int    `json:"status,omitempty"`
	Credential string `json:"credential,omitempty"`
}

// Count is how many decisions r stands for: one, or the ones a summary
// counts.
func (r Record) Count() int { return max(r.Suppressed, 1) }

// MaxText is the longest name, reason, address or end a Record keeps: a
// job chooses most of them (an SNI, a question's name), and one long one
// must not crowd out the rest of the record. Cut shortens to it.
const MaxText = 1024

// Cut shortens s to at most n bytes on a rune boundary, marking the cut.
func Cut(s string, n int) string {
	const mark = " [cut]"
	if len(s) <= n {
		return s
	}
	k := max(n-len(mark), 0)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k] + mark
}

// Bounded is r with every text cut to MaxText and at most 16 answers, as
// a record is written.
func (r Record) Bounded() Record {
	r.Name, r.Reason, r.Addr, r.End, r.QType = Cut(r.Name, MaxText), Cut(r.Reason, MaxText), Cut(r.Addr, MaxText), Cut(r.End, MaxText), Cut(r.QType, 16)
	r.Method, r.Path, r.Credential = Cut(r.Method, 32), Cut(r.Path, MaxText), Cut(r.Credential, 256)
	r.TLS = r.TLS.Bounded()
	if !r.ClosedFirst.Known() {
		r.ClosedFirst = ""
	}
	if len(r.Answers) > 16 {
		r.Answers = r.Answers[:16]
	}
	return r
}

// maxLine is the longest line ReadRecords takes as a record; a bounded
// record is far shorter.
const maxLine = 64 << 10

// ScanRecords reads egress.jsonl, handing each record to fn in order, and
// returns how many lines it holds. A line that is not a record (longer
// than a bounded record can be, or not JSON) is skipped, counted, and
// reported in err once the rest is read.
func ScanRecords(r io.Reader, fn func(Record)) (lines int, err error) {
	br := bufio.NewReaderSize(r, maxLine)
	var bad []int
	for {
		b, rerr := br.ReadSlice('\n')
		long := errors.Is(rerr, bufio.ErrBufferFull)
		for errors.Is(rerr, bufio.ErrBufferFull) {
			_, rerr = br.ReadSlice('\n') // the rest of a line too long to keep
		}
		if len(b) == 0 && rerr != nil {
			if rerr != io.EOF {
				return lines, fmt.Errorf("egress.jsonl line %d: %v", lines+1, rerr)
			}
			break
		}
		lines++
		var rec Record
		if long || json.Unmarshal(b, &rec) != nil {
			bad = append(bad, lines)
		} else {
			fn(rec)
		}
		if rerr == io.EOF {
			break
		}
	}
	if len(bad) > 0 {
		return lines, fmt.Errorf("egress.jsonl: %d lines are not records (the first: line %d)", len(bad), bad[0])
	}
	return lines, nil
}

// ReadRecords reads every record of egress.jsonl (ScanRecords).
func ReadRecords(r io.Reader) ([]Record, error) {
	var recs []Record
	_, err := ScanRecords(r, func(rec Record) { recs = append(recs, rec) })
	return recs, err
}

// NameSummary is what a job's records say about one name.
type NameSummary struct {
	Name              string
	Allowed, Refused  int
	BytesIn, BytesOut int64
}

// Summary totals records by name, the names in order of first use. It
// keeps at most MaxNames entries, OtherNames among them, under which the
// rest are totalled; names refused and never allowed take at most half of
// them, so a job cannot crowd the names it used out with names it tried.
type Summary struct {
	names   []NameSummary
	at      map[string]int
	refused int // entries of names only ever refused when they came
	creds   []CredentialSummary
}

// CredentialSummary is what a job's request lines say about one brokered
// credential: requests it was added to, requests to its hosts refused,
// and their bytes.
type CredentialSummary struct {
	Name              string
	Requests, Refused int
	BytesIn, BytesOut int64
}

// MaxCredentials bounds the credentials a Summary counts (a job asks for
// at most 16); request lines naming others are not counted.
const MaxCredentials = 64

// MaxNames is how many entries a Summary keeps, OtherNames included.
const MaxNames = 1000

// OtherNames is the name a Summary totals names past MaxNames under.
const OtherNames = "(other names)"

// Add counts r.
func (s *Summary) Add(r Record) {
	if r.Via == ViaRequest {
		// A request's bytes are its connection's too: it counts for its
		// credential, never again for its name.
		s.addRequest(r)
		return
	}
	if s.at == nil {
		s.at = map[string]int{}
	}
	name := r.Name
	if _, ok := s.at[name]; !ok {
		full := len(s.names) >= MaxNames-1
		if !r.Allowed && s.refused >= MaxNames/2 {
			full = true
		}
		if full {
			name = OtherNames
		}
	}
	i, ok := s.at[name]
	if !ok {
		i = len(s.names)
		s.at[name] = i
		s.names = append(s.names, NameSummary{Name: name})
		if !r.Allowed && name != OtherNames {
			s.refused++
		}
	}
	n := &s.names[i]
	if r.Allowed {
		n.Allowed += r.Count()
	} else {
		n.Refused += r.Count()
	}
	n.BytesIn += r.BytesIn
	n.BytesOut += r.BytesOut
}

// addRequest counts request line r for its credential.
func (s *Summary) addRequest(r Record) {
	if r.Credential == "" {
		return
	}
	i := slices.IndexFunc(s.creds, func(c CredentialSummary) bool { return c.Name == r.Credential })
	if i < 0 {
		if len(s.creds) >= MaxCredentials {
			return
		}
		i = len(s.creds)
		s.creds = append(s.creds, CredentialSummary{Name: r.Credential})
	}
	c := &s.creds[i]
	if r.Allowed {
		c.Requests += r.Count()
	} else {
		c.Refused += r.Count()
	}
	c.BytesIn += r.BytesIn
	c.BytesOut += r.BytesOut
}

// Names is the totals so far.
func (s *Summary) Names() []NameSummary { return slices.Clone(s.names) }

// Credentials is the brokered credentials' totals so far, in order of
// first use.
func (s *Summary) Credentials() []CredentialSummary { return slices.Clone(s.creds) }

// Summarize totals recs by name (Summary).
func Summarize(recs []Record) []NameSummary {
	var s Summary
	for _, r := range recs {
		s.Add(r)
	}
	return s.Names()
}
