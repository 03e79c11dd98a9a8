#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy, at the version go.mod pins
# (gen.sh writes it), into the test cache, and prints the binary's path:
#
#   tools/kubeapiserver/build.sh     -> ~/.cache/airlock-test/kube-apiserver-v1.36.3/kube-apiserver
#
# Only deploy's server-side dry-run test (make test-chart) uses it. A cold
# build downloads ~100 modules and compiles ~2000 packages (~15 minutes on
# two cores, a ~150 MB binary), so it is cached per machine in
# $AIRLOCK_TEST_CACHE (default ~/.cache/airlock-test, the cache the other
# tests' built tools share) with a stamp of what it was built from (version,
# Go version, go.sum): when the stamp matches, the binary reports that
# version and is there, nothing is rebuilt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS=-mod=readonly

ver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
[[ "$ver" =~ ^v1\.([0-9]+)\. ]] || { echo "build.sh: k8s.io/kubernetes $ver is not v1.x" >&2; exit 1; }
minor="${BASH_REMATCH[1]}"
out="${AIRLOCK_TEST_CACHE:-$HOME/.cache/airlock-test}/kube-apiserver-$ver"
bin="$out/kube-apiserver"
stamp="kube-apiserver $ver $(go env GOVERSION) go.sum=$(sha256sum go.sum | cut -c1-12)"

# reports BIN succeeds when BIN says it is Kubernetes $ver.
reports() { [[ "$("$1" --version 2>/dev/null)" == "Kubernetes $ver" ]]; }

if [[ -x "$bin" && -f "$out/.build" && "$(cat "$out/.build")" == "$stamp" ]] && reports "$bin"; then
  echo "$bin"
  exit 0
fi
mkdir -p "$out"
start=$SECONDS
echo "build.sh: building kube-apiserver $ver (cold: ~15 minutes)" >&2
# The version variables are what Kubernetes' own build (hack/lib/version.sh)
# sets; without them the binary calls itself v0.0.0-master.
pkg=k8s.io/component-base/version
go build -trimpath -o "$out/.kube-apiserver.tmp" \
  -ldflags "-s -w -X $pkg.gitVersion=$ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
  k8s.io/kubernetes/cmd/kube-apiserver
if ! reports "$out/.kube-apiserver.tmp"; then
  echo "build.sh: the binary says $("$out/.kube-apiserver.tmp" --version 2>&1), not Kubernetes $ver" >&2
  rm -f "$out/.kube-apiserver.tmp"
  exit 1
fi
mv -f "$out/.kube-apiserver.tmp" "$bin"
printf '%s\n' "$stamp" >"$out/.build"
echo "build.sh: built kube-apiserver $ver in $((SECONDS - start))s" >&2
echo "$bin"
