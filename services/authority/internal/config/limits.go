package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// limitSet checks one written set; unset fields stay zero.
func limitSet(field string, f LimitSet) (policy.Limits, error) {
	errs := []error{f.Memory.Check(field + ".memory"), f.Disk.Check(field + ".disk")}
	for _, v := range []struct {
		name string
		n    int64
	}{{"cpu_millis", f.CPUMillis}, {"pids", f.Pids}, {"memory", f.Memory.Bytes()}, {"disk", f.Disk.Bytes()}, {"deadline", int64(f.Deadline)}} {
		if v.n < 0 {
			errs = append(errs, config.Field(field+"."+v.name, "must not be negative"))
		}
	}
	if f.Memory.IsSet() && f.Memory.Bytes() == 0 {
		errs = append(errs, config.Field(field+".memory", "must be more than 0"))
	}
	if f.Disk.IsSet() && f.Disk.Bytes() == 0 {
		errs = append(errs, config.Field(field+".disk", "must be more than 0"))
	}
	return policy.Limits{
		CPUMillis: f.CPUMillis, MemoryBytes: f.Memory.Bytes(), Pids: f.Pids, DiskBytes: f.Disk.Bytes(), Deadline: f.Deadline,
	}, errors.Join(errs...)
}

// fillLimits completes def and max field by field (policy.CompletePair).
func fillLimits(def, ceil policy.Limits) (policy.Limits, policy.Limits) {
	fill := policy.CompletePair
	fill(&def.CPUMillis, &ceil.CPUMillis, policy.DefaultLimits.CPUMillis, policy.DefaultMax.CPUMillis)
	fill(&def.MemoryBytes, &ceil.MemoryBytes, policy.DefaultLimits.MemoryBytes, policy.DefaultMax.MemoryBytes)
	fill(&def.Pids, &ceil.Pids, policy.DefaultLimits.Pids, policy.DefaultMax.Pids)
	fill(&def.DiskBytes, &ceil.DiskBytes, policy.DefaultLimits.DiskBytes, policy.DefaultMax.DiskBytes)
	d, m := int64(def.Deadline), int64(ceil.Deadline)
	fill(&d, &m, int64(policy.DefaultLimits.Deadline), int64(policy.DefaultMax.Deadline))
	def.Deadline, ceil.Deadline = time.Duration(d), time.Duration(m)
	return def, ceil
}

func checkCeilings(field string, def, ceil policy.Limits) []error {
	var errs []error
	for _, v := range []struct {
		name     string
		def, max int64
		format   func(int64) string
	}{
		{"cpu_millis", def.CPUMillis, ceil.CPUMillis, plain},
		{"memory", def.MemoryBytes, ceil.MemoryBytes, config.FormatByteSize},
		{"pids", def.Pids, ceil.Pids, plain},
		{"disk", def.DiskBytes, ceil.DiskBytes, config.FormatByteSize},
		{"deadline", int64(def.Deadline), int64(ceil.Deadline), func(n int64) string { return time.Duration(n).String() }},
	} {
		if v.max < v.def {
			errs = append(errs, config.Field(field+".max."+v.name, "ceiling %s is below the default %s", v.format(v.max), v.format(v.def)))
		}
	}
	return errs
}

func plain(n int64) string { return fmt.Sprint(n) }
