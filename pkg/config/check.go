package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/pkg/grant"
)

// Checker is a Service whose config --check-config can check beyond
// validation: the files its own fields name, read as a start reads them.
type Checker interface {
	Service
	// CheckFiles reads the files the service's own fields name, creating
	// none: notes say what a start would create. It runs after validation,
	// even one that failed, so it skips a file validation found missing.
	CheckFiles() (notes []string, err error)
	// Summary is the service's part of the summary line.
	Summary() string
}

// Check is --check-config: it loads path into cfg as LoadService does, then
// reads every file the config names as a start of the named service would
// (the TLS files, whose certificate must be that service's, the data
// directory, and the service's own through Checker), binding, creating and
// writing nothing. It returns the summary line of a good config, or every
// problem, one error each.
func Check(name, path string, cfg Checker, override func(*Server)) (string, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", []error{err}
	}
	if err := Decode(data, cfg); err != nil {
		return "", []error{err}
	}
	errs := Problems(validateService(path, cfg, override))
	s := cfg.Common()
	if s.TLS.CA != "" && s.TLS.Cert != "" && s.TLS.Key != "" && !mentions(errs, "tls.") && !mentions(errs, "trust_domain") {
		if _, _, err := s.LoadTLS(name); err != nil {
			errs = append(errs, err)
		}
	}
	var notes []string
	if s.DataDir != "" {
		note, err := CheckDir("data_dir", s.DataDir)
		errs = append(errs, Problems(err)...)
		if note != "" {
			notes = append(notes, note)
		}
	}
	more, err := cfg.CheckFiles()
	notes = append(notes, more...)
	errs = append(errs, Problems(err)...)
	if len(errs) > 0 {
		return "", errs
	}
	summary := fmt.Sprintf("listen %s, trust domain %s, data dir %s", s.Listen, s.TrustDomain, s.DataDir)
	if s.Telemetry.PrometheusListen != "" {
		summary += fmt.Sprintf(", metrics http://%s/metrics", s.Telemetry.PrometheusListen)
	}
	if more := cfg.Summary(); more != "" {
		summary += ", " + more
	}
	if len(notes) > 0 {
		summary += "; " + strings.Join(notes, "; ")
	}
	return summary, nil
}

// Problems flattens joined errors into one error per problem.
func Problems(errs ...error) []error {
	var out []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			out = append(out, Problems(j.Unwrap()...)...)
		} else if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// mentions says whether a problem names a field under prefix.
func mentions(errs []error, prefix string) bool {
	for _, err := range errs {
		var fe *FieldError
		if errors.As(err, &fe) && strings.HasPrefix(fe.Field, prefix) {
			return true
		}
	}
	return false
}

// CheckDir checks the directory field names as a start would make it
// (os.MkdirAll): present, or creatable because the nearest path above it
// that exists is a directory; the note says it will be created.
func CheckDir(field, dir string) (note string, err error) {
	p := dir
	for {
		st, err := os.Stat(p)
		switch {
		case err == nil && st.IsDir() && p == dir:
			return "", nil
		case err == nil && st.IsDir():
			return fmt.Sprintf("%s %s will be created", field, dir), nil
		case err == nil:
			return "", Field(field, "%s is not a directory", p)
		case !errors.Is(err, fs.ErrNotExist):
			return "", Field(field, "%v", err)
		case filepath.Dir(p) == p:
			return "", Field(field, "%v", err)
		}
		p = filepath.Dir(p)
	}
}

// CheckExecutable checks that the program field names (already checked
// present) is a regular file someone may execute; it is not run.
func CheckExecutable(field, path string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return nil // reported by CheckFile
	case !st.Mode().IsRegular():
		return Field(field, "%s is not a regular file", path)
	case st.Mode().Perm()&0o111 == 0:
		return Field(field, "%s is not executable (mode %v)", path, st.Mode().Perm())
	}
	return nil
}

// CheckPublicKey reads the set of trusted Ed25519 public keys field
// names (a file of one or more, or a directory of *.pub files), as a
// start loads it (grant.LoadPublicKeys); one validation found missing is
// skipped.
func CheckPublicKey(field, path string) error {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	if _, err := grant.LoadPublicKeys(path); err != nil {
		return Field(field, "%v", err)
	}
	return nil
}
