#!/bin/bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Linux baseline for the tier-2 disk test's throughput numbers: boots the host's Debian
# kernel under the same QEMU set-up as tests/qemu/tier2.py (q35, TCG, -smp N, 64 MiB raw
# file) with the same NVMe or virtio-blk device, and runs fio with the disk test's access
# patterns: 4 KiB random reads at queue depth 16 and 256 KiB sequential reads at depth 8,
# one job per CPU. Prints fio's IOPS and bandwidth lines.
#
#   tools/disk-baseline.sh nvme|virtio [cpus] [seconds]
set -euo pipefail
kind=${1:?usage: $0 nvme|virtio [cpus] [seconds]}
cpus=${2:-2}
seconds=${3:-10}
release=$(ls /lib/modules | head -n1)
kernel=${KERNEL:-/boot/vmlinuz-$release}
work=target/qemu/disk-baseline
root=$work/root
rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,tmp,modules}

# busybox (static) and fio with the libraries it links.
cp /usr/bin/busybox "$root/bin/"
for applet in sh mount insmod sleep poweroff cat ls echo grep seq; do ln -sf busybox "$root/bin/$applet"; done
cp /usr/bin/fio "$root/bin/"
ldd /usr/bin/fio | grep -o '/[^ ]*' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
done

# The block driver's modules in dependency order.
declare -A loaded=()
order=()
add_module() {
  local name=$1 path dep
  [[ -n ${loaded[$name]:-} ]] && return
  loaded[$name]=1
  path=$(modinfo -k "$release" -n "$name")
  for dep in $(modinfo -k "$release" -F depends "$name" | tr ',' ' '); do add_module "$dep"; done
  cp "$path" "$root/modules/" && order+=("$(basename "$path")")
}
case $kind in
  nvme) add_module nvme; disk=/dev/nvme0n1
        device=(-device nvme,drive=disk0,serial=baseline) ;;
  virtio) add_module virtio_pci; add_module virtio_blk; disk=/dev/vda
          device=(-device "virtio-blk-pci,drive=disk0,num-queues=$cpus") ;;
  *) echo "unknown device kind $kind" >&2; exit 2 ;;
esac

cat > "$root/init" <<INIT
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in ${order[*]}; do insmod /modules/\$m; done
for i in \$(seq 100); do [ -b $disk ] && break; sleep 0.1; done
common="--filename=$disk --ioengine=libaio --direct=1 --time_based --runtime=$seconds --numjobs=$cpus --group_reporting"
echo "baseline: randread"; fio --name=randread --rw=randread --bs=4k --iodepth=16 \$common | grep -E 'IOPS='
echo "baseline: seqread"; fio --name=seqread --rw=read --bs=256k --iodepth=8 \$common | grep -E 'IOPS='
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.gz"

truncate -s 0 "$work/disk.img" && truncate -s 64M "$work/disk.img"
timeout 300 "${QEMU:-qemu-system-x86_64}" -machine q35 -accel tcg -cpu max -smp "$cpus" -m 512 \
  -display none -monitor none -no-reboot -serial stdio \
  -kernel "$kernel" -initrd "$work/initramfs.gz" -append "console=ttyS0 quiet" \
  -drive "file=$work/disk.img,format=raw,if=none,id=disk0,cache=writeback" "${device[@]}" \
  | grep -E '^baseline:|IOPS='
