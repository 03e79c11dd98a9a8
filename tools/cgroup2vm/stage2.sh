# cgroup2vm stage 2: PID 1 in the guest's root, run by busybox sh (see
# run.sh). Runs the command that run.sh put on the scratch disk, reports its
# exit status on the second serial port, and stops the VM.
bb=/run/cgroup2vm/busybox
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/run/cgroup2vm/bin

$bb hostname cgroup2vm
$bb ip link set lo up

# Every controller for the children of the root, and the command in one of
# them, as a systemd service would be.
for c in $($bb cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control
done
$bb mkdir /sys/fs/cgroup/payload

# No CR before LF on the console: the host gets the command's bytes.
$bb stty -F /dev/ttyS0 -onlcr
boot=$($bb cut -d' ' -f1 /proc/uptime)
$bb sh -c 'echo $$ >/sys/fs/cgroup/payload/cgroup.procs && exec "$@"' - \
  $bb env -i /bin/bash --noprofile --norc /scratch/.cgroup2vm/cmd </dev/null >/dev/ttyS0 2>&1
rc=$?
end=$($bb cut -d' ' -f1 /proc/uptime)
# stty waits for the console to drain (TCSADRAIN): no output is lost to the
# power-off.
$bb stty -F /dev/ttyS0 -onlcr
printf 'cgroup2vm-boot=%s\ncgroup2vm-command=%s\ncgroup2vm-exit=%s\n' "$boot" "$end" "$rc" >/dev/ttyS1
$bb stty -F /dev/ttyS1 -onlcr
$bb sync
# Not even the kernel's "reboot: Restarting system" on the console.
echo 0 >/proc/sys/kernel/printk
$bb reboot -f
