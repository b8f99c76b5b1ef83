# SPDX-License-Identifier: MIT OR Apache-2.0
# Runs built of the rest (sourced by tests/xen/lib.sh): the same guest and jobs on an
# emulated and on a passed-through NVMe, served by Linux and then by blkdom, and
# blkdom's command-line variants in alternating rounds.
# shellcheck shell=dash disable=SC2034
# (dash: the dialect closest to dom0's busybox sh; SC2034: variables set here are read by
# the scenarios and the other parts)

# The jobs of the emulated-NVMe comparison (no 2-job read: the HVM domains are slow).
NVME_JOBS_DEFAULT=prefill,randread-qd32-1j,randread-qd1,seqread-1m,write-verify
# compare_on_emulated_nvme JOBS RUNTIME: the same PV guest and fio jobs on an emulated NVMe
# disk (qemu-xen in dom0, a fresh file each time), served first by Linux blkback in an
# HVM driver domain (tools/xl/linux-hvm-dd.cfg), then by blkdom booted as HVM on the same
# kind of controller (tools/xl/blkdom-hvm.cfg), each on pCPUs 1-2, the guest on pCPU 3.
# Guests fio-ddnvme and fio-blkdomnvme (tools/rig/summarize.py's NVMe rows).
compare_on_emulated_nvme() {
  local jobs=$1 runtime=$2
  if emulated_nvme_disk && boot_linux_dd linux-hvm-dd.cfg; then
    run_fio_guest fio-ddnvme fio-guest-linuxdd.cfg linux-dd "$jobs" "$runtime" \
      'name="fio-ddnvme"' 'disk=["backend=linux-dd,vdev=xvda,access=rw,target=/dev/nvme0n1"]'
    cp /var/log/xen/qemu-dm-linux-dd.log "$RESULTS/" 2>/dev/null
    timeout 60 xl destroy linux-dd
  fi
  boot_blkdom_hvm &&
    run_fio_guest fio-blkdomnvme fio-guest-blkdom.cfg blkdom "$jobs" "$runtime" \
      'name="fio-blkdomnvme"' 'disk=["backend=blkdom,vdev=xvda,access=rw,target=nvme:1"]'
  cp /var/log/xen/qemu-dm-blkdom.log "$RESULTS/" 2>/dev/null
  timeout 60 xl destroy blkdom
}

# compare_on_passthrough_nvme JOBS RUNTIME: the same PV guest and fio jobs on namespace 1
# of the NVMe controller passed through from the outer machine (scenarios with
# "rig-devices: passthrough"), served first by Linux blkback in an HVM driver domain
# (tools/xl/linux-hvm-dd.cfg with the controller instead of the emulated one, and without
# swiotlb=force: the device reaches grant-mapped pages through the IOMMU), then by blkdom
# (tools/xl/blkdom-hvm-passthrough.cfg), each on pCPUs 1-2, the guest on pCPU 3.
# Guests fio-ddpt and fio-blkdompt (tools/rig/summarize.py's passthrough rows).
# The Linux side needs the rig's iommu=no-intremap (tools/rig/common.sh): with the
# emulated VT-d's interrupt remapping its NVMe interrupts never arrived and it hung in
# the driver's probe (tests/xen/pt-linux-probe).
compare_on_passthrough_nvme() {
  local jobs=$1 runtime=$2
  assign_passthrough_disks || return 1
  if boot_linux_dd linux-hvm-dd.cfg 'device_model_args_hvm=[]' "pci=[\"$PT_NVME\"]" \
       'extra="console=hvc0 earlyprintk=xen loglevel=4 rig.role=driver-domain rig.dd_disk=nvme0n1"'; then
    run_fio_guest fio-ddpt fio-guest-linuxdd.cfg linux-dd "$jobs" "$runtime" \
      'name="fio-ddpt"' 'disk=["backend=linux-dd,vdev=xvda,access=rw,target=/dev/nvme0n1"]'
    cp /var/log/xen/qemu-dm-linux-dd.log "$RESULTS/qemu-dm-linux-dd-pt.log" 2>/dev/null
  fi
  domid_of linux-dd > /dev/null && timeout 60 xl destroy linux-dd
  boot_blkdom_passthrough &&
    run_fio_guest fio-blkdompt fio-guest-blkdom.cfg blkdom "$jobs" "$runtime" \
      'name="fio-blkdompt"' 'disk=["backend=blkdom,vdev=xvda,access=rw,target=nvme:1"]'
  cp /var/log/xen/qemu-dm-blkdom.log "$RESULTS/qemu-dm-blkdom-pt.log" 2>/dev/null
  timeout 60 xl destroy blkdom
}

# variant_hook VARIANT GUEST: runs after each variant's guest (run_variants); a scenario
# may redefine it (tests/xen/notify-sweep prints blkdom's counters).
variant_hook() { :; }

# run_variants TAG ROUNDS JOBS SETTLE VARIANT...: ROUNDS rounds of every variant in turn
# (A B C A B C ...: the rig's drift falls on all alike). A variant is blkdom's command
# line with ':' between words ("default": none). Per round and variant: blkdom booted with
# it, a fio guest fio-TAG-<variant>-r<round> runs JOBS, one "rig: TAG VARIANT round N JOB:
# iops=.. p50_us=.. cpu_pct=.. iops_per_cpu_pct=.." line per job (job_stats; SETTLE: the
# guest's idle seconds after each job, GUEST_ARGS' rig.settle), blkdom destroyed. Then
# per variant and job the medians over the rounds ("rig: TAG median: ...").
run_variants() {
  local tag=$1 rounds=$2 jobs=$3 settle=$4 round=1 variant slug guest start job stats
  shift 4
  : > "$RESULTS/variants-$tag.txt"
  while [ "$round" -le "$rounds" ]; do
    for variant in "$@"; do
      slug=$(echo "$variant" | tr -c 'a-zA-Z0-9\n' '-')
      guest=fio-$tag-$slug-r$round
      start=$(now)
      case $variant in
        default) BLKDOM_CMDLINE= ;;
        *) BLKDOM_CMDLINE=$(echo "$variant" | tr ':' ' ') ;;
      esac
      echo "rig: $tag round $round of $rounds: $variant"
      if boot_blkdom; then
        run_fio_guest "$guest" fio-guest-blkdom.cfg blkdom "$jobs" "${RIG_RUNTIME:-15}" \
          "name=\"$guest\""
        for job in $(echo "$jobs" | tr ',' ' '); do
          stats=$(job_stats "$guest" "$job" "$settle")
          echo "rig: $tag $variant round $round $job: $stats"
          echo "$variant $job $stats" >> "$RESULTS/variants-$tag.txt"
        done
        variant_hook "$variant" "$guest"
      fi
      echo "rig: $tag $variant round $round pollers: $(blkdom_pollers "$(domid_of blkdom)")"
      timeout 60 xl destroy blkdom
      timing "$tag-$slug-r$round" "$(seconds_since "$start")"
    done
    round=$((round + 1))
  done
  BLKDOM_CMDLINE=
  variants_summary "$RESULTS/variants-$tag.txt" | sed "s/^/rig: $tag median: /"
}
