// Package registryserver writes what the reference OCI registry
// (distribution's cmd/registry, pinned in tools/go.mod) needs to serve: its
// configuration file (format version 0.1: a TLS listener, htpasswd basic
// auth, filesystem storage, the access log) and its htpasswd file, and
// says the minimal environment to run it in. The dev stack (airlock dev up
// --registry) and the tests' registry (test/registrytest) both use it, so
// the two cannot disagree on the format. Any package may import it.
package registryserver

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/airlockhq/airlock/pkg/atomicfile"
)

// Package is the registry's command, pinned as a tool in tools/go.mod:
// `go build -modfile=tools/go.mod` builds it.
const Package = "github.com/distribution/distribution/v3/cmd/registry"

// Config is one registry server.
type Config struct {
	// Addr is where it listens, HOST:PORT.
	Addr string
	// CertFile and KeyFile are its TLS certificate and key (PEM); the
	// server speaks TLS only.
	CertFile, KeyFile string
	// Htpasswd is the htpasswd file of its users (WriteHtpasswd); empty
	// means no authentication: anyone may pull and push.
	Htpasswd string
	// Realm is the basic-auth realm named in a 401; default "airlock".
	Realm string
	// StorageDir is the filesystem storage's root directory.
	StorageDir string
	// Delete allows deleting manifests and blobs through the API.
	Delete bool
}

// WriteConfig writes c as the registry's configuration file at path
// (0600). The access log is on: one line per request on standard output,
// in Apache's combined format.
func WriteConfig(path string, c Config) error {
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"Addr", c.Addr}, {"CertFile", c.CertFile}, {"KeyFile", c.KeyFile}, {"StorageDir", c.StorageDir},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("registryserver: %s is required", f.name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	realm := c.Realm
	if realm == "" {
		realm = "airlock"
	}
	// Values are quoted with %q, which YAML reads as the same string.
	var b strings.Builder
	fmt.Fprintf(&b, "version: 0.1\n")
	fmt.Fprintf(&b, "log:\n  level: info\n  accesslog:\n    disabled: false\n")
	fmt.Fprintf(&b, "http:\n  addr: %q\n  tls:\n    certificate: %q\n    key: %q\n", c.Addr, c.CertFile, c.KeyFile)
	if c.Htpasswd != "" {
		fmt.Fprintf(&b, "auth:\n  htpasswd:\n    realm: %q\n    path: %q\n", realm, c.Htpasswd)
	}
	fmt.Fprintf(&b, "storage:\n  filesystem:\n    rootdirectory: %q\n  delete:\n    enabled: %t\n", c.StorageDir, c.Delete)
	return atomicfile.Write(path, []byte(b.String()), 0o600, atomicfile.Durable)
}

// WriteHtpasswd writes users (name -> password) to path (0600) as the
// registry's htpasswd file, one bcrypt hash a user.
func WriteHtpasswd(path string, users map[string]string) error {
	if len(users) == 0 {
		return errors.New("registryserver: htpasswd: no users")
	}
	var b strings.Builder
	for _, user := range slices.Sorted(maps.Keys(users)) {
		if user == "" || strings.ContainsAny(user, ":\r\n") {
			return fmt.Errorf("registryserver: htpasswd: user name %q is empty or holds ':' or a line break", user)
		}
		// MinCost: the registry checks a hash at every request, and the
		// servers this writes for (a test's, the dev stack's) are on
		// loopback with random passwords.
		hash, err := bcrypt.GenerateFromPassword([]byte(users[user]), bcrypt.MinCost)
		if err != nil {
			return fmt.Errorf("registryserver: htpasswd: %s: %w", user, err)
		}
		fmt.Fprintf(&b, "%s:%s\n", user, hash)
	}
	return atomicfile.Write(path, []byte(b.String()), 0o600, atomicfile.Durable)
}

// Env is the whole environment to run the registry with config in: only
// what the server needs, so no proxy variable reaches it, and no
// OpenTelemetry exporter tries to ship traces somewhere. HOME is config's
// directory.
func Env(config string) []string {
	return []string{
		"PATH=/usr/bin:/bin", "HOME=" + filepath.Dir(config),
		"OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none",
	}
}

// Args are the registry binary's arguments to serve with config.
func Args(config string) []string { return []string{"serve", config} }

// credentialMax bounds a credential file.
const credentialMax = 64 << 10

// ReadCredential reads a registry credential file as Airlock keeps them:
// one line, "USERNAME:PASSWORD" (a trailing newline allowed), at most
// 64 KiB. The error never holds the file's content.
func ReadCredential(path string) (user, password string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", errors.New("cannot be read")
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, credentialMax+1))
	if err != nil || len(data) > credentialMax {
		return "", "", errors.New("cannot be read, or is over 64 KiB")
	}
	line := strings.TrimRight(string(data), "\r\n")
	user, password, ok := strings.Cut(line, ":")
	if !ok || user == "" || strings.ContainsAny(line, "\r\n") {
		return "", "", errors.New(`must hold one line, "USERNAME:PASSWORD"`)
	}
	return user, password, nil
}
