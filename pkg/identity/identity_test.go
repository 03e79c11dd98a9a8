package identity

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    ID
		wantErr string // substring of the error; empty means success
	}{
		{in: "spiffe://airlock.test/service/authority", want: ID{TrustDomain: "airlock.test", Kind: KindService, Name: "authority"}},
		{in: "spiffe://airlock.test/service/executor", want: ID{TrustDomain: "airlock.test", Kind: KindService, Name: "executor"}},
		{in: "spiffe://airlock.test/service/executor/exec-1", want: ID{TrustDomain: "airlock.test", Kind: KindService, Name: "executor", Instance: "exec-1"}},
		{in: "spiffe://airlock.test/service/authority/a1", wantErr: "path must be"},
		{in: "spiffe://airlock.test/client/dev/x", wantErr: "path must be"},
		{in: "spiffe://airlock.test/service/executor/", wantErr: "executor instance: name is empty"},
		{in: "spiffe://airlock.test/service/executor/..", wantErr: "executor instance: name must not start"},
		{in: "spiffe://airlock.test/service/executor/A", wantErr: "executor instance: name has character"},
		{in: "spiffe://airlock.test/service/executor/a/b", wantErr: "path must be"},
		{in: "spiffe://airlock.test/service/executor/default", wantErr: `executor instance: "default" names the executor whose certificate names none`},
		{in: "spiffe://airlock.test/service/publisher", want: ID{TrustDomain: "airlock.test", Kind: KindService, Name: "publisher"}},
		{in: "spiffe://airlock.test/client/dev", want: ID{TrustDomain: "airlock.test", Kind: KindClient, Name: "dev"}},
		{in: "spiffe://airlock.test/approver/alice.smith", want: ID{TrustDomain: "airlock.test", Kind: KindApprover, Name: "alice.smith"}},
		{in: "spiffe://a/pipeline/deploy_main-2", want: ID{TrustDomain: "a", Kind: KindPipeline, Name: "deploy_main-2"}},
		{in: "spiffe://my_domain-1.example/client/0", want: ID{TrustDomain: "my_domain-1.example", Kind: KindClient, Name: "0"}},
		{in: "spiffe://airlock.test/client/" + strings.Repeat("a", 64), want: ID{TrustDomain: "airlock.test", Kind: KindClient, Name: strings.Repeat("a", 64)}},
		{in: "spiffe://" + strings.Repeat("d", 255) + "/client/x", want: ID{TrustDomain: strings.Repeat("d", 255), Kind: KindClient, Name: "x"}},

		{in: "", wantErr: "must start with spiffe://"},
		{in: "airlock.test/client/dev", wantErr: "must start with spiffe://"},
		{in: "https://airlock.test/client/dev", wantErr: "must start with spiffe://"},
		{in: "SPIFFE://airlock.test/client/dev", wantErr: "must start with spiffe://"},
		{in: "spiffe:/airlock.test/client/dev", wantErr: "must start with spiffe://"},
		{in: "spiffe://", wantErr: "trust domain is empty"},
		{in: "spiffe:///client/dev", wantErr: "trust domain is empty"},
		{in: "spiffe://airlock.test", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test/", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test/client", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test/client/dev/extra", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test/client/dev/", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test//client/dev", wantErr: "path must be /KIND/NAME"},
		{in: "spiffe://airlock.test/client/", wantErr: "name is empty"},
		{in: "spiffe://airlock.test//dev", wantErr: `unknown kind ""`},
		{in: "spiffe://airlock.test/admin/dev", wantErr: `unknown kind "admin"`},
		{in: "spiffe://airlock.test/Client/dev", wantErr: `unknown kind "Client"`},
		{in: "spiffe://airlock.test/service/dev", wantErr: `unknown service "dev"`},
		{in: "spiffe://airlock.test/service/Authority", wantErr: `name has character 'A'`},
		{in: "spiffe://airlock.test/service/authority2", wantErr: `unknown service "authority2"`},
		{in: "spiffe://airlock.test/client/Dev", wantErr: `name has character 'D'`},
		{in: "spiffe://airlock.test/client/a%2Fb", wantErr: `name has character '%'`},
		{in: "spiffe://airlock.test/client/d v", wantErr: `name has character ' '`},
		{in: "spiffe://airlock.test/client/.hidden", wantErr: `name must not start with '.'`},
		{in: "spiffe://airlock.test/client/..", wantErr: `name must not start with '.'`},
		{in: "spiffe://airlock.test/client/-x", wantErr: `name must not start with '-'`},
		{in: "spiffe://airlock.test/client/" + strings.Repeat("a", 65), wantErr: "name is 65 characters, want at most 64"},
		{in: "spiffe://" + strings.Repeat("d", 256) + "/client/x", wantErr: "trust domain is 256 characters, want at most 255"},
		{in: "spiffe://Airlock.test/client/dev", wantErr: `trust domain has character 'A'`},
		{in: "spiffe://airlock.test:8443/client/dev", wantErr: "must not have a port"},
		{in: "spiffe://user@airlock.test/client/dev", wantErr: "must not have userinfo"},
		{in: "spiffe://airlock.test/client/dev?x=1", wantErr: "must not have a query or fragment"},
		{in: "spiffe://airlock.test/client/dev#frag", wantErr: "must not have a query or fragment"},
		{in: "spiffe://airlock.test/client/dev?", wantErr: "must not have a query or fragment"},
		{in: "spiffe://[::1]/client/dev", wantErr: "trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse(%q) = %v, want success", tt.in, err)
				}
				if got != tt.want {
					t.Fatalf("Parse(%q) = %#v, want %#v", tt.in, got, tt.want)
				}
				if s := got.String(); s != tt.in {
					t.Fatalf("String() = %q, want the input %q back", s, tt.in)
				}
				if u := got.URL().String(); u != tt.in {
					t.Fatalf("URL().String() = %q, want %q", u, tt.in)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse(%q) = %#v, want an error containing %q", tt.in, got, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidID) {
				t.Errorf("Parse(%q) error %v does not wrap ErrInvalidID", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
			}
			// The message must quote the offending input so a log line is
			// enough to find the bad configuration.
			if !strings.HasPrefix(err.Error(), `identity: invalid SPIFFE ID "`) {
				t.Errorf("Parse(%q) error = %q, want the input quoted after the sentinel text", tt.in, err)
			}
			if !got.IsZero() {
				t.Errorf("Parse(%q) returned non-zero ID %#v alongside an error", tt.in, got)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		td      string
		kind    Kind
		id      string
		wantErr string
	}{
		{name: "client", td: "airlock.test", kind: KindClient, id: "dev"},
		{name: "service", td: "airlock.test", kind: KindService, id: "executor"},
		{name: "unknown service", td: "airlock.test", kind: KindService, id: "dev", wantErr: `unknown service "dev"`},
		{name: "unknown kind", td: "airlock.test", kind: "robot", id: "dev", wantErr: `unknown kind "robot"`},
		{name: "bad trust domain", td: "Airlock", kind: KindClient, id: "dev", wantErr: "trust domain has character 'A'"},
		{name: "slash in name", td: "airlock.test", kind: KindClient, id: "a/b", wantErr: "name has character '/'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(tt.td, tt.kind, tt.id)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalidID) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New() error = %v, want ErrInvalidID containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() = %v", err)
			}
			back, err := Parse(got.String())
			if err != nil || back != got {
				t.Fatalf("Parse(New().String()) = %#v, %v; want %#v", back, err, got)
			}
		})
	}
}

func TestService(t *testing.T) {
	for _, name := range ServiceNames() {
		id := Service("airlock.test", name)
		if id.Kind != KindService || id.Name != name || id.TrustDomain != "airlock.test" {
			t.Errorf("Service(%q) = %#v", name, id)
		}
	}
	for _, bad := range [][2]string{{"airlock.test", "dev"}, {"", "executor"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Service(%q, %q) did not panic", bad[0], bad[1])
				}
			}()
			Service(bad[0], bad[1])
		}()
	}
}

func TestMustParsePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("MustParse of an invalid ID did not panic")
		}
	}()
	MustParse("spiffe://airlock.test/nobody/x")
}

func TestAccessors(t *testing.T) {
	id := MustParse("spiffe://airlock.test/client/dev")
	if got := id.Principal(); got != "client/dev" {
		t.Errorf("Principal() = %q, want client/dev", got)
	}
	if !id.MemberOf("airlock.test") || id.MemberOf("other.test") {
		t.Errorf("MemberOf is wrong for %v", id)
	}
	if id.IsZero() {
		t.Error("IsZero() of a parsed ID is true")
	}
	var zero ID
	if !zero.IsZero() || zero.String() != "" || zero.MemberOf("") {
		t.Errorf("zero ID: IsZero=%v String=%q MemberOf(\"\")=%v", zero.IsZero(), zero.String(), zero.MemberOf(""))
	}
}

func TestKindsAreFresh(t *testing.T) {
	k := Kinds()
	if len(k) != 5 {
		t.Fatalf("Kinds() = %v, want 5 kinds", k)
	}
	k[0] = "tampered"
	if Kinds()[0] != KindService {
		t.Fatal("Kinds() returned a shared slice that callers can corrupt")
	}
}

// TestValidateTrustDomain checks the errors name the trust domain once,
// with no package prefix: they follow a config field's path.
func TestValidateTrustDomain(t *testing.T) {
	if err := ValidateTrustDomain("airlock.test"); err != nil {
		t.Errorf("ValidateTrustDomain(airlock.test) = %v", err)
	}
	for bad, want := range map[string]string{
		"":                       `invalid trust domain "": is empty`,
		"a:1":                    `invalid trust domain "a:1": must not have a port`,
		"A":                      `invalid trust domain "A": has character 'A', want only a-z 0-9 . - _`,
		"a/b":                    `invalid trust domain "a/b": has character '/', want only a-z 0-9 . - _`,
		"u@a":                    `invalid trust domain "u@a": must not have userinfo`,
		strings.Repeat("d", 256): `invalid trust domain "` + strings.Repeat("d", 256) + `": is 256 characters, want at most 255`,
	} {
		if err := ValidateTrustDomain(bad); err == nil || err.Error() != want {
			t.Errorf("ValidateTrustDomain(%q) = %v, want %s", bad, err, want)
		}
	}
}

func TestExecutorInstance(t *testing.T) {
	id, err := Executor("airlock.test", "exec-2")
	if err != nil {
		t.Fatal(err)
	}
	if got := id.String(); got != "spiffe://airlock.test/service/executor/exec-2" {
		t.Errorf("String = %q", got)
	}
	if got := id.Principal(); got != "service/executor/exec-2" {
		t.Errorf("Principal = %q", got)
	}
	if back, err := Parse(id.String()); err != nil || back != id {
		t.Errorf("Parse(String) = %v, %v; want %v", back, err, id)
	}
	if u := id.URL().String(); u != id.String() {
		t.Errorf("URL = %q, want %q", u, id.String())
	}
	if !id.IsExecutor() || !Service("airlock.test", ServiceExecutor).IsExecutor() || Service("airlock.test", ServiceAuthority).IsExecutor() {
		t.Error("IsExecutor is wrong")
	}
	if id == Service("airlock.test", ServiceExecutor) {
		t.Error("an executor of a fleet equals the single executor's identity")
	}
	for _, bad := range []string{"A", "..", strings.Repeat("x", 65)} {
		if _, err := Executor("airlock.test", bad); err == nil {
			t.Errorf("Executor(%q) succeeded", bad)
		}
	}
	if _, err := New("airlock.test", KindService, "authority"); err != nil {
		t.Fatal(err)
	}
	if err := (ID{TrustDomain: "airlock.test", Kind: KindClient, Name: "a", Instance: "b"}).validate(); err == nil {
		t.Error("a client with an instance validated")
	}
}
