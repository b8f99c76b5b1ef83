# SPDX-License-Identifier: MIT OR Apache-2.0
# The storage network in dom0 (sourced by tests/xen/lib.sh): the bridge blkdom's vif
# joins, Linux's own NVMe/TCP target (nvmet-tcp, configured through configfs) on brd RAM
# disks, and dom0's own NVMe/TCP host (nvme-tcp) connecting to it. Scenarios:
# tests/xen/blkdom-nvmetcp, tests/xen/blkdom-nvmetcp-disk, tests/xen/blkdom-nvmetcp-ops.
# Also a DHCP server for blkdom's net.ip=dhcp (busybox udhcpd, start_dhcp_server).
# shellcheck shell=dash
# (dash: the dialect closest to dom0's busybox sh)

NVMET=/sys/kernel/config/nvmet

# setup_dom0_network [MTU]: the bridge xenbr0 at 10.9.0.1/24 (no outer network card: no
# packet leaves the rig) with MTU (default 1500; Xen's hotplug script gives each vif the
# bridge's MTU and tells blkdom through the vif's mtu key), and loopback up: dom0's own
# NVMe/TCP host reaches its target at 10.9.0.1 through lo (a connect to a local address
# while lo is down times out).
setup_dom0_network() {
  ip link set lo up || return 1
  ip link add name xenbr0 type bridge 2> /dev/null || brctl addbr xenbr0 || return 1
  ip link set xenbr0 mtu "${1:-1500}" 2> /dev/null || echo "${1:-1500}" > /sys/class/net/xenbr0/mtu ||
    return 1
  ip addr add 10.9.0.1/24 dev xenbr0 && ip link set xenbr0 up
}

# setup_target NQN RD_SIZE_KIB [RAM_DISKS]: port 1 (10.9.0.1:4420) and /dev/ram0 of that
# size as namespace 1 of subsystem NQN (any host allowed); RAM_DISKS (default 1) RAM
# disks of that size, /dev/ram1 on for add_subsystem.
setup_target() {
  insmod /lib/modules/brd.ko rd_nr="${3:-1}" rd_size="$2" max_part=0 || return 1
  grep -q configfs /proc/mounts || mount -t configfs none /sys/kernel/config || return 1
  mkdir "$NVMET/ports/1" &&
    echo 10.9.0.1 > "$NVMET/ports/1/addr_traddr" &&
    echo tcp > "$NVMET/ports/1/addr_trtype" &&
    echo 4420 > "$NVMET/ports/1/addr_trsvcid" &&
    echo ipv4 > "$NVMET/ports/1/addr_adrfam" &&
    add_subsystem "$1" /dev/ram0
}

# add_subsystem NQN DEVICE: subsystem NQN (any host allowed) with DEVICE as namespace 1,
# on port 1. DEVICE may be a regular file, which nvmet serves buffered (dom0's files are
# in RAM, which has no O_DIRECT); such a namespace can grow (grow_namespace).
add_subsystem() {
  mkdir "$NVMET/subsystems/$1" &&
    echo 1 > "$NVMET/subsystems/$1/attr_allow_any_host" &&
    mkdir "$NVMET/subsystems/$1/namespaces/1" &&
    echo "$2" > "$NVMET/subsystems/$1/namespaces/1/device_path" &&
    { [ ! -f "$2" ] || echo 1 > "$NVMET/subsystems/$1/namespaces/1/buffered_io"; } &&
    echo 1 > "$NVMET/subsystems/$1/namespaces/1/enable" &&
    target_start "$1"
}

# allow_only NQN HOSTNQN...: subsystem NQN admits these hosts and no other (its
# allowed_hosts, README's access control). nvmet takes no host while any host is
# allowed: that goes first.
allow_only() {
  local nqn=$1 host
  shift
  echo 0 > "$NVMET/subsystems/$nqn/attr_allow_any_host" || return 1
  for host in "$@"; do
    { [ -d "$NVMET/hosts/$host" ] || mkdir "$NVMET/hosts/$host"; } &&
      ln -s "$NVMET/hosts/$host" "$NVMET/subsystems/$nqn/allowed_hosts/$host" || return 1
  done
}

# grow_namespace NQN FILE MIB: the file behind NQN's namespace 1 grows to MIB and nvmet
# takes the new size in (an operator growing a volume).
grow_namespace() {
  truncate -s "$3M" "$2" && echo 1 > "$NVMET/subsystems/$1/namespaces/1/revalidate_size"
}

# target_stop NQN / target_start NQN: the subsystem leaves port 1 (nvmet closes its
# controllers' connections and, with no subsystem left, stops listening) or joins it again.
target_stop() { rm "$NVMET/ports/1/subsystems/$1"; }
target_start() { ln -s "$NVMET/subsystems/$1" "$NVMET/ports/1/subsystems/$1"; }

# add_port N SVCID: nvmet port N on 10.9.0.1:SVCID (TCP), with no subsystem yet.
# port_add N NQN / port_remove N NQN: subsystem NQN joins port N or leaves it (nvmet
# closes the subsystem's connections through that port).
add_port() {
  mkdir "$NVMET/ports/$1" &&
    echo 10.9.0.1 > "$NVMET/ports/$1/addr_traddr" &&
    echo tcp > "$NVMET/ports/$1/addr_trtype" &&
    echo "$2" > "$NVMET/ports/$1/addr_trsvcid" &&
    echo ipv4 > "$NVMET/ports/$1/addr_adrfam"
}
port_add() { ln -s "$NVMET/subsystems/$2" "$NVMET/ports/$1/subsystems/$2"; }
port_remove() { rm "$NVMET/ports/$1/subsystems/$2"; }

# blkdom_connections: blkdom's TCP connections to the target as dom0 sees them: from
# its address (10.9.0.2, 0200090A in /proc/net/tcp) to port 4420 (1144), established.
blkdom_connections() {
  awk '$2 ~ /:1144$/ && $3 ~ /^0200090A:/ && $4 == "01"' /proc/net/tcp | wc -l
}

# net_counters: dom0's TCP counters (segments retransmitted, and why) and the vif's.
net_counters() {
  grep -E '^Tcp:' /proc/net/snmp
  grep -E '^TcpExt:' /proc/net/netstat
  for f in /sys/class/net/vif*/statistics/*; do
    [ -r "$f" ] && echo "$f $(cat "$f")"
  done
}

# start_dhcp_server [MAC IP]: busybox's udhcpd in dom0 on xenbr0 (a DHCP server for
# blkdom's net.ip=dhcp): a pool of 10.9.0.3-10.9.0.254 (10.9.0.1 is dom0, 10.9.0.2 the
# static address other scenarios give blkdom), subnet /24, router 10.9.0.1, 10-minute
# leases, and, given MAC and IP, the fixed lease MAC -> IP. Its config, leases and pid
# file are under /tmp/udhcpd; it runs in the background until stop_dhcp_server.
DHCPD_DIR=/tmp/udhcpd
start_dhcp_server() {
  local udhcpd=udhcpd
  command -v udhcpd > /dev/null 2>&1 || udhcpd="busybox udhcpd"
  mkdir -p "$DHCPD_DIR" || return 1
  : > "$DHCPD_DIR/leases"
  {
    echo "start 10.9.0.3"
    echo "end 10.9.0.254"
    echo "interface xenbr0"
    echo "max_leases 252"
    echo "lease_file $DHCPD_DIR/leases"
    echo "pidfile $DHCPD_DIR/pid"
    echo "opt subnet 255.255.255.0"
    echo "opt router 10.9.0.1"
    echo "opt lease 600"
    [ -n "${1:-}" ] && echo "static_lease $1 $2"
  } > "$DHCPD_DIR/udhcpd.conf" || return 1
  # -f: in the foreground of a background job, so its pid is ours to stop (its log, on
  # stderr, goes to the results).
  $udhcpd -f "$DHCPD_DIR/udhcpd.conf" > "$RESULTS/udhcpd.log" 2>&1 &
  echo $! > "$DHCPD_DIR/job"
  sleep 1
  kill -0 "$(cat "$DHCPD_DIR/job")" 2> /dev/null
}

# stop_dhcp_server: the udhcpd start_dhcp_server started, stopped.
stop_dhcp_server() {
  [ -r "$DHCPD_DIR/job" ] || return 0
  kill "$(cat "$DHCPD_DIR/job")" 2> /dev/null
  rm -f "$DHCPD_DIR/job"
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

# --- dom0 as an NVMe/TCP host -----------------------------------------------------------
# dom0's own host NQN (blkdom has its own: a target tells them apart).
DOM0_HOSTNQN=nqn.2026-12.dev.blkdom:rig-dom0
# Where Linux's fabrics host is (tests/bench/test_rig_lib.py points them at fakes).
NVME_FABRICS=/dev/nvme-fabrics
NVME_CLASS=/sys/class/nvme

# dom0_nvme_options NQN [HOSTNQN]: what `nvme connect -t tcp -a 10.9.0.1 -s 4420 -n NQN
# --hostnqn=HOSTNQN --ctrl-loss-tmo=30` writes to /dev/nvme-fabrics (the option names of
# Linux's drivers/nvme/host/fabrics.c). HOSTNQN defaults to $DOM0_HOSTNQN; 30 s: a read
# of a target gone fails then, not after Linux's 600.
dom0_nvme_options() {
  echo "transport=tcp,traddr=10.9.0.1,trsvcid=4420,nqn=$1,hostnqn=${2:-$DOM0_HOSTNQN},ctrl_loss_tmo=30"
}

# nvme_namespace_dev CTRL: the block device of namespace 1 of controller CTRL (nvmeN):
# /dev/nvmeNn1, or with native multipath (Debian's kernel) the subsystem's /dev/nvmeSn1,
# whose path through CTRL (nvmeScNn1) is what CTRL lists.
nvme_namespace_dev() {
  local path name
  for path in "$NVME_CLASS/$1"/nvme*n1; do
    [ -e "$path" ] || continue
    name=${path##*/}
    echo "/dev/$(echo "$name" | sed 's/c[0-9]*n/n/')"
    return 0
  done
  return 1
}

# dom0_nvme_connect NQN [HOSTNQN]: dom0's own NVMe/TCP host (nvme-tcp) connects to
# subsystem NQN on 10.9.0.1:4420, as `nvme connect` does without nvme-cli: the options
# in one write to /dev/nvme-fabrics (the kernel takes each write as a whole request and
# connects before it returns), the new controller read back from the same open file
# ("instance=N,cntlid=M"). Prints namespace 1's block device once it is there (the
# namespace scan runs after the connect), within 30 s.
dom0_nvme_connect() {
  local options reply instance dev
  options=$(dom0_nvme_options "$1" "${2:-}")
  # (A failed redirection of exec ends the shell: look first.)
  [ -c "$NVME_FABRICS" ] || return 1
  exec 7<> "$NVME_FABRICS"
  if ! { printf '%s' "$options" >&7 && read -r reply <&7; }; then
    exec 7>&-
    return 1
  fi
  exec 7>&-
  instance=${reply#instance=}
  instance=${instance%%,*}
  case $instance in ''|*[!0-9]*) return 1 ;; esac
  for _ in $(seq 150); do
    dev=$(nvme_namespace_dev "nvme$instance") && [ -b "$dev" ] && { echo "$dev"; return 0; }
    sleep 0.2
  done
  return 1
}

# dom0_nvme_disconnect NQN: every controller dom0's host has to subsystem NQN is deleted
# (`nvme disconnect -n NQN`; the kernel returns once it is gone). True if there was one.
dom0_nvme_disconnect() {
  local ctrl found=1
  for ctrl in "$NVME_CLASS"/nvme*; do
    [ "$(cat "$ctrl/subsysnqn" 2> /dev/null)" = "$1" ] || continue
    echo 1 > "$ctrl/delete_controller" && found=0
  done
  return $found
}
