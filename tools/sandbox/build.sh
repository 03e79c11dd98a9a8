#!/usr/bin/env bash
# Builds the OCI runtimes the executor's sandbox drives, from the versions
# pinned by tool directives, into OUTDIR:
#
#   tools/sandbox/build.sh OUTDIR        (e.g. tools/sandbox/build.sh bin)
#
#   OUTDIR/runc    runc with libseccomp (cgo, -tags seccomp); without the tag
#                  runc silently refuses every seccomp profile, so the build
#                  fails instead if libseccomp-dev is not usable.
#   OUTDIR/runsc   gVisor's runsc, static (CGO_ENABLED=0): runsc re-executes
#                  itself after pivot_root where no ELF interpreter exists, so
#                  a dynamically linked runsc dies with "error executing
#                  umounter".
#
# runc is pinned in tools/sandbox/go.mod and runsc in tools/sandbox/runsc/go.mod:
# they cannot share one build list, because runc v1.5 needs runtime-spec
# v1.3.0 (where LinuxPids.Limit became *int64) and gVisor still compiles only
# against v1.2.x.
#
# Each binary has a stamp OUTDIR/.NAME.build recording what it was built from
# (module version, Go version, flags); when the stamp matches and the binary is
# there, nothing is rebuilt, so calling this before every test run is cheap.
# Debian's own runc package is never used: it is far older than the pinned one.
#
# Environment: SKIP_RUNSC=1 builds runc only.
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"

# A GOFLAGS=-mod=vendor or similar from the caller must not leak in.
export GOFLAGS=-mod=readonly
cd "$here"

# modver DIR MODULE prints the version of MODULE in DIR's build list.
modver() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }
gover="$(go env GOVERSION)"

# ensure_debs installs the Debian packages runc's seccomp support links
# against, but only when they are missing: apt is slow even when it has
# nothing to do.
ensure_debs() {
  local missing=() p
  for p in libseccomp-dev pkg-config gcc libc6-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "build.sh: installing ${missing[*]}" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# build DIR NAME STAMP ENV... -- GO_BUILD_ARGS... builds in module DIR. It
# writes a temporary name and renames, so an interrupted build never leaves a half-written runtime that a
# later run would trust.
build() {
  local dir="$1" name="$2" stamp="$3"
  shift 3
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  local bin="$out/$name" stampfile="$out/.$name.build"
  if [[ -x "$bin" && -f "$stampfile" && "$(cat "$stampfile")" == "$stamp" ]]; then
    echo "build.sh: $name up to date ($stamp)" >&2
    return 0
  fi
  local start=$SECONDS
  (cd "$dir" && env "${envs[@]}" go build -trimpath -o "$bin.tmp" "$@")
  mv -f "$bin.tmp" "$bin"
  printf '%s\n' "$stamp" >"$stampfile"
  echo "build.sh: built $name ($stamp) in $((SECONDS - start))s" >&2
}

runc_ver="$(modver "$here" github.com/opencontainers/runc)"
runc_stamp="runc $runc_ver $gover cgo tags=seccomp"
if [[ ! -x "$out/runc" || ! -f "$out/.runc.build" || "$(cat "$out/.runc.build")" != "$runc_stamp" ]]; then
  ensure_debs
fi
build "$here" runc "$runc_stamp" CGO_ENABLED=1 -- \
  -buildmode=pie -tags seccomp \
  -ldflags "-X main.gitCommit=$runc_ver" \
  github.com/opencontainers/runc

if [[ "${SKIP_RUNSC:-}" != 1 ]]; then
  gvisor_ver="$(modver "$here/runsc" gvisor.dev/gvisor)"
  runsc_stamp="runsc $gvisor_ver $gover static"
  build "$here/runsc" runsc "$runsc_stamp" CGO_ENABLED=0 -- \
    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$gvisor_ver" \
    gvisor.dev/gvisor/runsc
fi
