// Package identity owns the SPIFFE IDs that name Airlock principals
// (spiffe://TRUST_DOMAIN/KIND/NAME): their syntax, their extraction from a
// peer's verified X.509 certificate, and the typed context key under which the
// caller's ID travels through a request. It imports only the standard library
// and grpc's peer and credentials packages, so any Airlock package may import
// it, including domain packages that must stay free of other grpc code.
package identity

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// ErrInvalidID is wrapped by every error about a malformed or unacceptable
// SPIFFE ID, so callers can tell a bad identity from other failures with
// errors.Is.
var ErrInvalidID = errors.New("identity: invalid SPIFFE ID")

// ErrNoID is wrapped when there is no identity to read at all: no peer, a
// connection not authenticated by TLS, or a certificate without a URI SAN.
var ErrNoID = errors.New("identity: no SPIFFE ID")

// Kind is the class of an Airlock principal, the first path segment of its ID.
// Authorization tables are written mostly in terms of kinds.
type Kind string

const (
	KindService  Kind = "service"
	KindClient   Kind = "client"
	KindApprover Kind = "approver"
	KindPipeline Kind = "pipeline"
	// KindOperator runs the deployment: it sees and drains the executor
	// fleet (executors, their capacity, the ids of the jobs placed on
	// them and the repositories they cache), and no job's content.
	KindOperator Kind = "operator"
)

// The only names a KindService ID may carry: there are exactly three Airlock
// services, and a certificate for any other "service" would be a way to sneak
// service-level trust to something that is not one.
const (
	ServiceAuthority = "authority"
	ServiceExecutor  = "executor"
	ServicePublisher = "publisher"
)

const (
	scheme            = "spiffe"
	maxTrustDomainLen = 255
	maxNameLen        = 64
)

// Kinds returns every kind in a fixed order. It returns a new slice each time
// so callers may modify it.
func Kinds() []Kind {
	return []Kind{KindService, KindClient, KindApprover, KindPipeline, KindOperator}
}

// ServiceNames returns the three names a KindService ID may carry.
func ServiceNames() []string {
	return []string{ServiceAuthority, ServiceExecutor, ServicePublisher}
}

// ID is a parsed, valid SPIFFE ID of an Airlock principal. The zero ID means
// "no identity"; every non-zero ID obtained from this package is valid.
// Constructing one by hand bypasses validation, so prefer New or Parse.
type ID struct {
	TrustDomain string
	Kind        Kind
	Name        string
	// Instance names one executor of a fleet
	// (spiffe://TRUST_DOMAIN/service/executor/INSTANCE); no other ID has
	// one. An executor without one is the single executor of a deployment
	// that has no fleet.
	Instance string
}

// New validates the parts and assembles an ID.
func New(trustDomain string, kind Kind, name string) (ID, error) {
	id := ID{TrustDomain: trustDomain, Kind: kind, Name: name}
	if err := id.validate(); err != nil {
		return ID{}, invalid(id.format(), err.Error())
	}
	return id, nil
}

// ReservedInstance is the fleet name of the executor whose certificate
// names no instance; no certificate may name it, so the fleet name is
// one identity's.
const ReservedInstance = "default"

// Executor returns the ID of the executor named instance ("" for the one
// executor of a deployment without a fleet), validated.
func Executor(trustDomain, instance string) (ID, error) {
	id := ID{TrustDomain: trustDomain, Kind: KindService, Name: ServiceExecutor, Instance: instance}
	if err := id.validate(); err != nil {
		return ID{}, invalid(id.format(), err.Error())
	}
	return id, nil
}

// Parse reads an ID in its one canonical form, spiffe://TRUST_DOMAIN/KIND/NAME
// (spiffe://TRUST_DOMAIN/service/executor/INSTANCE for an executor of a
// fleet).
// It is deliberately stricter than RFC 3986: no upper case, no percent
// escapes, no port, userinfo, query or fragment, so two different strings can
// never name the same principal.
func Parse(s string) (ID, error) {
	rest, ok := strings.CutPrefix(s, scheme+"://")
	if !ok {
		return ID{}, invalid(s, "must start with spiffe://")
	}
	if strings.ContainsAny(rest, "?#") {
		return ID{}, invalid(s, "must not have a query or fragment")
	}
	td, path, ok := strings.Cut(rest, "/")
	if err := validateTrustDomain(td); err != nil {
		return ID{}, invalid(s, "trust domain "+err.Error())
	}
	if !ok {
		return ID{}, invalid(s, "path must be /KIND/NAME")
	}
	segments := strings.Split(path, "/")
	var instance string
	if len(segments) == 3 && segments[0] == string(KindService) && segments[1] == ServiceExecutor {
		segments, instance = segments[:2], segments[2]
		if instance == "" {
			return ID{}, invalid(s, "executor instance: name is empty")
		}
	}
	if len(segments) != 2 {
		return ID{}, invalid(s, "path must be /KIND/NAME (or /service/executor/INSTANCE)")
	}
	id := ID{TrustDomain: td, Kind: Kind(segments[0]), Name: segments[1], Instance: instance}
	if err := id.validate(); err != nil {
		return ID{}, invalid(s, err.Error())
	}
	return id, nil
}

// MustParse is Parse for IDs written into code and tests, where a bad literal
// is a programming error.
func MustParse(s string) ID {
	id, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return id
}

// Service returns the ID of one of the three Airlock services. It panics on an
// invalid trust domain or a name outside ServiceNames, because both are
// constants or validated configuration by the time this is called.
func Service(trustDomain, name string) ID {
	id, err := New(trustDomain, KindService, name)
	if err != nil {
		panic(err)
	}
	return id
}

// ValidateTrustDomain reports whether td can be the trust domain of an ID, so
// that configuration can be checked before any ID is built from it. The
// error names the trust domain and why, once: a config file's field path
// or a caller's context goes before it.
func ValidateTrustDomain(td string) error {
	if err := validateTrustDomain(td); err != nil {
		return fmt.Errorf("invalid trust domain %q: %s", td, err)
	}
	return nil
}

// String returns the canonical form, or "" for the zero ID.
func (id ID) String() string {
	if id.IsZero() {
		return ""
	}
	return id.format()
}

// URL returns the ID as a URL, the form x509.Certificate.URIs holds.
func (id ID) URL() *url.URL {
	return &url.URL{Scheme: scheme, Host: id.TrustDomain, Path: "/" + id.Principal()}
}

// IsZero reports whether id is the zero ID, meaning no identity.
func (id ID) IsZero() bool {
	return id == ID{}
}

// Principal returns "KIND/NAME" ("service/executor/INSTANCE" for an
// executor of a fleet), the ID without its trust domain. Within one
// deployment every principal shares the trust domain, so this is the short
// form for logs, audit records and authorization tables.
func (id ID) Principal() string {
	if id.Instance != "" {
		return string(id.Kind) + "/" + id.Name + "/" + id.Instance
	}
	return string(id.Kind) + "/" + id.Name
}

// IsExecutor reports whether id is an executor's, of a fleet or not.
func (id ID) IsExecutor() bool {
	return id.Kind == KindService && id.Name == ServiceExecutor
}

// MemberOf reports whether id belongs to trust domain td.
func (id ID) MemberOf(td string) bool {
	return !id.IsZero() && id.TrustDomain == td
}

func (id ID) format() string {
	return scheme + "://" + id.TrustDomain + "/" + id.Principal()
}

func (id ID) validate() error {
	if err := validateTrustDomain(id.TrustDomain); err != nil {
		return fmt.Errorf("trust domain %v", err)
	}
	if !slices.Contains(Kinds(), id.Kind) {
		return fmt.Errorf("unknown kind %q (want one of %v)", id.Kind, Kinds())
	}
	if err := validateName(id.Name); err != nil {
		return err
	}
	if id.Kind == KindService && !slices.Contains(ServiceNames(), id.Name) {
		return fmt.Errorf("unknown service %q (want one of %v)", id.Name, ServiceNames())
	}
	if id.Instance != "" {
		if !id.IsExecutor() {
			return fmt.Errorf("only service/executor has an instance, not %s/%s", id.Kind, id.Name)
		}
		if err := validateName(id.Instance); err != nil {
			return fmt.Errorf("executor instance: %w", err)
		}
		if id.Instance == ReservedInstance {
			return fmt.Errorf("executor instance: %q names the executor whose certificate names none (spiffe://%s/service/executor)", ReservedInstance, id.TrustDomain)
		}
	}
	return nil
}

// validateTrustDomain says what is wrong with td as a predicate with no
// subject ("is empty"), for its callers to name the trust domain once.
func validateTrustDomain(td string) error {
	switch {
	case td == "":
		return errors.New("is empty")
	case len(td) > maxTrustDomainLen:
		return fmt.Errorf("is %d characters, want at most %d", len(td), maxTrustDomainLen)
	case strings.Contains(td, "@"):
		return errors.New("must not have userinfo")
	case strings.Contains(td, ":"):
		return errors.New("must not have a port")
	}
	for _, r := range td {
		if !isLowerAlnum(r) && r != '.' && r != '-' && r != '_' {
			return fmt.Errorf("has character %q, want only a-z 0-9 . - _", r)
		}
	}
	return nil
}

func validateName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > maxNameLen:
		return fmt.Errorf("name is %d characters, want at most %d", len(name), maxNameLen)
	case name[0] == '.' || name[0] == '-':
		// A leading dot would allow "." and "..", which read as path
		// traversal wherever a name becomes a file name (pki does that).
		return fmt.Errorf("name must not start with %q", name[0])
	}
	for _, r := range name {
		if !isLowerAlnum(r) && r != '.' && r != '-' && r != '_' {
			return fmt.Errorf("name has character %q, want only a-z 0-9 . - _", r)
		}
	}
	return nil
}

func isLowerAlnum(r rune) bool {
	return ('a' <= r && r <= 'z') || ('0' <= r && r <= '9')
}

func invalid(s, detail string) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidID, s, detail)
}
