// Package config owns the on-disk configuration format shared by the three
// Airlock services: a versioned YAML file, decoded strictly (an unknown field
// is an error), validated once into values the composition root can use
// without further checks. Each service's own config package embeds Server
// and adds its peers; nothing else parses config files.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/identity"
)

// Version is the config file format this build reads.
const Version = 1

// FieldError is a problem with one field, named by its path in the file
// (e.g. "tls.cert").
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Field returns a FieldError for field.
func Field(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// TLS names the PEM files of this process's identity and the trust bundle.
type TLS struct {
	// CA is the bundle of CA certificates peers must chain to.
	CA string `yaml:"ca"`
	// Cert is this process's certificate, with exactly one SPIFFE URI SAN.
	Cert string `yaml:"cert"`
	// Key is the private key for Cert.
	Key string `yaml:"key"`
}

// Log configures the process log.
type Log struct {
	// Level is debug, info, warn or error; default info.
	Level string `yaml:"level"`
	// Format is json or text; default json.
	Format string `yaml:"format"`
}

// Telemetry configures OpenTelemetry export.
type Telemetry struct {
	// OTLPEndpoint is host:port of an OTLP/gRPC collector; empty exports nothing.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// Insecure sends OTLP without TLS (a collector on loopback).
	Insecure bool `yaml:"insecure"`
	// SampleRatio is the fraction of traces recorded, 0..1; 0 means all.
	SampleRatio float64 `yaml:"sample_ratio"`
	// PrometheusListen is host:port for a plain-HTTP /metrics endpoint in
	// the Prometheus format; empty (the default) serves none. It has no
	// authentication: use loopback or a private interface.
	PrometheusListen string `yaml:"prometheus_listen"`
}

// Peer is another Airlock service this one calls.
type Peer struct {
	// Address is host:port.
	Address string `yaml:"address"`
}

// Server is the part of the file every service has.
type Server struct {
	// base is the config file's directory, set by Validate: what a
	// service's own relative paths are taken from (CheckFile).
	base string
	// Version must be 1.
	Version int `yaml:"version"`
	// TrustDomain is the SPIFFE trust domain of every peer, e.g. "airlock.local".
	TrustDomain string `yaml:"trust_domain"`
	// Listen is host:port for the mTLS gRPC listener.
	Listen string `yaml:"listen"`
	// DataDir holds the service's state; created 0700 if missing.
	DataDir string `yaml:"data_dir"`
	// TLS is this service's identity.
	TLS TLS `yaml:"tls"`
	// Log configures logging.
	Log Log `yaml:"log"`
	// Telemetry configures trace and metric export.
	Telemetry Telemetry `yaml:"telemetry"`
	// Reflection turns on gRPC reflection (still behind mTLS); default off.
	Reflection bool `yaml:"reflection"`
	// ShutdownTimeout bounds graceful shutdown; default 10s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
}

// Load reads path strictly into out, which must be a pointer to a struct
// with a `version` field. Relative paths in the file are the caller's to
// resolve against filepath.Dir(path) (see Server.Validate).
func Load(path string, out any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := Decode(data, out); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Decode parses YAML strictly into out after checking the format version.
func Decode(data []byte, out any) error {
	var head struct {
		Version *int `yaml:"version"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return cleanYAMLError(data, err)
	}
	if head.Version == nil {
		return Field("version", "required; this build reads version %d", Version)
	}
	if *head.Version != Version {
		return Field("version", "%d is not supported; this build reads version %d", *head.Version, Version)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		return cleanYAMLError(data, err)
	}
	return nil
}

var (
	unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+`)
	badValue     = regexp.MustCompile(`line (\d+): cannot unmarshal !!\w+ ` + "`" + `([^` + "`" + `]*)` + "`" + ` into (\S+)`)
)

// cleanYAMLError rewrites yaml.v3's messages, which name Go types, into ones
// that name the field by its dotted path in the file, and the line.
func cleanYAMLError(data []byte, err error) error {
	msg := err.Error()
	fields := fieldLines(data)
	find := func(line string, match func(f yamlField) bool) string {
		for _, f := range fields[line] {
			if match(f) {
				return f.path
			}
		}
		return ""
	}
	var out []string
	for _, m := range unknownField.FindAllStringSubmatch(msg, -1) {
		field := m[2]
		if p := find(m[1], func(f yamlField) bool { return f.key == m[2] }); p != "" {
			field = p
		}
		out = append(out, fmt.Sprintf("%s (line %s): unknown field", field, m[1]))
	}
	for _, m := range badValue.FindAllStringSubmatch(msg, -1) {
		field := "line " + m[1]
		if p := find(m[1], func(f yamlField) bool { return f.value == m[2] }); p != "" {
			field = fmt.Sprintf("%s (line %s)", p, m[1])
		}
		out = append(out, fmt.Sprintf("%s: value %q has the wrong type (want %s)", field, m[2], m[3]))
	}
	if len(out) == 0 {
		return errors.New(strings.TrimPrefix(msg, "yaml: "))
	}
	return errors.New(strings.Join(out, "; "))
}

// yamlField is one mapping entry of a YAML document.
type yamlField struct{ key, value, path string }

// fieldLines maps each line number (as yaml.v3 reports it) to the mapping
// entries whose key is on that line, with their dotted paths.
func fieldLines(data []byte) map[string][]yamlField {
	var doc yaml.Node
	out := map[string][]yamlField{}
	if yaml.Unmarshal(data, &doc) != nil {
		return out
	}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				path := n.Content[i].Value
				if prefix != "" {
					path = prefix + "." + path
				}
				line := strconv.Itoa(n.Content[i].Line)
				out[line] = append(out[line], yamlField{key: n.Content[i].Value, value: n.Content[i+1].Value, path: path})
				walk(n.Content[i+1], path)
			}
		}
	}
	walk(&doc, "")
	return out
}

// Validate checks every field, fills defaults, and makes file paths absolute
// relative to base (the config file's directory). The error joins one
// FieldError per problem so a user fixes them all in one go.
func (s *Server) Validate(base string) error {
	s.base = base
	var errs []error
	if s.TrustDomain == "" {
		errs = append(errs, Field("trust_domain", "required"))
	} else if err := identity.ValidateTrustDomain(s.TrustDomain); err != nil {
		errs = append(errs, Field("trust_domain", "%v", err))
	}
	if err := CheckAddress(s.Listen); err != nil {
		errs = append(errs, Field("listen", "%v", err))
	}
	if s.DataDir == "" {
		errs = append(errs, Field("data_dir", "required"))
	} else {
		s.DataDir = resolve(base, s.DataDir)
	}
	for _, f := range []struct {
		name string
		path *string
	}{{"tls.ca", &s.TLS.CA}, {"tls.cert", &s.TLS.Cert}, {"tls.key", &s.TLS.Key}} {
		if *f.path == "" {
			errs = append(errs, Field(f.name, "required"))
			continue
		}
		*f.path = resolve(base, *f.path)
		if _, err := os.Stat(*f.path); err != nil {
			errs = append(errs, Field(f.name, "%v", err))
		}
	}
	if s.Log.Level == "" {
		s.Log.Level = "info"
	}
	if s.Log.Format == "" {
		s.Log.Format = "json"
	}
	if _, err := ParseLevel(s.Log.Level); err != nil {
		errs = append(errs, Field("log.level", "%v", err))
	}
	if s.Log.Format != "json" && s.Log.Format != "text" {
		errs = append(errs, Field("log.format", "%q: must be json or text", s.Log.Format))
	}
	if s.Telemetry.OTLPEndpoint != "" {
		if err := CheckAddress(s.Telemetry.OTLPEndpoint); err != nil {
			errs = append(errs, Field("telemetry.otlp_endpoint", "%v", err))
		}
	}
	if s.Telemetry.SampleRatio < 0 || s.Telemetry.SampleRatio > 1 {
		errs = append(errs, Field("telemetry.sample_ratio", "%v: must be between 0 and 1", s.Telemetry.SampleRatio))
	}
	if err := s.checkPrometheusListen(); err != nil {
		errs = append(errs, err)
	}
	if s.ShutdownTimeout < 0 {
		errs = append(errs, Field("shutdown_timeout", "%v: must not be negative", s.ShutdownTimeout))
	} else if s.ShutdownTimeout == 0 {
		s.ShutdownTimeout = 10 * time.Second
	}
	return errors.Join(errs...)
}

// checkPrometheusListen checks telemetry.prometheus_listen, which is
// optional, without binding it.
func (s *Server) checkPrometheusListen() error {
	addr := s.Telemetry.PrometheusListen
	if addr == "" {
		return nil
	}
	if err := CheckAddress(addr); err != nil {
		return Field("telemetry.prometheus_listen", "%v", err)
	}
	if _, port, _ := net.SplitHostPort(addr); port != "0" && addr == s.Listen {
		return Field("telemetry.prometheus_listen", "%q is also the gRPC listen address; give metrics a port of their own", addr)
	}
	return nil
}

// ValidatePeer checks a peer entry named field.
func ValidatePeer(field string, p Peer) error {
	if err := CheckAddress(p.Address); err != nil {
		return Field(field+".address", "%v", err)
	}
	return nil
}

// CheckAddress checks a host:port.
func CheckAddress(addr string) error {
	if addr == "" {
		return errors.New("required (host:port)")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: must be host:port", addr)
	}
	if host == "" {
		return fmt.Errorf("%q: host is required (use 0.0.0.0 to listen on every interface)", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port must be a number from 0 to 65535", addr)
	}
	return nil
}

// ParseResolver reads a DNS server's address, "IP" (port 53) or
// "IP:PORT" ("[IPv6]:PORT"), as network.resolvers and dev up --resolver
// take it.
func ParseResolver(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		s = netip.AddrPortFrom(a, 53).String()
	}
	ap, err := netip.ParseAddrPort(s)
	switch {
	case err != nil:
		return netip.AddrPort{}, errors.New("want IP or IP:PORT (IPv6 in brackets with a port)")
	case ap.Port() == 0:
		return netip.AddrPort{}, errors.New("port 0")
	case ap.Addr().Zone() != "" || ap.Addr().IsUnspecified():
		return netip.AddrPort{}, errors.New("want an address without zone that is not unspecified")
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// ParseLevel parses a log level name: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return l, l.UnmarshalText([]byte(s))
	}
	return l, fmt.Errorf("%q: must be debug, info, warn or error", s)
}

func resolve(base, p string) string {
	if filepath.IsAbs(p) || base == "" {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

// Service is a service's whole config file: the common part plus its peers.
type Service interface {
	// Common returns the embedded common part.
	Common() *Server
	// ValidatePeers checks the service's own fields.
	ValidatePeers() error
}

// LoadService reads path strictly into cfg, lets override adjust the common
// part (command-line flags win over the file), then validates everything.
func LoadService(path string, cfg Service, override func(*Server)) error {
	if err := Load(path, cfg); err != nil {
		return err
	}
	if err := validateService(path, cfg, override); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// validateService applies override to a decoded cfg and validates all of
// it, relative paths from path's directory: what LoadService and Check do
// after decoding.
func validateService(path string, cfg Service, override func(*Server)) error {
	if override != nil {
		override(cfg.Common())
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	return errors.Join(cfg.Common().Validate(filepath.Dir(abs)), cfg.ValidatePeers())
}

// CheckFile checks the file field names of a service's config: made
// absolute (a relative path from the config file's directory, as every
// path of the file is) and present; "" is an error only when required.
// Call it after Validate, as LoadService does.
func (s *Server) CheckFile(field string, p *string, required bool) error {
	if *p == "" {
		if required {
			return Field(field, "required")
		}
		return nil
	}
	*p = resolve(s.base, *p)
	if !filepath.IsAbs(*p) {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return Field(field, "%v", err)
		}
		*p = abs
	}
	if _, err := os.Stat(*p); err != nil {
		return Field(field, "%v", err)
	}
	return nil
}
