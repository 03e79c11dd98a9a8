// Package fleet owns the authority's view of its executors: who joined,
// what each can run and has free as it last reported on its heartbeat,
// which are drained, which are lost, and where a job should go. The fleet
// lives in the authority's store, so every replica sees the same one. It
// imports no gRPC or protobuf: the api package converts.
package fleet

import (
	"time"
)

// Report is what an executor said of itself on its last heartbeat.
type Report struct {
	Version   string    `json:"version,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Classes are the runtime classes it runs ("runc", "runsc", "vm").
	Classes  []string `json:"classes"`
	Capacity Capacity `json:"capacity"`
	// Images are the manifest digests it holds; Sources the repositories
	// it holds source of (TENANT/REPOSITORY); Pools its network prefixes.
	Images  []string `json:"images,omitempty"`
	Sources []string `json:"sources,omitempty"`
	Pools   []string `json:"pools,omitempty"`
	// Runs are the job ids of the runs it holds that have not ended;
	// RunsTruncated says there were more.
	Runs          []string `json:"runs,omitempty"`
	RunsTruncated bool     `json:"runs_truncated,omitempty"`
	// WarmPools are the session shapes it keeps sandboxes ready for.
	WarmPools []WarmPool `json:"warm_pools,omitempty"`
}

// WarmPool is one shape of sandbox an executor keeps ready for a tenant's
// sessions, as it reported.
type WarmPool struct {
	Tenant       string        `json:"tenant"`
	Class        string        `json:"class"`
	UID          uint32        `json:"uid"`
	GID          uint32        `json:"gid"`
	DiskBytes    int64         `json:"disk_bytes"`
	ShmBytes     int64         `json:"shm_bytes"`
	Ready        int           `json:"ready"`
	Target       int           `json:"target"`
	Hits         int64         `json:"hits"`
	Misses       int64         `json:"misses"`
	RefillLast   time.Duration `json:"refill_last"`
	RefillMedian time.Duration `json:"refill_median"`
	LastError    string        `json:"last_error,omitempty"`
}

// Capacity is an executor's capacity and what of it is free.
type Capacity struct {
	MemoryBytes int64 `json:"memory_bytes"`
	MemoryFree  int64 `json:"memory_free"`
	CPUMillis   int64 `json:"cpu_millis"`
	CPUFree     int64 `json:"cpu_free"`
	DiskBytes   int64 `json:"disk_bytes"`
	DiskFree    int64 `json:"disk_free"`
	Jobs        int64 `json:"jobs"`
	JobsFree    int64 `json:"jobs_free"`
}

// Member is one executor of the fleet.
type Member struct {
	// Name is its certificate's instance; ID its SPIFFE ID.
	Name, ID string
	// Address is where the authority reaches it.
	Address string
	// Lost says its heartbeats stopped for longer than the fleet's bound.
	Lost bool
	// Draining, by whom, when and why: no new work goes to it.
	Draining    bool
	DrainedBy   string
	DrainedAt   time.Time
	DrainReason string
	JoinedAt    time.Time
	LastSeen    time.Time
	Report      Report
	// Placed counts the jobs and sessions placed on it that have not
	// ended.
	Placed int64
}

// Answer is the fleet's answer to a heartbeat.
type Answer struct {
	// Name is the executor's name in the fleet.
	Name string
	// Interval is when the next heartbeat is due; LostAfter how long the
	// fleet waits for one before it declares the executor lost.
	Interval, LostAfter time.Duration
	Draining            bool
	// CancelRuns are runs it holds that it must stop: their jobs ended or
	// were placed elsewhere while it was out of reach.
	CancelRuns []string
}
