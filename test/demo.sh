#!/usr/bin/env bash
# The main job on one machine: bring up authority, executor and publisher as
# separate processes over mTLS, check their health, and bring them down.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${AIRLOCK_DEMO_DIR:-$(mktemp -d -t airlock-demo.XXXXXX)}
airlock=./bin/airlock
cleanup() { "$airlock" dev down --dir "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== airlock dev up --dir $dir"
"$airlock" dev up --dir "$dir"
export AIRLOCK_CONFIG="$dir/client.yaml"

echo
echo "== airlock status (health over mTLS as client/dev)"
"$airlock" status

probe=./bin/grpc-health-probe
[ -x "$probe" ] || go build -modfile=tools/go.mod -o bin/ github.com/grpc-ecosystem/grpc-health-probe
pki="$dir/pki"
for svc in authority executor publisher; do
  addr=$(sed -n "/^$svc:/,/address:/s/ *address: *//p" "$dir/client.yaml")
  echo
  echo "== grpc-health-probe $svc at $addr with client/dev's certificate"
  "$probe" -addr "$addr" -tls -tls-ca-cert "$pki/ca.crt" -tls-client-cert "$pki/client/dev.crt" \
    -tls-client-key "$pki/client/dev.key" -tls-server-name localhost
  echo "== the same probe without a client certificate (must be refused)"
  if "$probe" -addr "$addr" -tls -tls-ca-cert "$pki/ca.crt" -tls-server-name localhost -connect-timeout 2s; then
    echo "FAIL: $svc answered a client without a certificate" >&2
    exit 1
  fi
done

echo
echo "== airlock dev down --dir $dir"
trap - EXIT
"$airlock" dev down --dir "$dir"
