// Package metering owns what the authority bills: the operator's rates,
// the quantities a job or session used, metered by the minute (vCPU- and
// memory GB-minutes allocated while awake and, beside them, used; disk
// GB-minutes while retained; network bytes), their cost in exact
// micro-dollars, usage split by UTC day, and tenants' monthly budgets. It
// imports no gRPC or protobuf: the authority's api package converts its
// reports to the wire, and executorclient decodes stored jobs for it.
// Only the authority's api, config, executorclient and composition root
// import it (the jobs package reaches it through jobs.Metering).
package metering

import (
	"fmt"
	"github.com/airlockhq/airlock/pkg/usd"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Micros is an amount of US dollars in millionths.
type Micros int64

// MonthMinutes is the month the rates are priced for: 730 hours.
const MonthMinutes = 730 * 60

// GB is the unit of memory and disk: 2^30 bytes.
const GB = 1 << 30

// Rates are the operator's prices, each per unit per 730-hour month.
type Rates struct {
	VCPUMonth     Micros
	MemoryGBMonth Micros
	DiskGBMonth   Micros
	// ClassCompute multiplies compute (vCPU and memory, not disk) per
	// runtime class, in thousandths (2500 = 2.5x); a class not named is
	// 1000.
	ClassCompute map[string]int64
}

// DefaultRates are the guide's: $0.80 per vCPU, $0.70 per GB of RAM and
// $0.09 per GB of disk per 730-hour month, the VM class at 2.5x compute.
func DefaultRates() Rates {
	return Rates{VCPUMonth: 800_000, MemoryGBMonth: 700_000, DiskGBMonth: 90_000, ClassCompute: map[string]int64{"vm": 2500}}
}

// ComputeMillis is class's compute multiplier in thousandths.
func (r Rates) ComputeMillis(class string) int64 {
	if m, ok := r.ClassCompute[class]; ok {
		return m
	}
	return 1000
}

// ParseDollars reads an amount of dollars as an operator writes it:
// "0.80", "100", "$12.5"; at most six decimals, not negative.
func ParseDollars(s string) (Micros, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "$")
	whole, frac, _ := strings.Cut(t, ".")
	if whole == "" && frac == "" || strings.ContainsAny(whole, "+-") || len(frac) > 6 || len(whole) > 12 {
		return 0, fmt.Errorf("%q: want dollars like \"0.80\" (at most 6 decimals, not negative)", s)
	}
	if whole == "" {
		whole = "0"
	}
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want dollars like \"0.80\"", s)
	}
	f := uint64(0)
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil || strings.ContainsAny(frac, "+-") {
			return 0, fmt.Errorf("%q: want dollars like \"0.80\"", s)
		}
	}
	return Micros(w*1_000_000 + f), nil
}

// ParseMultiplier reads a compute multiplier ("2.5", "1") into
// thousandths: at most three decimals, between 0.001 and 1000.
func ParseMultiplier(s string) (int64, error) {
	m, err := ParseDollars(s) // the same shape of decimal, in millionths
	if err != nil || m%1000 != 0 {
		return 0, fmt.Errorf("%q: want a multiplier like 2.5 (at most 3 decimals)", s)
	}
	if m < 1000 || m > 1_000_000_000 {
		return 0, fmt.Errorf("%q: must be between 0.001 and 1000", s)
	}
	return int64(m / 1000), nil
}

// String renders m as dollars and cents, "$4.76", rounded half up, or
// under half a cent to the micro-dollar ("$0.000018"; pkg/usd).
func (m Micros) String() string { return usd.Format(int64(m)) }

// Classes lists the classes r names, sorted.
func (r Rates) Classes() []string {
	out := make([]string, 0, len(r.ClassCompute))
	for c := range r.ClassCompute {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// cost is the exact cost of allocated quantities run under class, in
// dollars-millionths as a rational: compute (vCPU and memory) times the
// class multiplier, plus disk, each per MonthMinutes.
func (r Rates) cost(class string, q Alloc) *big.Rat {
	// vCPU: milli-vCPU-minutes / 1000 * rate; memory and disk:
	// byte-minutes / GB * rate; all / MonthMinutes.
	cpu := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(q.CPUMilliMinutes), big.NewInt(int64(r.VCPUMonth))), big.NewInt(1000))
	mem := new(big.Rat).SetFrac(new(big.Int).Mul(q.MemoryByteMinutes.int(), big.NewInt(int64(r.MemoryGBMonth))), big.NewInt(GB))
	compute := new(big.Rat).Add(cpu, mem)
	compute.Mul(compute, big.NewRat(r.ComputeMillis(class), 1000))
	disk := new(big.Rat).SetFrac(new(big.Int).Mul(q.DiskByteMinutes.int(), big.NewInt(int64(r.DiskGBMonth))), big.NewInt(GB))
	total := new(big.Rat).Add(compute, disk)
	return total.Quo(total, big.NewRat(MonthMinutes, 1))
}

// round is x rounded half up to whole micro-dollars.
func round(x *big.Rat) Micros {
	n := new(big.Int).Mul(x.Num(), big.NewInt(2))
	n.Add(n, x.Denom())
	n.Quo(n, new(big.Int).Mul(x.Denom(), big.NewInt(2)))
	return Micros(n.Int64())
}
