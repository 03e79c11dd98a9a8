package runs

import (
	"slices"
	"time"

	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Grant is a grant the authority signed, as the run manager uses it. The
// adapter (package convert) verifies the signature, checks the format and
// builds it; nothing here parses the signed bytes. A run's record keeps
// it (field grant) beside those bytes.
type Grant struct {
	JobID      string            `json:"job_id"`
	Tenant     string            `json:"tenant"`
	Requester  string            `json:"requester"`
	Repository string            `json:"repository"`
	Commit     string            `json:"commit"`
	Command    []string          `json:"command,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Class      sandbox.Class     `json:"runtime_class"`
	Limits     sandbox.Limits    `json:"limits"`
	Network    NetworkPolicy     `json:"network_policy"`
	// NetworkGeneration counts the changes of the network policy; the
	// first policy is 1.
	NetworkGeneration int64 `json:"network_policy_generation"`
	// Generation counts the grants of the job; a newer grant has a higher
	// one.
	Generation int64 `json:"generation"`
	// Session is a session's spec, nil for a job.
	Session *SessionSpec `json:"session,omitempty"`
	// HistoryDepth is how many commits of history the job's .git gets;
	// 0 and 1 are the base commit alone.
	HistoryDepth int `json:"git_history_depth,omitempty"`
	// WarmPool, for a session, is how many sandboxes of its shape its
	// tenant's policy asks this executor to keep ready (warm.go).
	WarmPool int `json:"warm_pool,omitempty"`
	// Caches are the named caches the job mounts (caches.go).
	Caches []CacheGrant `json:"caches,omitempty"`
	// User is who the job's processes run as; the zero value is root
	// (a grant from before the field).
	User runspec.User `json:"user"`
	// Image is the OCI image the job runs on, by manifest digest; nil is
	// the host template.
	Image *ImageRef `json:"image,omitempty"`
	// Docker says the job asked for a Docker daemon beside it (the
	// grant's with: "docker"); only the vm class takes it.
	Docker bool `json:"docker,omitempty"`
	// Credentials are the brokered credentials the job's egress proxy
	// leases for it, by name (credentials.go); never a value.
	Credentials []string `json:"credentials,omitempty"`
	// Digest names exactly what was granted ("sha256:<hex>" of the signed
	// body): the same grant sent again has the same digest.
	Digest string `json:"digest"`
	// Fixed are the fields a newer grant of the same job may not change
	// (all but limits, network policy, their generations and times, and
	// unknown fields among them), in the grant format's order, each as
	// bytes equal only when the fields are.
	Fixed []Field `json:"fixed,omitempty"`
	// Signed is the whole signed grant (body, signature, key id) as
	// serialized for the run record and the bundle, which keep it so
	// whoever holds them can check what the authority signed.
	Signed []byte `json:"-"`
}

// ImageRef names a job's image.
type ImageRef struct {
	Registry   string `json:"registry"`
	Repository string `json:"repository"`
	Digest     string `json:"digest"`
}

// Reference is "registry/repository@digest".
func (r ImageRef) Reference() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

// CacheGrant is one named cache a grant gives the job: kept per (tenant,
// repository, name), mounted at Path, wiped past MaxSize bytes.
type CacheGrant struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	MaxSize int64  `json:"max_size"`
}

// SessionSpec is what a session's grant says of it; zero values take the
// defaults (DefaultIdleTimeout, DefaultMaxConcurrentExecs).
type SessionSpec struct {
	IdleTimeout        time.Duration `json:"idle_timeout"`
	MaxConcurrentExecs int           `json:"max_concurrent_execs"`
	// SleepOnIdle says the session sleeps once idle past its idle
	// timeout (sleep.go) rather than ending.
	SleepOnIdle bool `json:"sleep_on_idle,omitempty"`
}

// Field is one of a grant's fixed fields: its name in the grant format and
// an encoding of its value.
type Field struct {
	Name  string `json:"name"`
	Value []byte `json:"value"`
}

// fixedFieldChanged names the first fixed field in which a and b differ,
// or returns "".
func fixedFieldChanged(a, b Grant) string {
	for i, f := range a.Fixed {
		if i >= len(b.Fixed) || b.Fixed[i].Name != f.Name || !slices.Equal(b.Fixed[i].Value, f.Value) {
			return f.Name
		}
	}
	if len(b.Fixed) > len(a.Fixed) {
		return b.Fixed[len(a.Fixed)].Name
	}
	return ""
}
