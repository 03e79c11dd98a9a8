// Package version reports the build's version, set at link time with
// -ldflags "-X github.com/airlockhq/airlock/pkg/version.Version=v1.2.3" or
// read from the module's build information. Anything that prints or reports
// a version imports it.
package version

import "runtime/debug"

// Version is set at link time; empty means "read build info".
var Version string

// String returns the version, "devel" when nothing better is known.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
