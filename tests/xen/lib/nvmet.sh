# SPDX-License-Identifier: MIT OR Apache-2.0
# The storage network in dom0 (sourced by tests/xen/lib.sh): the bridge blkdom's vif
# joins, and Linux's own NVMe/TCP target (nvmet-tcp, configured through configfs) on a
# brd RAM disk. Scenarios: tests/xen/blkdom-nvmetcp, tests/xen/blkdom-nvmetcp-disk.
# shellcheck shell=dash
# (dash: the dialect closest to dom0's busybox sh)

NVMET=/sys/kernel/config/nvmet

# setup_dom0_network: the bridge xenbr0 at 10.9.0.1/24 (no outer network card: no packet
# leaves the rig).
setup_dom0_network() {
  ip link add name xenbr0 type bridge 2> /dev/null || brctl addbr xenbr0 || return 1
  ip addr add 10.9.0.1/24 dev xenbr0 && ip link set xenbr0 up
}

# setup_target NQN RD_SIZE_KIB: /dev/ram0 of that size as namespace 1 of subsystem NQN
# (any host allowed), on port 1 (10.9.0.1:4420).
setup_target() {
  local nqn=$1
  insmod /lib/modules/brd.ko rd_nr=1 rd_size="$2" max_part=0 || return 1
  grep -q configfs /proc/mounts || mount -t configfs none /sys/kernel/config || return 1
  mkdir "$NVMET/subsystems/$nqn" &&
    echo 1 > "$NVMET/subsystems/$nqn/attr_allow_any_host" &&
    mkdir "$NVMET/subsystems/$nqn/namespaces/1" &&
    echo /dev/ram0 > "$NVMET/subsystems/$nqn/namespaces/1/device_path" &&
    echo 1 > "$NVMET/subsystems/$nqn/namespaces/1/enable" &&
    mkdir "$NVMET/ports/1" &&
    echo 10.9.0.1 > "$NVMET/ports/1/addr_traddr" &&
    echo tcp > "$NVMET/ports/1/addr_trtype" &&
    echo 4420 > "$NVMET/ports/1/addr_trsvcid" &&
    echo ipv4 > "$NVMET/ports/1/addr_adrfam" &&
    target_start "$nqn"
}

# target_stop NQN / target_start NQN: the subsystem leaves port 1 (nvmet closes its
# controllers' connections and, with no subsystem left, stops listening) or joins it again.
target_stop() { rm "$NVMET/ports/1/subsystems/$1"; }
target_start() { ln -s "$NVMET/subsystems/$1" "$NVMET/ports/1/subsystems/$1"; }

# net_counters: dom0's TCP counters (segments retransmitted, and why) and the vif's.
net_counters() {
  grep -E '^Tcp:' /proc/net/snmp
  grep -E '^TcpExt:' /proc/net/netstat
  for f in /sys/class/net/vif*/statistics/*; do
    [ -r "$f" ] && echo "$f $(cat "$f")"
  done
}

# save_network_state: what the network looked like, for a failure's diagnosis.
save_network_state() {
  {
    xenstore-ls -f /local/domain/0/backend/vif
    echo "xenbr0 ports: $(ls /sys/class/net/xenbr0/brif 2>&1)"
    ip -s link
    ip addr
    net_counters
  } > "$RESULTS/dom0-network.txt" 2>&1
  dmesg | tail -n 60 > "$RESULTS/dom0-dmesg-tail.txt"
}
