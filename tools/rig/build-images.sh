#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
# Assembles what the nested Xen rig boots, from Debian bookworm packages:
#   xen            Xen 4.17 (multiboot ELF; QEMU's -kernel loads it)
#   vmlinuz        Linux 6.1 (dom0 kernel and the PV guests' kernel)
#   dom0.cpio.zst  dom0's initramfs: busybox, bash, the Xen tools and their libraries,
#                  hotplug scripts, a few modules, and initramfs/dom0-init as /init
#   guest.cpio.zst a PV guest's initramfs: busybox, a static fio, the hostile frontend
#                  (tools/hostile), xen-blkfront (and gntalloc/evtchn for the hostile
#                  guest), and initramfs/guest-init as /init
# Output: $BLKDOM_CACHE/rig/images-<hash>/ (hash of package versions and these scripts);
# prints that directory. Packages are downloaded and unpacked, never installed.
set -euo pipefail
source "$(dirname "$0")/common.sh"

# nvme: the Linux HVM driver domain (tools/xl/linux-hvm-dd.cfg) serves an emulated NVMe.
# xen-pciback: xl pci-assignable-add (tests/xen/blkdom-passthrough) hands disks to it.
# xen-netback, bridge: blkdom's vif on dom0's bridge; nvmet, nvmet-tcp: Linux's NVMe/TCP
# target that blkdom's initiator talks to (tests/xen/blkdom-nvmetcp); nvme-tcp (after its
# dependencies nvme-core and nvme-fabrics, which add_module puts first): dom0's own
# NVMe/TCP host, connected by writing to /dev/nvme-fabrics (tests/xen/lib/nvmet.sh,
# dom0_nvme_connect; tests/xen/blkdom-nvmetcp-ops). crc32c_generic: NVMe/TCP digests
# (blkdom's net.digest=) ask the crypto API for crc32c, which nothing in dom0 could load on
# demand; without it Debian's 6.1 nvmet-tcp fails the ICReq and then oopses freeing the
# hash it never made (nvmet_tcp_free_crypto on a NULL request).
DOM0_MODULES=(xen-evtchn xen-gntdev xen-gntalloc xen-privcmd xenfs xen-blkback brd null_blk
  virtio_pci virtio_blk nvme xen-pciback xen-netback bridge crc32c_generic nvmet nvmet-tcp
  nvme-tcp)
# crc32c_generic before ext4: ext4's checksums ask the crypto API for crc32c, which would
# need modprobe (the guest has none) to load it on demand.
# xen-evtchn, xen-gntalloc: the hostile guest (tests/xen/hostile) is a blkfront in user
# space, through /dev/xen/evtchn and /dev/xen/gntalloc (/dev/xen/xenbus is built in).
GUEST_MODULES=(xen-blkfront crc32c_generic ext4 xen-evtchn xen-gntalloc)
XEN_BIN=/usr/lib/xen-4.17/bin
DOM0_XEN_TOOLS=(xl xenstored xenconsoled xen-init-dom0 libxl-save-helper xenstore-control)

candidate_version() {
  apt-cache policy "$1" | awk '/Candidate:/ { print $2 }'
}
kernel_pkg=$(apt-cache depends "$RIG_KERNEL_META" | awk '/Depends: linux-image-/ { print $2; exit }')
[ -n "$kernel_pkg" ] || rig_die "cannot resolve $RIG_KERNEL_META (run apt-get update)"
pinned=()
for pkg in "${RIG_PACKAGES[@]}" "$kernel_pkg"; do
  ver=$(candidate_version "$pkg")
  [ -n "$ver" ] && [ "$ver" != "(none)" ] || rig_die "no candidate version for $pkg (apt-get update?)"
  pinned+=("$pkg=$ver")
done
# The device model's option ROMs (pvh.bin) come from its own QEMU version: the host may
# hold a newer qemu-system-data from backports, which would be the candidate.
dm_version=$(candidate_version qemu-system-xen)
pinned+=("qemu-system-data=${dm_version%+b[0-9]*}")

fio_bin=$("$RIG_DIR/build-fio.sh")
hostile_bin=$("$RIG_DIR/build-hostile.sh")
key=$(rig_hash "$RIG_DIR/build-images.sh" "$RIG_DIR/common.sh" "$RIG_DIR"/initramfs/* \
  "$fio_bin" "$hostile_bin" "${pinned[*]}")
out=$RIG_CACHE/images-$key
exec 9>"$RIG_CACHE/images.lock"
flock 9
if [ -f "$out/versions.txt" ]; then
  echo "$out"
  exit 0
fi

start=$(date +%s)
debs=$RIG_CACHE/debs
mkdir -p "$debs"
to_fetch=()
for pv in "${pinned[@]}"; do
  pkg=${pv%%=*}
  ver=${pv#*=}
  # apt-get download names files pkg_version_arch.deb with ':' escaped as %3a.
  ls "$debs/${pkg}_${ver/:/%3a}_"*.deb >/dev/null 2>&1 || to_fetch+=("$pv")
done
if [ "${#to_fetch[@]}" -gt 0 ]; then
  rig_log "downloading ${#to_fetch[@]} packages into $debs"
  (cd "$debs" && apt-get download -q "${to_fetch[@]}") >&2 || rig_die "apt-get download failed"
fi

work=$RIG_CACHE/images-build.tmp
rm -rf "$work"
sysroot=$work/sysroot
mkdir -p "$sysroot"
for pv in "${pinned[@]}"; do
  pkg=${pv%%=*}
  ver=${pv#*=}
  dpkg-deb -x "$(ls "$debs/${pkg}_${ver/:/%3a}_"*.deb | head -n 1)" "$sysroot"
done
kver=$(ls "$sysroot/lib/modules")
moddir=$sysroot/lib/modules/$kver

# --- helpers --------------------------------------------------------------------------
# A root with the usrmerge layout, so every library can live in /usr/lib/x86_64-linux-gnu.
new_root() {
  local root=$1
  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,dev,proc,sys,run,tmp,etc,var,mnt}
  ln -s usr/bin "$root/bin"
  ln -s usr/sbin "$root/sbin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
}

install_busybox() {
  local root=$1 applet
  cp "$sysroot/bin/busybox" "$root/usr/bin/busybox"
  for applet in $("$sysroot/bin/busybox" --list); do
    [ -e "$root/usr/bin/$applet" ] || ln -s busybox "$root/usr/bin/$applet"
  done
}

# Copies a dynamically linked program's shared libraries (resolved like the dynamic loader
# does: the unpacked packages first, then the host, which is the same Debian release).
install_libs_of() {
  local root=$1 prog=$2 line lib
  local path="$sysroot/usr/lib/x86_64-linux-gnu:$sysroot/usr/lib/xen-4.17/lib/x86_64-linux-gnu"
  if LD_LIBRARY_PATH=$path ldd "$prog" 2>&1 | grep -q 'not found'; then
    LD_LIBRARY_PATH=$path ldd "$prog" >&2 || true
    rig_die "$prog needs a library that is neither in the packages nor on the host"
  fi
  while read -r line; do
    case $line in
      *"=> /"*) lib=${line#*=> }; lib=${lib%% (*}
        cp -L -n "$lib" "$root/usr/lib/x86_64-linux-gnu/" ;;
      /*ld-linux*) lib=${line%% (*}
        cp -L -n "$lib" "$root/usr/lib64/" ;;
    esac
  done < <(LD_LIBRARY_PATH=$path ldd "$prog")
}

install_prog() {
  local root=$1 src=$2 dst=$3
  mkdir -p "$root/$(dirname "$dst")"
  cp -L "$src" "$root/$dst"
  install_libs_of "$root" "$src"
}

# Prints a module's dependencies as named in its .modinfo section.
module_depends() {
  objcopy -O binary --only-section=.modinfo "$1" /dev/stdout 2>/dev/null |
    tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' '\n' | sed '/^$/d'
}
# Module name (with '_' for '-', as the kernel names them) -> path of its .ko file.
declare -A module_file
while read -r f; do
  base=$(basename "$f" .ko)
  module_file[${base//-/_}]=$f
done < <(find "$moddir/kernel" -name '*.ko')
module_path() {
  local name=${1//-/_}
  [ -n "${module_file[$name]:-}" ] && echo "${module_file[$name]}"
}
# Appends a module and (first) its dependencies to the load list, once each.
declare -A module_seen
module_order=()
add_module() {
  local name=${1//-/_} dep path
  [ -n "${module_seen[$name]:-}" ] && return 0
  module_seen[$name]=1
  if ! path=$(module_path "$name"); then
    grep -q "/${1}.ko\$\|/${name}.ko\$" "$moddir/modules.builtin" && return 0
    rig_die "module $1 is neither a module nor built in"
  fi
  for dep in $(module_depends "$path"); do add_module "$dep"; done
  module_order+=("$path")
}
# Installs modules under /lib/modules and writes their load order to /etc/modules.order.
install_modules() {
  local root=$1 path
  shift
  module_seen=()
  module_order=()
  for m in "$@"; do add_module "$m"; done
  mkdir -p "$root/lib/modules"
  : > "$root/etc/modules.order"
  for path in "${module_order[@]}"; do
    cp "$path" "$root/lib/modules/"
    basename "$path" >> "$root/etc/modules.order"
  done
}

pack() {
  local root=$1 out=$2
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) |
    zstd -q -10 -T2 -o "$out"
}

# --- dom0 -----------------------------------------------------------------------------
dom0=$work/dom0
new_root "$dom0"
install_busybox "$dom0"
install_prog "$dom0" /bin/bash /usr/bin/bash   # the hotplug scripts are bash scripts
install_prog "$dom0" /usr/bin/flock /usr/bin/flock   # their locking; not in this busybox
# glibc loads libgcc_s at run time for pthread_cancel (xl aborts without it).
cp -L "$(LD_LIBRARY_PATH= ldconfig -p | awk '/libgcc_s.so.1 .*x86-64/ { print $NF; exit }')" \
  "$dom0/usr/lib/x86_64-linux-gnu/"
for tool in "${DOM0_XEN_TOOLS[@]}"; do
  install_prog "$dom0" "$sysroot$XEN_BIN/$tool" "$XEN_BIN/$tool"
done
ln -s "$XEN_BIN/xl" "$dom0/usr/sbin/xl"
# xenstore-utils: one program that acts on its name (xenstore-read, -write, -ls, ...).
install_prog "$dom0" "$sysroot/usr/bin/xenstore" /usr/bin/xenstore
for f in "$sysroot"/usr/bin/xenstore-*; do ln -sf xenstore "$dom0/usr/bin/$(basename "$f")"; done
mkdir -p "$dom0/etc/xen"
cp -r "$sysroot/etc/xen/scripts" "$sysroot/etc/xen/xl.conf" "$dom0/etc/xen/"
install_modules "$dom0" "${DOM0_MODULES[@]}"
# HVM domains (the blkdom-hvm scenario): libxl starts qemu-xen from the path it was built
# with, loads hvmloader and SeaBIOS into the domain, and QEMU's direct kernel boot runs
# the image through the pvh.bin option ROM (linuxboot/multiboot ROMs for other kernels).
install_prog "$dom0" "$sysroot/usr/libexec/xen-qemu-system-i386" /usr/libexec/xen-qemu-system-i386
mkdir -p "$dom0/usr/lib/xen-4.17/boot" "$dom0/usr/share/seabios" "$dom0/usr/share/qemu"
cp "$sysroot/usr/lib/xen-4.17/boot/hvmloader" "$dom0/usr/lib/xen-4.17/boot/"
cp "$sysroot/usr/share/seabios/bios-256k.bin" "$dom0/usr/share/seabios/"
for rom in pvh.bin linuxboot.bin linuxboot_dma.bin multiboot.bin multiboot_dma.bin; do
  cp "$sysroot/usr/share/qemu/$rom" "$dom0/usr/share/qemu/"
done
# libxl passes `-vnc none` even with vnc=0, and QEMU's VNC set-up still loads a keymap.
mkdir -p "$dom0/usr/share/qemu/keymaps"
cp "$sysroot/usr/share/qemu/keymaps/en-us" "$dom0/usr/share/qemu/keymaps/"
cp "$RIG_DIR/initramfs/dom0-init" "$dom0/init"
chmod +x "$dom0/init"
pack "$dom0" "$work/dom0.cpio.zst"

# --- guest ----------------------------------------------------------------------------
guest=$work/guest
new_root "$guest"
install_busybox "$guest"
cp "$fio_bin" "$guest/usr/bin/fio"
cp "$hostile_bin" "$guest/usr/bin/hostile"
# e2fsprogs from the host (the same Debian release): the guest's mkfs/fsck checks, and
# resize2fs for the online resize (tests/xen/blkdom-lifecycle).
install_prog "$guest" /usr/sbin/mke2fs /usr/sbin/mke2fs
install_prog "$guest" /usr/sbin/e2fsck /usr/sbin/e2fsck
install_prog "$guest" /usr/sbin/resize2fs /usr/sbin/resize2fs
ln -s mke2fs "$guest/usr/sbin/mkfs.ext4"
ln -s e2fsck "$guest/usr/sbin/fsck.ext4"
cp /etc/mke2fs.conf "$guest/etc/"
install_modules "$guest" "${GUEST_MODULES[@]}"
cp "$RIG_DIR/initramfs/guest-init" "$guest/init"
chmod +x "$guest/init"
pack "$guest" "$work/guest.cpio.zst"

# --- hypervisor and kernel ------------------------------------------------------------
gunzip -c "$sysroot/boot/xen-4.17-amd64.gz" > "$work/xen"
cp "$sysroot/boot/vmlinuz-$kver" "$work/vmlinuz"
printf '%s\n' "${pinned[@]}" "fio(static, source)=$RIG_FIO_VERSION" "kernel=$kver" > "$work/versions.txt"

rm -rf "$out"
mkdir -p "$out"
mv "$work"/{xen,vmlinuz,dom0.cpio.zst,guest.cpio.zst} "$out/"
mv "$work/versions.txt" "$out/versions.txt"   # last: its presence marks a complete build
rm -rf "$work"
# Older builds are dead weight (~10 MB each); only one rig runs at a time.
find "$RIG_CACHE" -maxdepth 1 -name 'images-*' ! -name "images-$key" -exec rm -rf {} +
rig_log "images built in $(( $(date +%s) - start )) s: $(du -sh "$out"/*.zst | tr '\n\t' '  ')"
echo "$out"
