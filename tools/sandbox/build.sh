#!/usr/bin/env bash
# Builds the OCI runtimes the executor's sandbox drives, from the versions
# pinned by tool directives, into OUTDIR:
#
#   tools/sandbox/build.sh OUTDIR        (e.g. tools/sandbox/build.sh bin)
#
#   OUTDIR/runc    runc with libseccomp (cgo, -tags seccomp). Without the tag
#                  runc cannot load any seccomp profile, so the build fails
#                  unless the result reports its libseccomp version.
#   OUTDIR/runsc   gVisor's runsc, static (CGO_ENABLED=0): runsc re-executes
#                  itself after pivot_root, where no ELF interpreter exists,
#                  so a dynamically linked runsc dies at sandbox start with
#                  "error executing umounter". One change of ours is built
#                  in (errnoret_module below): seccomp rules return their
#                  own errno, so the job's filter means what it means under
#                  runc; its version reads "+airlock.errnoret".
#
# runc is pinned in tools/sandbox/go.mod and runsc in tools/sandbox/runsc/go.mod:
# they cannot share one build list, because runc v1.5 needs runtime-spec
# v1.3.0 (where LinuxPids.Limit became *int64) and gVisor compiles only
# against v1.2.x.
#
#   OUTDIR/airlock-execd  runc sessions' exec helper (docs/exec.md), from this
#                  repository, static (CGO_ENABLED=0): it runs inside the
#                  sandbox, on any image.
#
# Each binary has a stamp OUTDIR/.NAME.build recording what it was built from
# (module version, Go version, flags). When the stamp matches and the binary is
# there, nothing is rebuilt, so calling this before every test run is cheap.
# Debian's own runc package is never used: it is far older than the pinned one.
#
# Needs: Go, and (installed here with apt-get when missing) libseccomp-dev,
# pkg-config and a C compiler for runc, and the executor's run-time tools
# (see ensure_debs). Set SKIP_RUNSC=1 to build runc only.
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

# modver DIR MODULE prints the version of MODULE in DIR's build list.
modver() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }
gover="$(go env GOVERSION)"

# installed PKG succeeds when the Debian package is installed (dpkg -s also
# succeeds for one removed but for its config files).
installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

# ensure_debs installs what runc's seccomp support compiles and links
# against, and what the executor runs at run time (ip for each job's veth
# pair, mkfs.ext4 and losetup for its disk, git and tar for its source and
# patch; its nftables rules it programs itself, over netlink), only when
# something is missing:
# apt is slow even with nothing to do.
ensure_debs() {
  local missing=() p
  for p in libseccomp-dev pkg-config gcc libc6-dev iproute2 e2fsprogs util-linux git tar; do
    installed "$p" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "build.sh: installing ${missing[*]}" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# ensure_vm_debs installs what the vm runtime class runs (QEMU, without its
# recommends: no display, no firmware for other machines; xz-utils to cut
# the guest kernel out of Debian's compressed image), only when missing.
ensure_vm_debs() {
  local missing=() p
  for p in qemu-system-x86 xz-utils; do
    installed "$p" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "build.sh: installing ${missing[*]} (the vm runtime class)" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# fresh NAME STAMP succeeds when OUTDIR/NAME was built from STAMP.
fresh() {
  [[ -x "$out/$1" && -f "$out/.$1.build" && "$(cat "$out/.$1.build")" == "$2" ]]
}

# build DIR NAME STAMP VERIFY ENV... -- GO_BUILD_ARGS... builds in module DIR
# to a temporary name, runs VERIFY (a shell command; $BIN is the binary) on
# it, and only then renames it into place and writes the stamp, so an
# interrupted or wrong build never leaves a binary a later run would trust.
build() {
  local dir="$1" name="$2" stamp="$3" verify="$4"
  shift 4
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  if fresh "$name" "$stamp"; then
    echo "build.sh: $name up to date ($stamp)" >&2
    return 0
  fi
  local bin="$out/.$name.tmp" start=$SECONDS
  (cd "$dir" && env "${envs[@]}" go build -trimpath -o "$bin" "$@")
  if ! BIN="$bin" bash -c "$verify"; then
    rm -f "$bin"
    echo "build.sh: $name failed its check: $verify" >&2
    exit 1
  fi
  mv -f "$bin" "$out/$name"
  printf '%s\n' "$stamp" >"$out/.$name.build"
  echo "build.sh: built $name ($stamp) in $((SECONDS - start))s" >&2
}

runc_ver="$(modver "$here" github.com/opencontainers/runc)"
runc_stamp="runc $runc_ver $gover cgo tags=seccomp"
# Always: a binary built earlier says nothing of what this machine has now.
ensure_debs
ensure_vm_debs
build "$here" runc "$runc_stamp" '"$BIN" --version | grep -q "^libseccomp: "' CGO_ENABLED=1 -- \
  -buildmode=pie -tags seccomp \
  -ldflags "-X main.gitCommit=$runc_ver" \
  github.com/opencontainers/runc

# The exec helper's stamp is a hash of its sources and the module's go.sum.
repo="$(cd "$here/../.." && pwd)"
execd_sum="$(cd "$repo" && cat go.sum services/executor/cmd/airlock-execd/*.go services/executor/internal/sandbox/execd/*.go | sha256sum | cut -c1-12)"
build "$repo" airlock-execd "airlock-execd $gover static src=$execd_sum" '! LC_ALL=C readelf -l "$BIN" 2>/dev/null | grep -q "program interpreter"' CGO_ENABLED=0 -- \
  ./services/executor/cmd/airlock-execd

# errnoret_module DIR makes, under DIR, a copy of the runsc build module
# whose gVisor returns each SCMP_ACT_ERRNO rule's own errno (runc's
# behaviour) instead of always EPERM: gVisor's source is hard-linked from the
# module cache into DIR/gvisor (nothing in the cache changes), our
# patch/errnoret.go.in is added to its runsc/specutils/seccomp package, the
# package's two convertAction calls for rule and default actions are pointed
# at it, and DIR/mod replaces gvisor.dev/gvisor with that copy. A gVisor
# whose source no longer has those two calls fails the build here, so the
# change cannot silently lapse; the sandbox tests assert every rule's errno
# from inside runsc.
errnoret_module() {
  local dir="$1" src pkg
  # go list -m names no directory for a module not yet in the cache (a
  # fresh machine): download it first.
  (cd "$here/runsc" && go mod download gvisor.dev/gvisor)
  src="$(cd "$here/runsc" && go list -m -f '{{.Dir}}' gvisor.dev/gvisor)"
  if [[ -z "$src" || ! -d "$src" ]]; then
    echo "build.sh: gvisor.dev/gvisor is not in the module cache after go mod download" >&2
    exit 1
  fi
  # Hard links where the cache and DIR share a filesystem; a copy where
  # they do not (a tmpfs /tmp).
  cp -al "$src" "$dir/gvisor" 2>/dev/null || { rm -rf "$dir/gvisor"; cp -a "$src" "$dir/gvisor"; }
  pkg="$dir/gvisor/runsc/specutils/seccomp"
  # The copy's directories are new (and read-only, as in the cache); its
  # files are the cache's own inodes, so no file's mode is touched.
  chmod u+w "$pkg"
  sed -e 's/convertAction(s\.DefaultAction)/airlockErrnoAction(s.DefaultAction, s.DefaultErrnoRet)/' \
    -e 's/convertAction(syscall\.Action)/airlockErrnoAction(syscall.Action, syscall.ErrnoRet)/' \
    "$pkg/seccomp.go" >"$pkg/seccomp.go.new"
  if (($(grep -c 'airlockErrnoAction(' "$pkg/seccomp.go.new") != 2)); then
    echo "build.sh: $src/runsc/specutils/seccomp/seccomp.go no longer has the two convertAction calls the errnoRet change rewrites" >&2
    exit 1
  fi
  # Replace the hard link, never write through it into the module cache.
  rm -f "$pkg/seccomp.go"
  mv "$pkg/seccomp.go.new" "$pkg/seccomp.go"
  cp "$here/runsc/patch/errnoret.go.in" "$pkg/airlock_errnoret.go"
  mkdir "$dir/mod"
  cp "$here/runsc/go.mod" "$here/runsc/go.sum" "$dir/mod/"
  (cd "$dir/mod" && go mod edit -replace "gvisor.dev/gvisor=$dir/gvisor")
}

if [[ "${SKIP_RUNSC:-}" != 1 ]]; then
  gvisor_ver="$(modver "$here/runsc" gvisor.dev/gvisor)"
  # The stamp covers our file and this script (whose sed makes the change),
  # so changing either rebuilds runsc.
  patch_sum="$(cat "$here/runsc/patch/errnoret.go.in" "$here/build.sh" | sha256sum | cut -c1-12)"
  runsc_stamp="runsc $gvisor_ver $gover static errnoret=$patch_sum"
  mod_dir="$(mktemp -d)"
  trap 'find "$mod_dir" -type d -exec chmod u+w {} + 2>/dev/null; rm -rf "$mod_dir"' EXIT
  fresh runsc "$runsc_stamp" || errnoret_module "$mod_dir"
  # A static binary has no program interpreter (PT_INTERP).
  # Our change is in (its version says so), and the binary is static.
  build "$mod_dir/mod" runsc "$runsc_stamp" '"$BIN" --version | grep -q "+airlock.errnoret" && ! LC_ALL=C readelf -l "$BIN" 2>/dev/null | grep -q "program interpreter"' CGO_ENABLED=0 -- \
    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$gvisor_ver+airlock.errnoret" \
    gvisor.dev/gvisor/runsc
fi
