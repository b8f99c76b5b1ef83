# SPDX-License-Identifier: MIT OR Apache-2.0
# Helpers for the nested-Xen scenario scripts (sourced). They run in dom0, started by
# dom0's /init (tools/rig/initramfs/dom0-init) with:
#   $RIG      the unpacked input disk: tests/xen/, tools/xl/, images/ (vmlinuz,
#             guest.cpio.zst, blkdom when built, gpt.img for a scenario with rig-gpt)
#   $RESULTS  a directory copied back to the host (results/xen/<scenario>/ there)
# Every check prints "rig-check: PASS|FAIL <what>"; the host counts those lines. Every
# step is bounded by a timeout, so a hung guest fails the check instead of hanging.
# The shell is dom0's busybox sh: POSIX sh with `local`.
#
# The helpers live in tests/xen/lib/, one file per concern, all sourced here in this
# order (a scenario sources this file, then redefines the hooks it wants):
#   core.sh     dom0's command line, time, pass/fail/finish, wait_for, domid_of,
#               cpu_seconds, dump_state
#   blkdom.sh   what blkdom reports: its poller line (pollers_value,
#               blkdom_holds_nothing), blkdom_up, its log (blkdom_log, blkdom_logged)
#   domains.sh  create_domain, destroy_domain, boot_blkdom (PVH), boot_blkdom_hvm,
#               boot_blkdom_passthrough, boot_linux_dd, BLKDOM_CMDLINE from dom0's
#   disks.sh    dom0's RAM disk, the emulated NVMe's file and its GPT (gpt_onto), the
#               slices' pattern, the outer disks for passthrough, disks attached to a
#               running guest (attach_ok, go, backend_node)
#   fio.sh      the PV fio guests (run_fio_guest) and the hooks it calls
#   stats.sh    reading results: fio's JSON, backend CPU, medians, blkdom's counters
#   compare.sh  whole comparisons (emulated and passed-through NVMe) and run_variants
#   nvmet.sh    the storage network: dom0's bridge, Linux's NVMe/TCP target and dom0's
#               own NVMe/TCP host (dom0_nvme_connect)
# shellcheck shell=dash disable=SC1090 # (the parts: tests/xen/lib/*.sh)
for rig_lib_part in core blkdom domains disks fio stats compare nvmet; do
  . "$RIG/tests/xen/lib/$rig_lib_part.sh"
done
unset rig_lib_part
