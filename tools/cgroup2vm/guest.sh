#!/usr/bin/env bash
# Runs inside the cgroup-v2 VM (suite.sh): the cgroup tests of the sandbox
# package in a delegated cgroup, then the end-to-end smoke, then checks
# that nothing was made outside the delegated cgroups and nothing is left.
# $1 is the directory of the host-built binaries.
set -uo pipefail
out=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
cg=/sys/fs/cgroup
fail=0

echo "== cgroup v2: $(cat $cg/cgroup.controllers); kernel $(uname -r); in $(cat /proc/self/cgroup)"
[[ -e $cg/cgroup.subtree_control && ! -e $cg/memory ]] || { echo "not a cgroup-v2-only machine"; exit 1; }
before=$(cd $cg && find . -mindepth 1 -maxdepth 1 -type d | sort)

# The sandbox tests as a systemd service runs: alone in a delegated cgroup
# (this shell is in /payload; the test binary gets a sibling of its own,
# airlock-test.service, with the controllers handed down to it), where the
# executor code moves itself into a leaf. -test.timeout bounds it.
mkdir -p $cg/airlock-test.service
# TestDeadline$: the deadline's tree kill, not TestDeadlineTimerRechecksExtendedDeadline
# (the timer's logic, which no cgroup decides; it runs in the host's suite).
sandbox_tests='TestChooseCgroups|TestWithoutNewerKernelFeatures|TestJobsAreOOMKilledFirst|TestCgroupParentOutsideExecutor|TestRecover$|TestForkBomb|TestMemoryBalloon|TestDeadline$|TestCancel|TestDestroy|TestUpdate|TestDiskBandwidth|TestCPUQuota|TestUsagePlausible|TestUsefulWork|TestExec$|TestExecHelperKernel$|TestExecHelperBoundary$|TestProbe$|TestExportCgroup|TestKillsAtOnce'
echo "== sandbox package (-run '$sandbox_tests')"
t0=$SECONDS
(
  cd "$root/services/executor/internal/sandbox" &&
    echo $BASHPID >$cg/airlock-test.service/cgroup.procs &&
    exec env AIRLOCK_TEST_PROBE="$out/probe" AIRLOCK_TEST_EXECD="$out/airlock-execd" "$out/sandbox.test" -test.run "$sandbox_tests" -test.v -test.timeout 10m
)
rc=$?
echo "== sandbox package: exit $rc after $((SECONDS - t0)) s"
((rc == 0)) || fail=1
left=$(find $cg/airlock-test.service -mindepth 1 -type d ! -name supervisor)
if [[ -n $left ]]; then
  echo "cgroups left in the delegated subtree: $left"
  fail=1
fi

# The end-to-end smoke from the root cgroup (exempt from the
# no-internal-process rule, so the stack's processes share it, as dev up's
# do on a workstation).
# A job's cancel is its sandbox's Run context cancelled (runs.Manager.Cancel):
# under v2 the sandbox package's TestCancel proves that kill and the
# cgroup's removal, and TestCgroupLimitsEndToEnd's deadline job the same
# tree kill end to end with no job cgroup left, so the end-to-end
# TestCancelStopsTheSandbox runs on the host's suite only.
echo $$ >$cg/cgroup.procs
e2e_tests='TestDevUpDown|TestCgroupLimitsEndToEnd|TestRunningJobChangesAreGatedAndEnforced|TestExecutorKilledMidRunLeavesNothing'
echo "== end to end (-run '$e2e_tests')"
t0=$SECONDS
(
  cd "$root/test/e2e" &&
    exec env AIRLOCK_E2E_BIN_DIR="$out" "$out/e2e.test" -test.run "$e2e_tests" -test.v -test.timeout 10m -test.parallel 1
)
rc=$?
echo "== end to end: exit $rc after $((SECONDS - t0)) s"
((rc == 0)) || fail=1

# Nothing outside the delegated cgroups: the root holds what it held, the
# test service and what the e2e stacks' executors made (below
# /airlock, removed at their stop).
rmdir $cg/airlock-test.service/supervisor $cg/airlock-test.service 2>/dev/null
after=$(cd $cg && find . -mindepth 1 -maxdepth 1 -type d | sort)
if ! extra=$(comm -13 <(echo "$before") <(echo "$after")); then
  echo "cannot compare the cgroups before and after"
  fail=1
fi
extra=$(grep -v '^\./airlock$' <<<"$extra")
if [[ -n $extra ]]; then
  echo "cgroups made outside the executors' subtrees: $extra"
  fail=1
fi
if [[ -d $cg/airlock ]] && jobs=$(find $cg/airlock -mindepth 2 -type d) && [[ -n $jobs ]]; then
  echo "job cgroups left: $jobs"
  fail=1
fi
echo "== cgroup2 suite: $( ((fail == 0)) && echo PASS || echo FAIL)"
exit $fail
