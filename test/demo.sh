#!/usr/bin/env bash
# The main job on one machine, with embedded defaults: bring up authority,
# executor and publisher as separate processes over mTLS, with the sample
# repository served by the stack's HTTPS git server; check their health;
# run an agent-style job in a real runc sandbox (edit a file, run the
# tests); show what the sandbox kept from it; review, approve and publish
# the result as one commit on the protected branch; show that a result
# carrying a credential is refused with its approval unspent; run an
# agent's loop in one session; run the repository's pytest tests in a
# Debian image with python3 and pytest, pushed to the stack's registry (the
# host template has no pytest); and bring everything down.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${AIRLOCK_DEMO_DIR:-$(mktemp -d -t airlock-demo.XXXXXX)}
airlock=./bin/airlock
cleanup() { "$airlock" dev down --dir "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

# A sample repository whose test fails until the greeting is fixed.
repo="$dir/sample-repo"
mkdir -p "$repo/lib"
printf 'hello\n' >"$repo/lib/greet.txt"
printf '#!/bin/sh\ngot=$(cat lib/greet.txt)\n[ "$got" = "hello, airlock" ] || { echo "FAIL: greeting is $got"; exit 1; }\necho "PASS: greeting is $got"\n' >"$repo/test.sh"
chmod +x "$repo/test.sh"
printf 'from pathlib import Path\n\n\ndef test_greeting():\n    assert Path("lib/greet.txt").read_text() == "hello, airlock\\n"\n' >"$repo/test_greet.py"
git -C "$repo" init -q -b main
git -C "$repo" add -A
git -C "$repo" -c user.name=demo -c user.email=demo@example.com commit -q -m "sample"

step "airlock dev up --dir $dir --repo sample=$repo --registry"
"$airlock" dev up --dir "$dir" --repo "sample=$repo" --registry
export AIRLOCK_CONFIG="$dir/client.yaml"

step "airlock status (health over mTLS as client/dev)"
"$airlock" status

probe=./bin/grpc-health-probe
[ -x "$probe" ] || go build -modfile=tools/go.mod -o bin/ github.com/grpc-ecosystem/grpc-health-probe
pki="$dir/pki"
addr=$(sed -n "/^authority:/,/address:/s/ *address: *//p" "$dir/client.yaml")
step "grpc-health-probe against the authority with client/dev's certificate, then without one"
"$probe" -addr "$addr" -tls -tls-ca-cert "$pki/ca.crt" -tls-client-cert "$pki/client/dev.crt" \
  -tls-client-key "$pki/client/dev.key" -tls-server-name localhost
if "$probe" -addr "$addr" -tls -tls-ca-cert "$pki/ca.crt" -tls-server-name localhost -connect-timeout 2s; then
  echo "FAIL: the authority answered a client without a certificate" >&2
  exit 1
fi

step "a job runs the repository's tests as checked in (they fail: exit status 1 comes back)"
set +e
"$airlock" job submit --repo sample --rev main --wait -- ./test.sh
code=$?
set -e
[ "$code" = 1 ] || { echo "FAIL: expected the job's own exit status 1, got $code" >&2; exit 1; }

step "an agent job edits the repository, runs the tests in the sandbox, and asks to publish to sample:main"
"$airlock" job submit --repo sample --rev main --publish-to sample:main --wait -- \
  sh -c 'printf "hello, airlock\n" > lib/greet.txt && ./test.sh && echo "I am $(id -u) in $(hostname), caps $(grep CapEff /proc/self/status | cut -f2)"'

job=$("$airlock" job list -o json | sed -n 's/.*"jobId": *"\([^"]*\)".*/\1/p' | head -1)
step "airlock job get $job"
"$airlock" job get "$job"

approval=$("$airlock" approval list --as approver/alice -o json | sed -n 's/.*"approvalId": *"\([^"]*\)".*/\1/p' | head -1)
step "the result waits for review: airlock approval show $approval --as approver/alice"
"$airlock" approval show "$approval" --as approver/alice

step "the requester may not approve its own job, even holding an approver certificate (approver/dev)"
if "$airlock" approval approve "$approval" --as approver/dev; then
  echo "FAIL: self-approval was accepted" >&2
  exit 1
fi

step "another approver approves it"
"$airlock" approval approve "$approval" --as approver/alice --comment "greeting fixed, test passes"

step "the pipeline publishes it: airlock publish $approval (as pipeline/deploy)"
"$airlock" publish "$approval"
bare="$dir/git/data/sample.git"
step "the protected branch now has exactly one more commit: the approved one, with its trailers"
git -C "$bare" log --format='%h %an <%ae> %ad%n%w(0,4,4)%B' main
[ "$(git -C "$bare" rev-list --count main)" = 2 ] || { echo "FAIL: want exactly one commit on top of the sample's" >&2; exit 1; }
git -C "$bare" show --stat --format= main

step "publishing the same approval again returns the same deployment and pushes nothing"
first=$("$airlock" deployment list -o json | sed -n 's/.*"deploymentId": *"\([^"]*\)".*/\1/p' | head -1)
again=$("$airlock" publish "$approval" -o json | sed -n 's/.*"deploymentId": *"\([^"]*\)".*/\1/p' | head -1)
echo "first $first, again $again"
[ -n "$first" ] && [ "$first" = "$again" ] || { echo "FAIL: a second publish made another deployment" >&2; exit 1; }
[ "$(git -C "$bare" rev-list --count main)" = 2 ] || { echo "FAIL: a second publish pushed again" >&2; exit 1; }

step "what the sandbox could not do: read a file outside its workspace, reach the authority"
out=$("$airlock" job submit --repo sample --rev main --wait -- sh -c \
  "cat '$dir/authority/grant.key' 2>&1; curl -sS -m 3 -k 'https://$addr' 2>&1; true")
printf '%s\n' "$out" | grep -E 'No such file|curl: \(' | sed 's/^/  job said: /'
printf '%s\n' "$out" | grep -q 'No such file' || { echo "FAIL: the job could read the host's grant key" >&2; exit 1; }
printf '%s\n' "$out" | grep -q 'curl: (' || { echo "FAIL: the job reached the authority" >&2; exit 1; }

step "a job writes a credential-looking token into a file; it is approved, and the publisher refuses it"
"$airlock" job submit --repo sample --rev main --publish-to sample:main --wait -- sh -c \
  'printf "[default]\naws_access_key_id = AKIAQYLPMN5HHHFPZAM2\n" > lib/aws.ini' >/dev/null
leaky=$("$airlock" approval list --as approver/alice --state pending -o json | sed -n 's/.*"approvalId": *"\([^"]*\)".*/\1/p' | head -1)
"$airlock" approval approve "$leaky" --as approver/bob --comment "looks fine to me"
set +e
"$airlock" publish "$leaky"
code=$?
set -e
[ "$code" = 1 ] || { echo "FAIL: a result with a credential was published (exit $code)" >&2; exit 1; }
step "its approval stays unspent, and the branch did not move"
"$airlock" approval list --as approver/alice
"$airlock" approval list --as approver/alice --state approved -o json | grep -q "$leaky" || { echo "FAIL: the refused publish spent the approval" >&2; exit 1; }
[ "$(git -C "$bare" rev-list --count main)" = 2 ] || { echo "FAIL: the branch moved" >&2; exit 1; }

step "a running job asks for more memory: widening waits for an approver; narrowing applies at once"
running=$("$airlock" job submit --repo sample --rev main --memory 256MiB -- sh -c 'echo running; sleep 120')
for _ in $(seq 100); do
  "$airlock" job get "$running" | grep -q '^state      running' && break
  sleep 0.1
done
out=$("$airlock" job update "$running" --memory 512MiB)
echo "$out"
change=$(printf '%s\n' "$out" | sed -n 's/.*waiting for approval \([^ ]*\).*/\1/p')
[ -n "$change" ] || { echo "FAIL: widening a running job did not wait for an approval" >&2; exit 1; }
"$airlock" approval show "$change" --as approver/bob
"$airlock" approval approve "$change" --as approver/bob --comment "needs the headroom"
"$airlock" job update "$running" --memory 384MiB
"$airlock" job cancel "$running" >/dev/null

step "a session: one sandbox across an agent's commands; /work is a git repository; every exec has an id"
# On the sample's first commit, from before the publish above.
sess=$("$airlock" session create --repo sample --rev "$(git -C "$repo" rev-parse HEAD)")
"$airlock" session exec "$sess" --exec-id test-1 -- ./test.sh || echo "  (exit status $?, as the test fails)"
printf 'hello, airlock\n' >"$dir/greet.txt"
"$airlock" session cp "$dir/greet.txt" "$sess:/work/lib/greet.txt"
"$airlock" session exec "$sess" --exec-id status -- git status --short
"$airlock" session exec "$sess" --exec-id test-2 -- ./test.sh
echo "retrying exec test-2 by its id returns its record; it does not run it again:"
"$airlock" session exec "$sess" --exec-id test-2 -- ./test.sh
"$airlock" session get "$sess"
"$airlock" session finish "$sess"

# A Debian root filesystem with python3 and pytest (mmdebstrap, 1-4 minutes
# the first time), kept under ~/.cache/airlock-demo by the package list and
# the build script, so later demos reuse it.
packages=(python3 python3-pytest)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/airlock-demo
key=$( { printf '%s\n' "${packages[@]}"; cat tools/images/build.sh; } | sha256sum | cut -c1-16)
rootfs="$cache/rootfs-$key.tar"
step "an image: a Debian root filesystem with ${packages[*]}, pushed to the stack's registry"
if [ -f "$rootfs" ]; then
  echo "reusing $rootfs (remove it to build again)"
else
  if ! command -v mmdebstrap >/dev/null; then
    echo "installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
  fi
  echo "building with tools/images/build.sh (mmdebstrap; minutes the first time)"
  start=$SECONDS
  tools/images/build.sh "$dir/image" "${packages[@]}" >"$dir/image-build.log" 2>&1 ||
    { tail -20 "$dir/image-build.log"; echo "FAIL: tools/images/build.sh" >&2; exit 1; }
  mkdir -p "$cache"
  mv "$dir/image/rootfs.tar" "$rootfs.tmp.$$" && mv "$rootfs.tmp.$$" "$rootfs"
  echo "built in $((SECONDS - start))s, cached as $rootfs"
fi
"$airlock" dev image push --dir "$dir" --rootfs "$rootfs" --name dev/python:3
registry=$(sed -n 's/^ *addr: *"\(.*\)"$/\1/p' "$dir/registry/config.yml")
image="$registry/dev/python:3"

step "the host template has no pytest"
"$airlock" job submit --repo sample --rev main --wait -- sh -c 'command -v pytest || echo "no pytest on the host template"'

unfixed=$(git -C "$repo" rev-parse HEAD)
step "the repository's pytest test in the image ($image): it fails on the sample's first commit"
set +e
"$airlock" job submit --repo sample --rev "$unfixed" --image "$image" --wait -- python3 -m pytest -q -p no:cacheprovider
code=$?
set -e
[ "$code" = 1 ] || { echo "FAIL: expected pytest's exit status 1 on the unfixed greeting, got $code" >&2; exit 1; }
step "... and passes on main, after the published fix"
"$airlock" job submit --repo sample --rev main --image "$image" --wait -- python3 -m pytest -q -p no:cacheprovider
job=$("$airlock" job list -o json | sed -n 's/.*"jobId": *"\([^"]*\)".*/\1/p' | head -1)
step "airlock job get $job: the image as asked, resolved to its digest"
"$airlock" job get "$job"
step "airlock image list: the tenant's images in the executor's cache"
"$airlock" image list

step "every decision is on the hash-chained audit log"
"$airlock" audit list --as approver/alice
# The authority signs a checkpoint of the log's head, outside its database,
# within a second of every 10th entry (the dev stack's setting); verify
# checks the chain against them.
sleep 1.5
"$airlock" audit checkpoints --as approver/bob
"$airlock" audit verify --as approver/alice

step "airlock dev down --dir $dir"
trap - EXIT
"$airlock" dev down --dir "$dir"
