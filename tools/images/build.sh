#!/usr/bin/env bash
# build.sh OUTDIR PACKAGE... builds a Debian root filesystem with the given
# packages into OUTDIR/rootfs.tar, using mmdebstrap (apt-get install
# mmdebstrap). The tar is the whole root filesystem (everything it needs at
# run time is in it) minus documentation; it still holds mmdebstrap's
# device nodes under ./dev, which pkg/rootfsimage drops
# when it makes the image's layer (a runtime mounts its own /dev, and a
# layer with a device node is refused).
#
# Environment: DEBIAN_SUITE (default bookworm), DEBIAN_MIRROR (default:
# mmdebstrap's, deb.debian.org with the suite's -updates and -security).
#
# As root mmdebstrap works in its root mode (a chroot, no namespaces
# needed); as another user it picks unshare mode, which needs
# unprivileged user namespaces and subuid ranges.
set -euo pipefail

if [ $# -lt 2 ]; then
	echo "usage: $0 OUTDIR PACKAGE..." >&2
	exit 2
fi
out=$1
shift
suite=${DEBIAN_SUITE:-bookworm}
if ! command -v mmdebstrap >/dev/null; then
	echo "$0: mmdebstrap is not installed (apt-get install -y mmdebstrap)" >&2
	exit 1
fi
mkdir -p "$out"
include=$(IFS=,; echo "$*")
mirror=()
if [ -n "${DEBIAN_MIRROR:-}" ]; then
	mirror=("$DEBIAN_MIRROR")
fi

# Docs, manuals and translations are most of a minbase system's files and
# nothing a build needs; copyright files stay.
mmdebstrap \
	--variant=minbase \
	--include="$include" \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--format=tar \
	"$suite" "$out/.rootfs.tmp.tar" "${mirror[@]}"
mv "$out/.rootfs.tmp.tar" "$out/rootfs.tar"
