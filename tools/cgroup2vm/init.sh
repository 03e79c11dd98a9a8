#!/bin/busybox sh
# cgroup2vm stage 1: the initramfs's /init (see run.sh). run.sh fills in
# the @...@ names. Builds the guest's root and mounts, loads the modules,
# then switch_root into the root with stage 2 as PID 1.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
  echo "cgroup2vm init: $*" >/dev/console
  echo "cgroup2vm-failed=$*" >/dev/ttyS1
  reboot -f
  sleep 1000
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
step() { :; }
if grep -q cgroup2vm.debug /proc/cmdline; then
  step() { echo "cgroup2vm init: $(cut -d' ' -f1 /proc/uptime 2>/dev/null || cut -d' ' -f1 /newroot/proc/uptime) $*" >/dev/console; }
fi
step modules
for m in @MODULES@; do
  insmod "/modules/$m" || fail "insmod $m"
done
step 9p
# cache=loose: the host's files do not change under a run, and 9p without
# a cache makes every exec and stat a round trip.
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /host ||
  fail "mount the host's root (9p hostroot)"
# The cached kernel's modules, seen through the share, for busybox modprobe.
mount --bind "/host@KMODDIR@" /lib/modules || fail "no modules at @KMODDIR@ in the share"
echo /bin/modprobe >/proc/sys/kernel/modprobe
modprobe -a virtio_blk crc32c_generic ext4 overlay || fail "modprobe virtio_blk ext4 overlay"
step scratch
i=0
while [ ! -b /dev/vda ]; do
  i=$((i + 1))
  [ "$i" -le 100 ] || fail "no scratch disk /dev/vda"
  usleep 50000
done
mount -t ext4 -o noinit_itable /dev/vda /scratch || fail "mount the scratch disk"

step root
# The root: the host's, under a writable (thrown away) layer on the scratch
# disk, for mount points the host has not got.
mount -t overlay -o lowerdir=/host,upperdir=/scratch/.root/upper,workdir=/scratch/.root/work overlay /newroot ||
  fail "mount the overlay root"
r=/newroot
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs $r/run
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $r/tmp
mkdir -p $r/scratch $r/lib/modules
mount --move /scratch $r/scratch
mount --bind "$r@KMODDIR@" $r/lib/modules
mount --move /dev $r/dev
mkdir -p $r/dev/pts $r/dev/shm
# devtmpfs has no /dev/fd (udev makes it on a booted system); bash's <(...)
# needs it, and the suite's leftover-cgroup check uses it.
for n in fd:self/fd stdin:self/fd/0 stdout:self/fd/1 stderr:self/fd/2; do
  [ -e $r/dev/${n%%:*} ] || ln -s /proc/${n#*:} $r/dev/${n%%:*}
done
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts $r/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $r/dev/shm
echo /run/cgroup2vm/bin/modprobe >/proc/sys/kernel/modprobe
mount --move /proc $r/proc
mount --move /sys $r/sys
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 $r/sys/fs/cgroup || fail "mount cgroup2"

# busybox stays reachable in the guest for modprobe (the host need not have
# kmod), reboot and stage 2.
mkdir -p $r/run/cgroup2vm/bin
cp /bin/busybox /stage2 $r/run/cgroup2vm/
for a in modprobe insmod rmmod lsmod depmod modinfo; do
  ln -s ../busybox $r/run/cgroup2vm/bin/$a
done
step sandbox modules
# What the sandbox uses; the kernel loads the rest on demand.
mods="loop veth tun nf_tables nft_ct nft_chain_nat nf_nat nft_nat nft_masq nft_reject_inet nft_fib_inet nft_connlimit"
modprobe -a $mods || fail "modprobe $mods"

step switch_root
exec switch_root $r /run/cgroup2vm/busybox sh /run/cgroup2vm/stage2
