package egresspb

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/egress"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func hostile(n int) []egress.Record {
	long := strings.Repeat("x", 60<<10)
	out := make([]egress.Record, n)
	for i := range out {
		out[i] = egress.Record{Time: time.Unix(int64(i), 0), Via: egress.ViaConnect, Name: fmt.Sprint(i) + long, Reason: long, Addr: long, End: long}
	}
	return out
}

// However long the job made its names and reasons, a report's copy stays
// within Budget (so the report within gRPC's limit), keeps the first and
// the last decisions, and passes the authority's Check.
func TestLogStaysInBudget(t *testing.T) {
	first, last := hostile(2000), hostile(2000)
	names := []egress.NameSummary{{Name: strings.Repeat("n", 5000), Allowed: 3}}
	l := Log(first, last, 40000, names, nil)
	if size := proto.Size(l); size > Budget+16<<10 {
		t.Errorf("encoded %d bytes, budget %d", size, Budget)
	}
	if len(l.GetRecords()) == 0 || len(l.GetLast()) == 0 || len(l.GetRecords())+len(l.GetLast()) > MaxRecords {
		t.Errorf("%d first and %d last records", len(l.GetRecords()), len(l.GetLast()))
	}
	if !l.GetRecords()[0].GetTime().AsTime().Equal(time.Unix(0, 0)) || l.GetTotal() != 40000 {
		t.Errorf("first record %v, total %d", l.GetRecords()[0].GetTime().AsTime(), l.GetTotal())
	}
	if err := Check("detail.egress", l); err != nil {
		t.Errorf("Check of Log's own output: %v", err)
	}
	// A small record goes whole.
	small := Log([]egress.Record{{Via: egress.ViaDNS, Name: "a.test", QType: "A", Allowed: true}}, nil, 1, nil, nil)
	if got := Records(small.GetRecords()); len(got) != 1 || got[0].Name != "a.test" || got[0].QType != "A" || !got[0].Allowed {
		t.Errorf("round trip: %+v", got)
	}
}

// What a report may not carry is refused, naming the field.
func TestCheckRefuses(t *testing.T) {
	rec := func(f func(r *typesv1.EgressRecord)) *authorityv1.EgressLog {
		r := &typesv1.EgressRecord{Via: egress.ViaConnect, Name: "a.test", Port: 443}
		f(r)
		return &authorityv1.EgressLog{Records: []*typesv1.EgressRecord{r}, Total: 1}
	}
	for _, tc := range []struct {
		l    *authorityv1.EgressLog
		want string
	}{
		{rec(func(r *typesv1.EgressRecord) { r.Via = "smtp" }), "records[0].via"},
		{rec(func(r *typesv1.EgressRecord) { r.Port = 70000 }), "records[0].port"},
		{rec(func(r *typesv1.EgressRecord) { r.Qtype = "A\x1b[2J" }), "records[0].qtype"},
		{rec(func(r *typesv1.EgressRecord) { r.Name = strings.Repeat("x", MaxText+1) }), "records[0].name"},
		{rec(func(r *typesv1.EgressRecord) { r.Answers = make([]string, MaxAnswers+1) }), "records[0].answers"},
		{rec(func(r *typesv1.EgressRecord) { r.BytesIn = -1 }), "negative"},
		{&authorityv1.EgressLog{Records: make([]*typesv1.EgressRecord, MaxRecords+1), Total: MaxRecords + 1}, "at most 1000"},
		{&authorityv1.EgressLog{Records: []*typesv1.EgressRecord{{Via: egress.ViaDNS}}, Total: 0}, "total"},
		{&authorityv1.EgressLog{Last: []*typesv1.EgressRecord{{Via: "x"}}, Total: 1}, "last[0].via"},
		{&authorityv1.EgressLog{Names: []*authorityv1.EgressName{{Name: "a", Allowed: -3}}}, "names[0]"},
		{rec(func(r *typesv1.EgressRecord) { r.Via, r.Method = egress.ViaRequest, strings.Repeat("G", 33) }), "records[0].method"},
		{rec(func(r *typesv1.EgressRecord) { r.Via, r.Path = egress.ViaRequest, strings.Repeat("/", MaxText+1) }), "records[0].path"},
		{rec(func(r *typesv1.EgressRecord) { r.Via, r.Status = egress.ViaRequest, 1000 }), "records[0].status"},
		{rec(func(r *typesv1.EgressRecord) { r.Via, r.Credential = egress.ViaRequest, strings.Repeat("c", 257) }), "records[0].credential"},
		{&authorityv1.EgressLog{Credentials: []*authorityv1.CredentialUse{{Name: "gh", Refused: -1}}}, "credentials[0]"},
		{&authorityv1.EgressLog{Credentials: make([]*authorityv1.CredentialUse, egress.MaxCredentials+1)}, "credentials: 65"},
	} {
		err := Check("detail.egress", tc.l)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check = %v, want %q", err, tc.want)
		}
	}
	if err := Check("detail.egress", nil); err != nil {
		t.Errorf("no log: %v", err)
	}
}

// The summary by name fits its share of the budget however long the names
// (the rest totalled under OtherNames, which is kept), and names that had
// anything allowed come first; the last decisions kept are the newest.
func TestLogNamesAndLast(t *testing.T) {
	var names []egress.NameSummary
	for i := range 1000 {
		names = append(names, egress.NameSummary{Name: fmt.Sprint(i) + strings.Repeat("j", 1000), Refused: 1})
	}
	names = append(names, egress.NameSummary{Name: "upload.test", Allowed: 1, BytesOut: 1 << 30}, egress.NameSummary{Name: egress.OtherNames, Refused: 5})
	l := Log(nil, nil, 1006, names, nil)
	if size := proto.Size(&authorityv1.EgressLog{Names: l.GetNames()}); size > namesBudget+4<<10 {
		t.Errorf("names encoded in %d bytes, their share is %d", size, namesBudget)
	}
	got := Names(l)
	if got[0].Name != "upload.test" || got[0].BytesOut != 1<<30 {
		t.Errorf("first name %+v, want the one with bytes", got[0])
	}
	total := 0
	for _, n := range got {
		total += n.Allowed + n.Refused
	}
	if o := got[len(got)-1]; o.Name != egress.OtherNames || total != 1006 {
		t.Errorf("last entry %+v, total %d; want %s and every decision counted", o, total, egress.OtherNames)
	}
	if err := Check("detail.egress", l); err != nil {
		t.Errorf("Check: %v", err)
	}

	var last []egress.Record
	for i := range 500 {
		last = append(last, egress.Record{Via: egress.ViaDNS, Name: fmt.Sprintf("last%d", i), Reason: strings.Repeat("r", 1000)})
	}
	l = Log(nil, last, 500, nil, nil)
	recs := Records(l.GetLast())
	if len(recs) == 0 || len(recs) == 500 || recs[len(recs)-1].Name != "last499" {
		t.Errorf("%d of the last kept, the newest %q; want a cut that keeps last499", len(recs), recs[len(recs)-1].Name)
	}
}

// A request line and the credentials' uses survive the report's copy and
// its check.
func TestLogRequestLines(t *testing.T) {
	req := egress.Record{Via: egress.ViaRequest, Name: "api.test", Port: 443, Allowed: true, Reason: "credential gh",
		Method: "GET", Path: "/v1/x", Status: 200, Credential: "gh", BytesIn: 10, BytesOut: 3, DurationMS: 4}
	uses := []egress.CredentialSummary{{Name: "gh", Requests: 1, BytesIn: 10, BytesOut: 3}}
	l := Log([]egress.Record{req}, nil, 1, nil, uses)
	if err := Check("detail.egress", l); err != nil {
		t.Fatal(err)
	}
	if got := Records(l.GetRecords()); len(got) != 1 || !reflect.DeepEqual(got[0], req) {
		t.Errorf("records = %+v, want %+v", got, req)
	}
	if got := CredentialUses(l); !reflect.DeepEqual(got, uses) {
		t.Errorf("credentials = %+v, want %+v", got, uses)
	}
}
