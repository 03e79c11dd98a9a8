#!/usr/bin/env bash
# The cgroup-v2 suite (make test-cgroup2): builds the test binaries here,
# boots the cgroup-v2-only VM (run.sh) and runs inside it (guest.sh) the
# sandbox tests that touch cgroups, as a systemd-delegated service would
# run, and an end-to-end smoke of the real binaries. Exits with their
# status. Root; the runtimes must be built (make build does).
#
# Which tests, and why these: under TCG code runs 5-10x slower than here,
# so the VM runs what cgroups decide, not the whole suite. Sandbox package:
# the driver choice, the limits (OOM balloon, fork bomb at the pids limit,
# CPU quota, disk bandwidth, deadline with the tree killed, usage numbers),
# live updates (raise and lower memory, a shrink below usage refused with
# the old limit kept, pids, deadline), cancel and destroy, the parent's
# memory limit and OOM preference, the executor outside its job parent,
# Recover after a kill -9 of the process that made the sandboxes, real work
# (threads, make, a compiler) under runc and runsc, session execs, and the
# export cgroup the executor's git runs in after a job.
# End to end: dev up and `airlock status` (the cgroup mode and
# controllers), one job per limit through the CLI (cancel is the sandbox package's), a live memory
# change, and kill -9 of the executor then restart leaving nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="/usr/local/go/bin:$PATH"

out=$root/.cache/cgroup2vm-bin
rm -rf "$out"
mkdir -p "$out"
t0=$SECONDS
echo "cgroup2: building the test binaries" >&2
CGO_ENABLED=0 go build -o "$out/probe" ./services/executor/internal/sandbox/testdata/probe
CGO_ENABLED=0 go build -o "$out/airlock-execd" ./services/executor/cmd/airlock-execd
go test -c -o "$out/sandbox.test" ./services/executor/internal/sandbox
go test -c -o "$out/e2e.test" ./test/e2e
go build -o "$out/" ./cmd/airlock ./services/authority/cmd/authority ./services/executor/cmd/executor ./services/publisher/cmd/publisher
go build -modfile=tools/go.mod -o "$out/" github.com/grpc-ecosystem/grpc-health-probe
for r in runc runsc; do
  [[ -x bin/$r ]] || { echo "cgroup2: bin/$r is missing: run make build first" >&2; exit 1; }
  ln -s "$root/bin/$r" "$out/$r"
done
echo "cgroup2: built in $((SECONDS - t0)) s; booting the VM" >&2

# CI=true inside too: a runtime or kernel feature the tests need and the VM
# lacks fails them rather than skipping.
t0=$SECONDS
set +e
tools/cgroup2vm/run.sh --mem 6144 --cpus 2 --timeout 1500 --env CI=true -- bash "$root/tools/cgroup2vm/guest.sh" "$out"
rc=$?
set -e
echo "cgroup2: the VM ran $((SECONDS - t0)) s and exited $rc" >&2
exit $rc
