// Package usd writes amounts of US dollars held in millionths (micros), as
// Airlock's metering keeps them.
package usd

import (
	"fmt"
	"strings"
)

// Format writes micros as dollars: to the cent ("$4.76"), rounded half
// up, and an amount under half a cent but above zero to the micro-dollar
// it is ("$0.000018"), so a small job's cost never reads as nothing.
func Format(micros int64) string {
	sign := ""
	if micros < 0 {
		sign = "-"
		if micros == -micros { // the most negative int64 has no opposite
			return "-$9223372036854.78"
		}
		micros = -micros
	}
	if micros > 0 && micros < 5000 {
		return sign + "$" + strings.TrimRight(fmt.Sprintf("0.%06d", micros), "0")
	}
	cents := micros/10000 + (micros%10000+5000)/10000
	return fmt.Sprintf("%s$%d.%02d", sign, cents/100, cents%100)
}
