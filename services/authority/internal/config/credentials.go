package config

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// CredentialFile is one brokered credential as the file writes it.
type CredentialFile struct {
	// Hosts are the names the job's egress proxy adds it for: exact names
	// or "*.SUFFIX"; each within the tenant's egress.domains.
	Hosts []string `yaml:"hosts"`
	// Inject is how it is added to a request; default
	// {header: Authorization, format: "Bearer {value}"}.
	Inject InjectFile `yaml:"inject"`
	// Source is where the authority reads it when it is leased: exactly
	// one of a file and an environment variable.
	Source SourceFile `yaml:"source"`
	// Approval is none (the default) or required: a job asking for it
	// waits, queued, until an approver who is not its requester approves
	// its start.
	Approval string `yaml:"approval"`
	// MaxTTL bounds a lease of it; default 1h, between 1m and 24h.
	MaxTTL time.Duration `yaml:"max_ttl"`
	// UpstreamCA is a PEM file of the CAs its hosts' certificates must
	// chain to; optional (the executor's roots).
	UpstreamCA string `yaml:"upstream_ca"`
}

// InjectFile is how a brokered credential is added to a request: a header
// whose value is Format with "{value}" replaced, or Basic authentication
// as BasicUser.
type InjectFile struct {
	Header    string `yaml:"header"`
	Format    string `yaml:"format"`
	BasicUser string `yaml:"basic_user"`
}

// SourceFile is where a brokered credential's value is: a file, or an
// environment variable of the authority.
type SourceFile struct {
	File string `yaml:"file"`
	Env  string `yaml:"env"`
}

const (
	// maxCredentials bounds a tenant's brokered credentials.
	maxCredentials = 32
	// defaultCredentialTTL and maxCredentialTTL bound a brokered lease.
	defaultCredentialTTL = time.Hour
	maxCredentialTTL     = 24 * time.Hour
	// valuePlaceholder stands for the secret in an inject format.
	valuePlaceholder = "{value}"
)

// refusedHeaders are headers a credential must not be injected as: the
// hop-by-hop ones and those that frame or route the request.
var refusedHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length"}

// credentials checks a tenant's brokered credentials against its egress
// ceiling, so every credential can be used by some job.
func (c *Config) credentials(field string, ceiling policy.Egress, f map[string]CredentialFile) (map[string]policy.Credential, []error) {
	out := map[string]policy.Credential{}
	var errs []error
	if len(f) > maxCredentials {
		errs = append(errs, config.Field(field, "%d credentials: at most %d", len(f), maxCredentials))
	}
	envs := map[string]string{}
	for _, name := range sortedKeys(f) {
		// A job may ask for any of them together: each needs a variable
		// of its own for its placeholder.
		if other, ok := envs[runspec.CredentialEnv(name)]; ok {
			errs = append(errs, config.Field(field+"."+name, "the same placeholder variable %s as credential %q: rename one", runspec.CredentialEnv(name), other))
		}
		envs[runspec.CredentialEnv(name)] = name
		cr, err := c.credential(field+"."+name, name, ceiling, f[name])
		errs = append(errs, err...)
		if len(err) == 0 {
			out[name] = cr
		}
	}
	return out, errs
}

func (c *Config) credential(field, name string, ceiling policy.Egress, f CredentialFile) (policy.Credential, []error) {
	if err := policy.CheckName(name); err != nil {
		return policy.Credential{}, []error{config.Field(field, "credential name %v", err)}
	}
	var errs []error
	cr := policy.Credential{Name: name, Header: f.Inject.Header, Format: f.Inject.Format, BasicUser: f.Inject.BasicUser, MaxTTL: f.MaxTTL}
	if len(f.Hosts) == 0 {
		errs = append(errs, config.Field(field+".hosts", "at least one host (NAME or *.SUFFIX) is required"))
	}
	for i, h := range f.Hosts {
		hf := fmt.Sprintf("%s.hosts[%d]", field, i)
		host, err := egress.NormalizeName(h)
		switch {
		case err != nil:
			errs = append(errs, config.Field(hf, "%v", err))
		case !ceiling.AllowsDomain(host):
			errs = append(errs, config.Field(hf, "%q is not within the tenant's egress.domains: no job could reach it", host))
		default:
			cr.Hosts = append(cr.Hosts, host)
		}
	}
	errs = append(errs, checkInject(field+".inject", &cr)...)
	switch s := f.Source; {
	case (s.File == "") == (s.Env == ""):
		errs = append(errs, config.Field(field+".source", "exactly one of file and env is required"))
	case s.File != "":
		cr.File = resolve(c.base, s.File)
		if err := checkSecretFile(cr.File); err != nil {
			errs = append(errs, config.Field(field+".source.file", "%v", err))
		}
	default:
		// Only whether it is set: the value is read when it is leased.
		cr.Env = s.Env
		if v, ok := os.LookupEnv(s.Env); !ok || v == "" {
			errs = append(errs, config.Field(field+".source.env", "%s is not set in the authority's environment", s.Env))
		}
	}
	switch f.Approval {
	case "", "none":
	case "required":
		cr.ApprovalRequired = true
	default:
		errs = append(errs, config.Field(field+".approval", "%q: want none or required", f.Approval))
	}
	switch {
	case cr.MaxTTL == 0:
		cr.MaxTTL = defaultCredentialTTL
	case cr.MaxTTL < time.Minute || cr.MaxTTL > maxCredentialTTL:
		errs = append(errs, config.Field(field+".max_ttl", "%v: must be between 1m and %v", cr.MaxTTL, maxCredentialTTL))
	}
	if f.UpstreamCA != "" {
		cr.UpstreamCA = resolve(c.base, f.UpstreamCA)
		if _, err := tlsconfig.LoadRoots(cr.UpstreamCA); err != nil {
			errs = append(errs, config.Field(field+".upstream_ca", "%v", err))
		}
	}
	return cr, errs
}

// checkInject checks how a credential is added and fills in the defaults:
// the Authorization header, and a Bearer format unless it is Basic.
func checkInject(field string, cr *policy.Credential) []error {
	var errs []error
	if cr.Header == "" {
		cr.Header = "Authorization"
	}
	if !httpguts.ValidHeaderFieldName(cr.Header) {
		errs = append(errs, config.Field(field+".header", "%q is not an HTTP header name", cr.Header))
	} else {
		for _, h := range refusedHeaders {
			if strings.EqualFold(cr.Header, h) {
				errs = append(errs, config.Field(field+".header", "%q frames or routes the request: a credential cannot be set in it", cr.Header))
			}
		}
	}
	switch {
	case cr.Format != "" && cr.BasicUser != "":
		errs = append(errs, config.Field(field, "exactly one of format and basic_user"))
	case cr.BasicUser != "":
		if strings.ContainsAny(cr.BasicUser, ":\r\n") {
			errs = append(errs, config.Field(field+".basic_user", "must not hold ':', CR or LF"))
		}
	default:
		if cr.Format == "" {
			cr.Format = "Bearer " + valuePlaceholder
		}
		if n := strings.Count(cr.Format, valuePlaceholder); n != 1 {
			errs = append(errs, config.Field(field+".format", "must hold %s exactly once (it holds it %d times)", valuePlaceholder, n))
		}
		if strings.ContainsAny(cr.Format, "\r\n") {
			errs = append(errs, config.Field(field+".format", "must not hold CR or LF"))
		}
	}
	return errs
}

// checkSecretFile checks a file holding a secret without reading it: a
// regular file the authority can open.
func checkSecretFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}
