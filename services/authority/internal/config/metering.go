package config

import (
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// MeteringFile is the metering part of the authority's file: the
// operator's prices. Omitted, the guide's rates.
type MeteringFile struct {
	Rates RatesFile `yaml:"rates"`
}

// RatesFile is the prices as the file writes them, in dollars per unit
// per 730-hour month ("0.80"); each omitted one takes its default.
type RatesFile struct {
	// VCPUMonth is per vCPU; default "0.80".
	VCPUMonth string `yaml:"vcpu_month"`
	// MemoryGBMonth is per GB (2^30 bytes) of memory; default "0.70".
	MemoryGBMonth string `yaml:"memory_gb_month"`
	// DiskGBMonth is per GB of disk; default "0.09".
	DiskGBMonth string `yaml:"disk_gb_month"`
	// ClassCompute multiplies compute (vCPU and memory) per runtime
	// class, e.g. {vm: 2.5}; default {vm: 2.5}, and a class not named is
	// 1. Naming any class replaces the default map.
	ClassCompute map[string]string `yaml:"class_compute"`
}

// TenantMeteringFile is a tenant's metering as the file writes it.
type TenantMeteringFile struct {
	// MonthlyBudget is the most the tenant's jobs and sessions may cost in
	// a UTC month, in dollars ("100.00"); past it new ones are refused,
	// and from 80% of it warned. Omitted or "0": no budget.
	MonthlyBudget string `yaml:"monthly_budget"`
}

// Metering is the file's metering, validated.
type Metering struct {
	Rates   metering.Rates
	Budgets map[string]metering.Micros
}

// metering validates the rates and every tenant's budget.
func (c *Config) metering() error {
	var errs []error
	c.MeteringPolicy = Metering{Rates: metering.DefaultRates(), Budgets: map[string]metering.Micros{}}
	r := &c.MeteringPolicy.Rates
	for _, f := range []struct {
		name string
		in   string
		out  *metering.Micros
	}{
		{"vcpu_month", c.Metering.Rates.VCPUMonth, &r.VCPUMonth},
		{"memory_gb_month", c.Metering.Rates.MemoryGBMonth, &r.MemoryGBMonth},
		{"disk_gb_month", c.Metering.Rates.DiskGBMonth, &r.DiskGBMonth},
	} {
		if f.in == "" {
			continue
		}
		m, err := metering.ParseDollars(f.in)
		if err == nil && m > 1_000_000_000 {
			err = fmt.Errorf("%q: at most $1000 a month", f.in)
		}
		if err != nil {
			errs = append(errs, config.Field("metering.rates."+f.name, "%v", err))
			continue
		}
		*f.out = m
	}
	if c.Metering.Rates.ClassCompute != nil {
		r.ClassCompute = map[string]int64{}
		for _, class := range sortedKeys(c.Metering.Rates.ClassCompute) {
			field := "metering.rates.class_compute." + class
			if !isRuntimeClass(class) {
				errs = append(errs, config.Field(field, "%q is not a runtime class (want one of %v)", class, policy.RuntimeClasses()))
				continue
			}
			m, err := metering.ParseMultiplier(c.Metering.Rates.ClassCompute[class])
			if err != nil {
				errs = append(errs, config.Field(field, "%v", err))
				continue
			}
			r.ClassCompute[class] = m
		}
	}
	for _, name := range sortedKeys(c.Tenants) {
		b := c.Tenants[name].Metering.MonthlyBudget
		if b == "" {
			continue
		}
		m, err := metering.ParseDollars(b)
		if err == nil && m > 1_000_000_000_000 {
			err = fmt.Errorf("%q: at most $1000000", b)
		}
		if err != nil {
			errs = append(errs, config.Field("tenants."+name+".metering.monthly_budget", "%v", err))
			continue
		}
		if m > 0 {
			c.MeteringPolicy.Budgets[name] = m
		}
	}
	return errors.Join(errs...)
}

func isRuntimeClass(s string) bool {
	for _, c := range policy.RuntimeClasses() {
		if c == s {
			return true
		}
	}
	return false
}
