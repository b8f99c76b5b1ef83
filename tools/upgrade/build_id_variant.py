#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Writes a copy of a blkdom image whose GNU build id differs: the second build a live
upgrade test alternates with (the same code; only the version it reports and the
upgrade checks changes). The new id is sha1(old id + b"variant"), so the variant of an
image is always the same file.

Usage: build_id_variant.py IMAGE OUT   (prints the two build ids)
"""

import hashlib
import struct
import sys

NT_GNU_BUILD_ID = 3
PT_NOTE = 4


def build_id_span(elf):
    """(offset, length) of the build id's descriptor in the file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize)
        if kind != PT_NOTE:
            continue
        at, end = offset, offset + filesz
        while at + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, at)
            name = elf[at + 12:at + 12 + namesz]
            desc = at + 12 + (namesz + 3) // 4 * 4
            if note_type == NT_GNU_BUILD_ID and name == b"GNU\0":
                return desc, descsz
            at = desc + (descsz + 3) // 4 * 4
    raise ValueError("no GNU build-id note")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    elf = bytearray(open(sys.argv[1], "rb").read())
    at, length = build_id_span(elf)
    old = bytes(elf[at:at + length])
    new = hashlib.sha1(old + b"variant").digest()[:length]
    elf[at:at + length] = new
    with open(sys.argv[2], "wb") as f:
        f.write(elf)
    print(old.hex(), new.hex())


if __name__ == "__main__":
    main()
