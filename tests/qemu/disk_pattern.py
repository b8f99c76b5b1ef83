# SPDX-License-Identifier: MIT OR Apache-2.0
"""The disk test's seeded writes, recomputed on the host (mirror of kernel/testhooks/src/pattern.rs).

Queue q owns region q of the disk; write i of queue q covers `sectors` sectors at `sector`,
filled with little-endian 64-bit words, the word at absolute byte 8k being
base(seed, q, i) + k * GOLDEN (mod 2^64).
"""

import struct

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def base(seed, queue, index):
    return mix(seed ^ (queue << 32) ^ ((index * GOLDEN) & MASK))


def plan(seed, queue, region_start, region_sectors, count, max_sectors=2048):
    state = mix((seed + queue * GOLDEN) & MASK)
    max_sectors = max(max_sectors, 1)
    writes = []
    if region_sectors == 0:
        return writes

    def random():
        nonlocal state
        state = (state + GOLDEN) & MASK
        return mix(state)

    for index in range(count):
        longest = min(max_sectors, region_sectors)
        kind = random() % 4
        if kind == 0:
            sectors = 1
        elif kind == 1:
            sectors = longest
        else:
            sectors = 1 + random() % longest
        sector = region_start + random() % (region_sectors - sectors + 1)
        writes.append((index, sector, sectors))
    return writes


def data(seed, queue, index, byte_offset, length):
    start = base(seed, queue, index)
    first = byte_offset // 8
    words = [(start + (first + k) * GOLDEN) & MASK for k in range(length // 8)]
    return struct.pack("<%dQ" % len(words), *words)


def expected_image(size, seed, queues, count, max_sectors=2048, initial=None):
    """The bytes a disk of `size` bytes (initially zero, or `initial`) holds after the
    test's writes."""
    image = bytearray(size) if initial is None else bytearray(initial[:size])
    sectors = size // 512
    region = sectors // queues
    for q in range(queues):
        for index, sector, n in plan(seed, q, q * region, region, count, max_sectors):
            image[sector * 512:(sector + n) * 512] = data(seed, q, index, sector * 512, n * 512)
    return image


def self_check():
    """The reference values drivers/backing asserts too."""
    assert mix(1) == 0x5692161D100B05E5
    assert base(7, 0, 0) == 0x12AE30237B17DF14
    assert plan(7, 0, 0, 131072, 3) == [(0, 4034, 1046), (1, 67566, 502), (2, 89558, 1169)]
    first = struct.unpack("<Q", data(42, 1, 3, 4096, 8))[0]
    assert first == (base(42, 1, 3) + 512 * GOLDEN) & MASK


if __name__ == "__main__":
    self_check()
    print("disk_pattern: reference values agree")
