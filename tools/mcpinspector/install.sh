#!/usr/bin/env bash
# Installs the MCP Inspector pinned by package-lock.json here with npm ci,
# once per lock file, into ${AIRLOCK_TEST_CACHE:-~/.cache/airlock-test}/mcpinspector/HASH,
# and prints the path of its launcher (run it with node). test/e2e/mcp_test.go
# drives `airlock mcp` with its CLI mode (--cli); `make mcp-inspector` runs this.
# Needs node and npm (Debian's nodejs and npm; .ci/run installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for c in node npm; do
  command -v "$c" >/dev/null || { echo "mcp-inspector: $c is not installed (apt-get install nodejs npm)" >&2; exit 1; }
done
hash=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)
root=${AIRLOCK_TEST_CACHE:-$HOME/.cache/airlock-test}/mcpinspector
dir=$root/$hash
launcher=$dir/node_modules/@modelcontextprotocol/inspector/cli/build/cli.js
if [[ ! -f $dir/.complete ]]; then
  mkdir -p "$root"
  tmp=$(mktemp -d "$root/.install-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/package.json" "$here/package-lock.json" "$tmp/"
  # No install scripts: the packages are built already; engine warnings
  # (the Inspector asks for a newer node than Debian's) are not errors.
  (cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
[[ -f $launcher ]] || { echo "mcp-inspector: $launcher missing after install" >&2; exit 1; }
echo "$launcher"
