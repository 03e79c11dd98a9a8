#!/usr/bin/env bash
# cgroup2vm: run one command as root in a throwaway QEMU machine whose only
# cgroup hierarchy is cgroup v2, on this machine's own root filesystem.
#
#   tools/cgroup2vm/run.sh [--mem MiB] [--cpus N] [--timeout SECONDS] [--env NAME=VALUE]... -- COMMAND [ARGS...]
#
# The command's stdout and stderr stream to this script's stdout; the script
# exits with the command's status, or with
#   124  the --timeout (default 3600 s, boot included) passed: the VM is killed,
#   125  the VM failed: no boot, a kernel panic, or no exit status came back,
# each with a "cgroup2vm:" message on stderr. qemu never outlives the script
# (it is killed on timeout, on an interrupt, and by PR_SET_PDEATHSIG if the
# script itself is killed).
#
# Why a VM: CI hosts (and this one) boot with cgroup v1 hierarchies mounted,
# and a cgroup hierarchy cannot be changed without a reboot. The guest boots
# with systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all, and its init
# mounts cgroup2 at /sys/fs/cgroup (nsdelegate,memory_recursiveprot, as
# systemd does) with every controller enabled below the root; the command
# runs in the child cgroup /payload, as a service would under systemd (the
# no-internal-process rule applies to it).
#
# Why TCG: the host's /dev/kvm is a PVM variant that ordinary guests cannot
# use, so qemu emulates the CPU (-accel tcg,thread=multi: one host thread per
# vCPU). What it costs, measured on a 2-core host: ~2 s on the host before
# qemu starts (apt-cache, initramfs, mkfs), ~4-6 s of guest boot to the
# command, ~1 s to power off: `run.sh -- true` takes 8-10 s. Inside, code
# runs about 5-10x slower than on the host: `runc --version` 0.5-1 s, a
# small Go test binary 0.4-1 s (0.1 s on the host), `runc run` of a busybox
# container 1.6 s, and `go test` of one small package 30 s even with the
# host's warm build cache: build test binaries on the host (go test -c -o
# bin/x.test) and run those inside. The console is a 16550 serial port:
# ~450 KB/s of output.
#
# Why Debian's generic kernel (linux-image-amd64 -> linux-image-<abi>-amd64):
# it is a real distribution kernel with every module the sandbox needs (9p,
# overlay, loop, nf_tables, veth, tun); the cloud flavour lacks 9p. It is
# fetched with `apt-get download` and unpacked with `dpkg -x`, never
# installed on the host, and cached by package name and version in
# $AIRLOCK_CGROUP2VM_CACHE (default /var/cache/airlock-cgroup2vm: one copy
# per machine, shared by every checkout and worktree, kept across `git clean`,
# and on the root filesystem so the guest sees the modules at the same path).
# busybox-static is fetched and cached the same way (installing it on the
# host would replace Debian's busybox); it is the initramfs's /init and does
# the guest's module loading (its depmod runs once per cached kernel). The
# kernel's ELF image is cut out of the xz-compressed vmlinuz once, and qemu
# boots it through its PVH entry point with the qboot firmware: decompressing
# under TCG would add ~10 s to every boot. A kernel update in the apt lists
# means one new download and unpacking (~70 MB, ~9 s; 435 MB in the cache);
# without apt lists or network the newest cached kernel is used.
#
# Root filesystem: the host's / is shared read-only over virtio-9p
# (readonly=on: the guest cannot write the host). Mounts below / on the host
# (a separate /work, say) are seen through the share too, since qemu's 9p
# server walks the host's mount tree (multidevs=remap keeps inode numbers
# apart). The guest's root is an overlay of that share under an upper layer
# on the scratch disk, because the guest needs mount points the host lacks
# (/scratch, /lib/modules/<abi>); everything the host has is at the same
# path, read-only in effect for the host and writable (thrown away) for the
# guest. The initramfs enters it with switch_root, not chroot: the kernel
# refuses CLONE_NEWUSER to a chrooted process, and the sandbox needs user
# namespaces.
#
# Inside: tmpfs at /run and /tmp (host files under /tmp, /run, /dev, /proc
# and /sys are hidden: put host-built binaries under the repo, e.g. bin/ or
# .cache/), devtmpfs /dev with /dev/pts and /dev/shm, proc, sysfs, cgroup2;
# an 8 GiB sparse ext4 scratch disk (virtio-blk, made per run, deleted after)
# at /scratch with HOME=/scratch/home and TMPDIR=/scratch/tmp; lo up; no NIC.
# The modules the sandbox uses are loaded up front (loop, overlay, veth, tun,
# nf_tables and the nft expressions the executor programs) and the kernel
# loads others on demand through busybox modprobe (kernel.modprobe); busybox
# applets (modprobe, lsmod, ...) are at the end of PATH, under
# /run/cgroup2vm/bin. The environment is PATH (with /usr/local/go/bin),
# HOME, TMPDIR and GOPATH on the scratch disk, GOCACHE and GOMODCACHE the
# host's (warm; writes to them go to the thrown-away layer), GOPROXY=off (no
# network), CI as the caller has it, AIRLOCK_CGROUP2VM=1, and --env pairs;
# stdin is /dev/null. The working directory is the caller's.
#
# Debugging: AIRLOCK_CGROUP2VM_DEBUG=1 shows the kernel's messages and the
# init's steps with the guest's uptime; AIRLOCK_CGROUP2VM_TIMES=1 prints the
# run's timings at the end.
set -euo pipefail

prog=cgroup2vm
die() { echo "$prog: $*" >&2; exit 125; }
usage() {
  echo "usage: $0 [--mem MiB] [--cpus N] [--timeout SECONDS] [--env NAME=VALUE]... -- COMMAND [ARGS...]" >&2
  exit 2
}

mem=4096 cpus=2 timeout=3600 envs=()
while (($#)); do
  case $1 in
  --mem) mem=${2:?}; shift 2 ;;
  --cpus) cpus=${2:?}; shift 2 ;;
  --timeout) timeout=${2:?}; shift 2 ;;
  --env) envs+=("${2:?}"); shift 2 ;;
  --) shift; break ;;
  *) usage ;;
  esac
done
(($#)) || usage
[[ $mem =~ ^[0-9]+$ && $cpus =~ ^[0-9]+$ && $timeout =~ ^[0-9]+$ ]] || usage
for e in "${envs[@]}"; do [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || usage; done
[[ $(id -u) == 0 ]] || die "must run as root (qemu serves the host's files to a root guest)"
qemu=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 not found (apt-get install --no-install-recommends qemu-system-x86)"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found (e2fsprogs)"
# The guest's /tmp, /run, /dev, /proc and /sys are its own.
hidden() { case $1/ in /tmp/* | /run/* | /dev/* | /proc/* | /sys/*) return 0 ;; esac; return 1; }
hidden "$PWD" && die "the working directory $PWD is hidden in the VM (its /tmp, /run, /dev, /proc and /sys are its own)"
[[ $1 == /* ]] && hidden "$1" && die "$1 is hidden in the VM (its /tmp, /run, /dev, /proc and /sys are its own): build it under the repo (e.g. bin/)"

cache=${AIRLOCK_CGROUP2VM_CACHE:-/var/cache/airlock-cgroup2vm}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd -P)
hidden "$cache" && die "the cache $cache would be hidden in the VM: the guest loads its kernel modules from there"

# resolve: "KERNELPKG KERNELVERSION BUSYBOXVERSION" from the apt lists in
# one apt-cache call (the metapackage depends on an exact version),
# refreshing the lists once if they lack the packages; empty if apt cannot.
resolve() {
  local q=(apt-cache show --no-all-versions linux-image-amd64 busybox-static) out
  out=$("${q[@]}" 2>/dev/null) || { apt-get update -qq >&2 2>/dev/null || true; out=$("${q[@]}" 2>/dev/null) || true; }
  awk '/^Package:/ {p = $2}
    p == "linux-image-amd64" && /^Depends:/ && match($0, /linux-image-[0-9][^ ,]*-amd64 \(= [^)]*\)/) {
      split(substr($0, RSTART, RLENGTH), f, /[ ()=]+/); k = f[1] " " f[2] }
    p == "busybox-static" && /^Version:/ {b = $2}
    END {if (k != "" && b != "") print k, b}' <<<"$out"
}

# fetch PKG VERSION DIR: unpack PKG=VERSION into DIR (atomically) unless
# DIR is there already.
fetch() {
  local pkg=$1 ver=$2 dir=$3 tmp
  [[ -d $dir ]] && return
  echo "$prog: fetching $pkg $ver into $dir" >&2
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  (cd "$tmp" && apt-get download -q "$pkg=$ver" >&2 2>/dev/null) ||
    { apt-get update -qq >&2 && (cd "$tmp" && apt-get download -q "$pkg=$ver" >&2); } ||
    { rm -rf "$tmp"; die "apt-get download $pkg=$ver failed"; }
  dpkg -x "$tmp"/*.deb "$tmp/root" || { rm -rf "$tmp"; die "dpkg -x $pkg failed"; }
  rm -f "$tmp"/*.deb
  mkdir -p "$(dirname "$dir")"
  mv "$tmp/root" "$dir" || { rm -rf "$tmp"; die "cannot move the unpacked $pkg to $dir"; }
  rmdir "$tmp"
}

# The kernel and busybox, under a lock so concurrent runs fetch once.
exec 9>"$cache/.lock"
flock 9
read -r kpkg kver bbver < <(resolve) || true
if [[ -n $kpkg && -n $kver ]]; then
  kdir=$cache/kernel/${kpkg}_$kver
  fetch "$kpkg" "$kver" "$kdir"
else
  kdir=$(printf '%s\n' "$cache"/kernel/linux-image-*_* | sort -V | tail -n 1)
  [[ -d $kdir ]] || die "cannot resolve linux-image-amd64 from apt and no kernel is cached in $cache/kernel"
  echo "$prog: apt does not resolve linux-image-amd64: using the cached $(basename "$kdir")" >&2
fi
if [[ -n $bbver ]]; then
  bbdir=$cache/busybox/${bbver//:/_}
  fetch busybox-static "$bbver" "$bbdir"
else
  bbdir=$(printf '%s\n' "$cache"/busybox/* | sort -V | tail -n 1)
  [[ -d $bbdir ]] || die "cannot resolve busybox-static from apt and none is cached in $cache/busybox"
fi
busybox=$bbdir/bin/busybox
abi=$(basename "$kdir"/lib/modules/*)
vmlinuz=$kdir/boot/vmlinuz-$abi
[[ -f $vmlinuz ]] || die "no kernel image in $kdir"
# Debian's package ships no modules.dep (its postinst runs depmod): make it
# once, in busybox's format, which the guest's busybox modprobe reads.
if [[ ! -f $kdir/lib/modules/$abi/modules.dep ]]; then
  "$busybox" depmod -b "$kdir" "$abi" || die "depmod for $abi failed"
fi
# The kernel uncompressed: qemu boots its ELF through the PVH entry point,
# which skips the xz decompression (~10 s of the boot under TCG). Made once
# per cached kernel; without xz-utils the compressed image boots.
kernel=$kdir/boot/vmlinux-$abi
if [[ ! -f $kernel ]] && command -v xz >/dev/null; then
  off=$(LC_ALL=C grep -aboP '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
  # xz stops with an error at the data after the stream: check the result.
  if [[ -n $off ]]; then
    tail -c +$((off + 1)) "$vmlinuz" | xz -dcq >"$kernel.tmp" 2>/dev/null || true
    if [[ $(head -c 4 "$kernel.tmp" | od -An -c | tr -d ' ') == 177ELF ]]; then
      mv "$kernel.tmp" "$kernel"
    fi
  fi
  rm -f "$kernel.tmp"
fi
[[ -f $kernel ]] || kernel=$vmlinuz
flock -u 9
# qboot is a quicker firmware than SeaBIOS for a -kernel boot.
bios=()
[[ -f /usr/share/qemu/qboot.rom ]] && bios=(-bios /usr/share/qemu/qboot.rom)

# The run's files: initramfs, the scratch disk and the status serial port.
# A run killed with SIGKILL leaves its directory: the next run removes it.
for pidfile in "${TMPDIR:-/tmp}"/cgroup2vm.*/pid; do
  [[ -f $pidfile ]] && ! kill -0 "$(<"$pidfile")" 2>/dev/null && rm -rf "$(dirname "$pidfile")"
done
run=$(mktemp -d "${TMPDIR:-/tmp}/cgroup2vm.XXXXXX")
echo $$ >"$run/pid"
qpid=""
cleanup() {
  if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
    kill -KILL "$qpid" 2>/dev/null || true
    wait "$qpid" 2>/dev/null || true
  fi
  rm -rf "$run"
}
trap cleanup EXIT
trap 'echo "$prog: interrupted" >&2; exit 130' INT TERM HUP

# The initramfs: busybox, the modules that mount the share (in load order;
# a module the kernel has built in is skipped), and the two init stages.
moddir=$kdir/lib/modules/$abi
mkdir -p "$run/initrd"/{bin,dev,proc,sys,host,newroot,scratch,modules,lib/modules}
cp "$busybox" "$run/initrd/bin/busybox"
initmods=()
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p; do
  f=$(awk -F: -v m="$m" '{n=$1; sub(".*/", "", n); sub("\\.ko$", "", n); gsub("-", "_", n)} n == m {print $1; exit}' "$moddir/modules.dep")
  if [[ -n $f ]]; then
    cp "$moddir/$f" "$run/initrd/modules/"
    initmods+=("$(basename "$f")")
  elif ! grep -q "/$m\.ko$" "$moddir/modules.builtin"; then
    die "kernel $abi has no module $m"
  fi
done
here=$(cd "$(dirname "$0")" && pwd)
sed -e "s|@MODULES@|${initmods[*]}|" -e "s|@KMODDIR@|$kdir/lib/modules|" \
  "$here/init.sh" >"$run/initrd/init"
cp "$here/stage2.sh" "$run/initrd/stage2"
chmod 755 "$run/initrd/init" "$run/initrd/stage2"
(cd "$run/initrd" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1 >"$run/initrd.img")

# The scratch disk carries the command in: .cgroup2vm/cmd, run by the
# host's bash in the guest.
mkdir -p "$run/seed/.cgroup2vm" "$run/seed/home" "$run/seed/tmp" "$run/seed/.root/upper" "$run/seed/.root/work"
chmod 1777 "$run/seed/tmp"
# The host's Go caches, warm, at their host paths: the guest's writes to
# them land in the root's thrown-away upper layer.
gomodcache=$(GOFLAGS= /usr/local/go/bin/go env GOMODCACHE 2>/dev/null || true)
gocache=$(GOFLAGS= /usr/local/go/bin/go env GOCACHE 2>/dev/null || true)
{
  echo "export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/cgroup2vm/bin"
  echo "export HOME=/scratch/home TMPDIR=/scratch/tmp USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb AIRLOCK_CGROUP2VM=1"
  echo "export GOPATH=/scratch/home/go GOTOOLCHAIN=local GOPROXY=off"
  [[ -n $gomodcache ]] && printf 'export GOMODCACHE=%q\n' "$gomodcache"
  [[ -n $gocache && $gocache != off ]] && printf 'export GOCACHE=%q\n' "$gocache"
  [[ -n ${CI+x} ]] && printf 'export CI=%q\n' "$CI"
  for e in "${envs[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
  printf 'cd -- %q || exit 125\n' "$PWD"
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$run/seed/.cgroup2vm/cmd"
truncate -s 8G "$run/scratch.img"
mkfs.ext4 -q -F -O ^has_journal -E nodiscard,lazy_itable_init=1 -d "$run/seed" "$run/scratch.img" ||
  die "mkfs.ext4 of the scratch disk failed"
: >"$run/status"

# panic=-1 with -no-reboot: a panic reboots, which ends qemu, with no status.
append="console=ttyS0 quiet loglevel=3 panic=-1 oops=panic mitigations=off"
append+=" systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
# AIRLOCK_CGROUP2VM_DEBUG=1: the kernel's messages and init's steps, timed.
[[ -n ${AIRLOCK_CGROUP2VM_DEBUG:-} ]] && append=${append/quiet loglevel=3/loglevel=7}" cgroup2vm.debug"
# timeout(1) ends qemu at the deadline (TERM, then KILL 5 s on); each
# dies with its parent (PR_SET_PDEATHSIG), so killing this script ends both.
start=$EPOCHREALTIME
setpriv --pdeathsig KILL -- timeout -k 5 "$timeout" setpriv --pdeathsig KILL -- \
  "$qemu" "${bios[@]}" -nodefaults -no-reboot -no-user-config \
  -machine pc -accel tcg,thread=multi -cpu max -smp "$cpus" -m "$mem" \
  -display none -monitor none \
  -kernel "$kernel" -initrd "$run/initrd.img" -append "$append" \
  -chardev stdio,id=console,signal=off -serial chardev:console \
  -serial "file:$run/status" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
  -drive "file=$run/scratch.img,format=raw,if=virtio,cache=unsafe" \
  </dev/null &
qpid=$!
qrc=0
wait "$qpid" || qrc=$?
qpid=""
end=$EPOCHREALTIME

if ((qrc == 124 || qrc == 137)); then
  echo "$prog: timed out after ${timeout}s: the VM was killed" >&2
  exit 124
fi
status=$(tr -d '\r' <"$run/status" | sed -n 's/^cgroup2vm-exit=\([0-9]\{1,3\}\)$/\1/p' | tail -n 1)
if [[ -z $status ]]; then
  failed=$(tr -d '\r' <"$run/status" | sed -n 's/^cgroup2vm-failed=//p' | tail -n 1)
  if [[ -n $failed ]]; then
    echo "$prog: the VM failed to boot: $failed" >&2
  else
    echo "$prog: the VM stopped (qemu status $qrc) without the command's exit status: it failed to boot or panicked (see the console output above)" >&2
  fi
  exit 125
fi
if [[ -n ${AIRLOCK_CGROUP2VM_TIMES:-} ]]; then
  boot=$(tr -d '\r' <"$run/status" | sed -n 's/^cgroup2vm-boot=//p')
  cmdend=$(tr -d '\r' <"$run/status" | sed -n 's/^cgroup2vm-command=//p')
  awk -v s="$start" -v e="$end" -v b="$boot" -v c="$cmdend" -v rc="$status" 'BEGIN {
    printf "cgroup2vm: %.1fs in all: boot %.1fs (guest uptime at the command), command %.1fs, exit %d\n", e - s, b, c - b, rc }' >&2
fi
exit "$status"
