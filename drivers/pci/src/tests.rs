// SPDX-License-Identifier: MIT OR Apache-2.0
use crate::fake::{FakeConfig, FakeFunction};
use crate::*;

fn at(bus: u8, device: u8, function: u8) -> PciAddress {
    PciAddress {
        bus,
        device,
        function,
    }
}

#[test]
fn enumerates_functions_and_multi_function_devices() {
    let config = FakeConfig::default();
    config.insert(at(0, 0, 0), FakeFunction::new(0x8086, 0x29c0, (6, 0, 0)));
    let mut multi = FakeFunction::new(0x8086, 0x2918, (6, 1, 0));
    multi.bytes[0x0e] = 0x80;
    config.insert(at(0, 0x1f, 0), multi);
    config.insert(
        at(0, 0x1f, 3),
        FakeFunction::new(0x8086, 0x2930, (0xc, 5, 0)),
    );
    // Function 2 of a single-function device is never probed (it would alias).
    config.insert(at(0, 3, 0), FakeFunction::new(0x1b36, 0x0010, CLASS_NVME));
    config.insert(at(0, 3, 2), FakeFunction::new(0xdead, 0xbeef, (1, 0, 0)));
    config.insert(at(1, 4, 0), FakeFunction::new(0x1af4, 0x1042, (1, 0, 0)));
    let mut seen = Vec::new();
    enumerate(&config, 0, 1, &mut |f| seen.push(f));
    let addresses: Vec<_> = seen.iter().map(|f| f.address).collect();
    assert_eq!(
        addresses,
        [
            at(0, 0, 0),
            at(0, 3, 0),
            at(0, 0x1f, 0),
            at(0, 0x1f, 3),
            at(1, 4, 0)
        ]
    );
    assert!(seen[1].is_nvme());
    assert!(seen[4].is_virtio_blk());
    assert!(!seen[0].is_nvme() && !seen[0].is_virtio_blk());
    assert_eq!(seen[1].address.to_string(), "00:03.0");
}

#[test]
fn sizes_32_and_64_bit_memory_and_io_bars_and_restores_them() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(0x1b36, 0x0010, CLASS_NVME);
    f.memory_bar64(0, 0x8_1234_0000, 0x4000, false);
    f.memory_bar32(2, 0xfebf_1000, 0x1000);
    f.io_bar(3, 0xc040, 0x40);
    f.memory_bar64(4, 0xfe00_0000, 0x0100_0000, true);
    f.set32(4, u32::from(COMMAND_MEMORY_SPACE | COMMAND_IO_SPACE));
    let a = at(0, 3, 0);
    config.insert(a, f);

    assert_eq!(
        read_bar(&config, a, 0),
        Ok(Some(Bar::Memory {
            address: 0x8_1234_0000,
            size: 0x4000,
            wide: true,
            prefetchable: false
        }))
    );
    assert_eq!(
        read_bar(&config, a, 2),
        Ok(Some(Bar::Memory {
            address: 0xfebf_1000,
            size: 0x1000,
            wide: false,
            prefetchable: false
        }))
    );
    assert_eq!(
        read_bar(&config, a, 3),
        Ok(Some(Bar::Io {
            port: 0xc040,
            size: 0x40
        }))
    );
    assert_eq!(
        read_bar(&config, a, 4).unwrap().unwrap().memory_range(),
        Some((0xfe00_0000, 0x0100_0000))
    );
    assert_eq!(read_bar(&config, a, 6), Err(BarError::NoSuchBar(6)));

    let functions = config.functions.borrow();
    let f = &functions[&a];
    // Addresses and the command register are as they were; decoding was off while probing.
    assert_eq!(f.get32(0x10), 0x1234_0004);
    assert_eq!(f.get32(0x14), 0x8);
    assert_eq!(f.get32(0x18), 0xfebf_1000);
    assert_eq!(f.get32(4) as u16, COMMAND_MEMORY_SPACE | COMMAND_IO_SPACE);
    let probe = f
        .writes
        .iter()
        .position(|w| *w == (0x18, u32::MAX))
        .unwrap();
    let off_before = f.writes[..probe].iter().rev().find(|w| w.0 == 4).unwrap();
    assert_eq!(off_before.1 as u16 & COMMAND_MEMORY_SPACE, 0);
}

#[test]
fn unimplemented_and_reserved_bars() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(1, 2, (1, 0, 0));
    f.set32(0x14, 0b010); // memory type 1: reserved
    f.memory_bar64(4, 0x1000_0000, 0x1000, false);
    f.set32(0x14 + 16, 0);
    let a = at(0, 1, 0);
    config.insert(a, f);
    assert_eq!(read_bar(&config, a, 0), Ok(None));
    assert_eq!(read_bar(&config, a, 1), Err(BarError::ReservedType(1)));
    let mut wide_last = FakeFunction::new(1, 2, (1, 0, 0));
    wide_last.set32(0x24, 0b100);
    config.insert(at(0, 2, 0), wide_last);
    assert_eq!(
        read_bar(&config, at(0, 2, 0), 5),
        Err(BarError::NoSuchBar(5))
    );
    let mut bridge = FakeFunction::new(1, 2, (6, 4, 0));
    bridge.bytes[0x0e] = 1;
    config.insert(at(0, 4, 0), bridge);
    assert_eq!(read_bar(&config, at(0, 4, 0), 0), Err(BarError::NotADevice));
}

fn virtio_cap(cfg_type: u8, bar: u8, offset: u32, length: u32, extra: &[u8]) -> Vec<u8> {
    let mut body = vec![16 + extra.len() as u8, cfg_type, bar, 0, 0, 0];
    body.extend_from_slice(&offset.to_le_bytes());
    body.extend_from_slice(&length.to_le_bytes());
    body.extend_from_slice(extra);
    body
}

#[test]
fn walks_capabilities_msix_and_virtio_vendor_caps() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(0x1af4, 0x1042, (1, 0, 0));
    let mut msix_body = vec![0u8; 10];
    msix_body[0..2].copy_from_slice(&(0x8000u16 | 7).to_le_bytes());
    msix_body[2..6].copy_from_slice(&(0x2000u32 | 1).to_le_bytes());
    msix_body[6..10].copy_from_slice(&(0x3000u32 | 1).to_le_bytes());
    f.add_capability(0x98, CAP_ID_MSIX, &msix_body);
    f.add_capability(0x84, CAP_ID_VENDOR, &virtio_cap(1, 4, 0, 0x1000, &[]));
    f.add_capability(0x70, CAP_ID_VENDOR, &virtio_cap(3, 4, 0x1000, 0x1000, &[]));
    f.add_capability(0x60, CAP_ID_VENDOR, &virtio_cap(4, 4, 0x2000, 0x1000, &[]));
    f.add_capability(
        0x4c,
        CAP_ID_VENDOR,
        &virtio_cap(2, 4, 0x3000, 0x1000, &4u32.to_le_bytes()),
    );
    f.add_capability(0xb0, CAP_ID_VENDOR, &virtio_cap(9, 4, 0, 0, &[]));
    let a = at(0, 4, 0);
    config.insert(a, f);

    let ids: Vec<_> = capabilities(&config, a).map(|c| (c.offset, c.id)).collect();
    assert_eq!(ids.len(), 6);
    assert_eq!(ids[0], (0x98, CAP_ID_MSIX));
    let m = msix(&config, a).unwrap();
    assert_eq!(
        (
            m.table_size,
            m.table_bar,
            m.table_offset,
            m.pba_bar,
            m.pba_offset,
            m.enabled
        ),
        (8, 1, 0x2000, 1, 0x3000, true)
    );
    let caps: Vec<_> = virtio_capabilities(&config, a).collect();
    assert_eq!(caps.len(), 4, "unknown type 9 skipped: {caps:?}");
    assert_eq!(caps[0].kind, VirtioCapKind::Common);
    assert_eq!(
        caps[3],
        VirtioCap {
            kind: VirtioCapKind::Notify { multiplier: 4 },
            bar: 4,
            offset: 0x3000,
            length: 0x1000
        }
    );
}

#[test]
fn a_looping_capability_list_ends() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(1, 2, (1, 0, 0));
    f.add_capability(0x40, CAP_ID_VENDOR, &[]);
    f.bytes[0x41] = 0x40; // points at itself
    let a = at(0, 1, 0);
    config.insert(a, f);
    assert_eq!(capabilities(&config, a).count(), 48);
    let mut no_list = FakeFunction::new(1, 2, (1, 0, 0));
    no_list.bytes[0x34] = 0x40; // pointer without the status bit: ignored
    config.insert(at(0, 2, 0), no_list);
    assert_eq!(capabilities(&config, at(0, 2, 0)).count(), 0);
}

#[test]
fn enabling_sets_memory_bus_master_and_masks_intx() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(1, 2, (1, 0, 0));
    f.set32(4, 0x0010_0001); // status cap-list bit, I/O decode on
    let a = at(0, 1, 0);
    config.insert(a, f);
    let command = enable_memory_and_dma(&config, a);
    assert_eq!(
        command,
        COMMAND_IO_SPACE | COMMAND_MEMORY_SPACE | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE
    );
    assert_eq!(
        config.functions.borrow()[&a].get32(4),
        0x0010_0000 | u32::from(command)
    );
}

#[test]
fn tree_walk_follows_bridges_once() {
    let config = FakeConfig::default();
    config.insert(at(0, 0, 0), FakeFunction::new(0x8086, 0x29c0, (6, 0, 0)));
    let mut bridge = FakeFunction::new(0x1b36, 0x000c, (6, 4, 0));
    bridge.bytes[0x0e] = 1;
    bridge.bytes[0x19] = 5;
    config.insert(at(0, 2, 0), bridge);
    let mut inner = FakeFunction::new(0x1b36, 0x000c, (6, 4, 0));
    inner.bytes[0x0e] = 1;
    inner.bytes[0x19] = 0; // points back at the root: not walked twice
    config.insert(at(5, 0, 0), inner);
    config.insert(at(5, 1, 0), FakeFunction::new(0x1b36, 0x0010, CLASS_NVME));
    // Not behind any bridge: never reached.
    config.insert(at(9, 0, 0), FakeFunction::new(0x1af4, 0x1042, (1, 0, 0)));
    let mut seen = Vec::new();
    enumerate_tree(&config, 0, &mut |f| seen.push(f.address));
    assert_eq!(seen, [at(0, 0, 0), at(0, 2, 0), at(5, 0, 0), at(5, 1, 0)]);
}

#[test]
fn passed_through_devices_are_found_by_the_devfn_libxl_writes() {
    // libxl writes "%x" of the devfn: slot 3 function 0 is "18", slot 5 function 2 "2a".
    assert_eq!(PciAddress::from_xen_vdevfn("18"), Some(at(0, 3, 0)));
    assert_eq!(PciAddress::from_xen_vdevfn("2a\n"), Some(at(0, 5, 2)));
    assert_eq!(PciAddress::from_xen_vdevfn("0x28"), Some(at(0, 5, 0)));
    assert_eq!(PciAddress::from_xen_vdevfn(""), None);
    assert_eq!(
        PciAddress::from_xen_vdevfn("100"),
        None,
        "a devfn is one byte"
    );
    assert_eq!(PciAddress::from_xen_vdevfn("zz"), None);
}

#[test]
fn bar_errors_display_their_cause() {
    let text = |e: &dyn core::error::Error| e.to_string();
    assert_eq!(text(&BarError::NoSuchBar(6)), "no BAR 6");
    assert_eq!(text(&BarError::NotADevice), "not a type-0 (device) header");
}

/// A bus like an HVM domain's: a host bridge, a multi-function chipset device, an NVMe
/// controller and two virtio-blk disks (the second behind a bridge on bus 1).
fn hvm_bus() -> FakeConfig {
    let config = FakeConfig::default();
    config.insert(at(0, 0, 0), FakeFunction::new(0x8086, 0x1237, (6, 0, 0)));
    let mut isa = FakeFunction::new(0x8086, 0x7000, (6, 1, 0));
    isa.bytes[0x0e] = 0x80;
    config.insert(at(0, 1, 0), isa);
    config.insert(at(0, 1, 1), FakeFunction::new(0x8086, 0x7010, (1, 1, 0x80)));
    let mut nvme = FakeFunction::new(0x1b36, 0x0010, CLASS_NVME);
    nvme.memory_bar64(0, 0x8_f100_0000, 0x4000, false); // above 4 GiB
    config.insert(at(0, 3, 0), nvme);
    let mut virtio = FakeFunction::new(0x1af4, 0x1001, (1, 0, 0));
    virtio.io_bar(0, 0xc100, 0x80);
    virtio.memory_bar32(1, 0xf100_7000, 0x1000);
    virtio.memory_bar64(4, 0xf200_0000, 0x4000, true);
    config.insert(at(0, 4, 0), virtio);
    let mut bridge = FakeFunction::new(0x1b36, 0x0001, (6, 4, 0));
    bridge.bytes[0x0e] = 1;
    bridge.bytes[0x19] = 1;
    config.insert(at(0, 5, 0), bridge);
    config.insert(at(1, 0, 0), FakeFunction::new(0x1af4, 0x1042, (1, 0, 0)));
    config
}

#[test]
fn the_inventory_finds_devices_without_touching_the_bus_again() {
    let config = hvm_bus();
    let mut inventory = Inventory::walk(&config, 0);
    let walk = config.take_accesses();
    assert!(
        walk > 40,
        "a walk of a bus reads every slot ({walk} accesses)"
    );
    assert_eq!(inventory.walks(), 1);
    let nvme = inventory.find(&config, Function::is_nvme, 0);
    assert_eq!(nvme.map(|f| f.address), Some(at(0, 3, 0)));
    let virtio_1 = inventory.find(&config, Function::is_virtio_blk, 1);
    assert_eq!(
        virtio_1.map(|f| f.address),
        Some(at(1, 0, 0)),
        "behind the bridge"
    );
    assert_eq!(config.take_accesses(), 0, "found in what the walk kept");
    assert_eq!(inventory.walks(), 1);
    // The same answers as a walk of its own (what every attach used to make).
    let mut direct = Vec::new();
    enumerate_tree(&config, 0, &mut |f| direct.push(f));
    assert_eq!(inventory.functions().copied().collect::<Vec<_>>(), direct);
}

#[test]
fn a_device_the_inventory_lacks_is_looked_for_once_more_then_refused() {
    let config = hvm_bus();
    let mut inventory = Inventory::walk(&config, 0);
    let walk = config.take_accesses();
    assert_eq!(inventory.find(&config, Function::is_virtio_blk, 2), None);
    assert_eq!(inventory.walks(), 2, "one more walk, no more");
    assert_eq!(config.take_accesses(), walk);
    // Asked again (another attach), it walks once more: a device may have come since.
    assert_eq!(inventory.find(&config, Function::is_virtio_blk, 2), None);
    assert_eq!(inventory.walks(), 3);
    // One hot-plugged meanwhile is found by that walk, and kept.
    config.insert(at(0, 6, 0), FakeFunction::new(0x1af4, 0x1042, (1, 0, 0)));
    let found = inventory.find(&config, Function::is_virtio_blk, 2);
    assert_eq!(inventory.walks(), 4);
    // Walk order: bus 0 first, then the bus behind the bridge.
    assert_eq!(found.map(|f| f.address), Some(at(1, 0, 0)));
    assert_eq!(
        inventory
            .find(&config, Function::is_virtio_blk, 1)
            .map(|f| f.address),
        Some(at(0, 6, 0))
    );
    assert_eq!(inventory.walks(), 4);
}

#[test]
fn the_inventory_reads_and_sizes_each_bar_once() {
    let config = hvm_bus();
    let mut inventory = Inventory::walk(&config, 0);
    let virtio = at(0, 4, 0);
    let expected = read_bar(&config, virtio, 4);
    assert_eq!(
        expected,
        Ok(Some(Bar::Memory {
            address: 0xf200_0000,
            size: 0x4000,
            wide: true,
            prefetchable: true
        }))
    );
    config.take_accesses();
    assert_eq!(inventory.bar(&config, virtio, 4), expected);
    assert!(config.take_accesses() >= 10, "sized the first time");
    for _ in 0..3 {
        assert_eq!(inventory.bar(&config, virtio, 4), expected);
    }
    assert_eq!(config.take_accesses(), 0, "kept");
    // Errors are kept too, and a BAR index past the last is refused as read_bar does.
    assert_eq!(
        inventory.bar(&config, at(0, 5, 0), 0),
        Err(BarError::NotADevice)
    );
    assert_eq!(
        inventory.bar(&config, virtio, 6),
        Err(BarError::NoSuchBar(6))
    );
    config.take_accesses();
    assert_eq!(
        inventory.bar(&config, at(0, 5, 0), 0),
        Err(BarError::NotADevice)
    );
    assert_eq!(config.take_accesses(), 0);
    // A walk that finds the function again keeps its BARs.
    inventory.find(&config, Function::is_virtio_blk, 9);
    config.take_accesses();
    assert_eq!(inventory.bar(&config, virtio, 4), expected);
    assert_eq!(config.take_accesses(), 0);
}

#[test]
fn memory_bar_addresses_match_sizing_at_one_read_per_bar() {
    let config = hvm_bus();
    let inventory = Inventory::walk(&config, 0);
    config.take_accesses();
    let addresses = inventory.memory_bar_addresses(&config);
    let reads = config.take_accesses();
    assert!(
        config
            .functions
            .borrow()
            .values()
            .all(|f| f.writes.is_empty()),
        "no sizing writes"
    );
    // What sizing every BAR of every device finds (the bridge has no type-0 BARs).
    let mut sized = Vec::new();
    for f in inventory.functions().filter(|f| f.header_type == 0) {
        let mut index = 0;
        while index < 6 {
            match read_bar(&config, f.address, index) {
                Ok(Some(Bar::Memory { address, wide, .. })) => {
                    if address != 0 {
                        sized.push(address);
                    }
                    index += if wide { 2 } else { 1 };
                }
                _ => index += 1,
            }
        }
    }
    assert_eq!(addresses, sized);
    assert_eq!(addresses, [0x8_f100_0000, 0xf100_7000, 0xf200_0000]);
    // One read per BAR register of the 6 devices (a 64-bit BAR's upper half read with
    // it), where sizing takes a dozen accesses per BAR.
    assert_eq!(reads, 6 * 6);
}

#[test]
fn a_64_bit_bar_in_the_last_slot_and_reserved_types_are_left_out() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(1, 2, (1, 0, 0));
    f.set32(0x10, 0xfe00_0000 | 0b010); // reserved memory type
    f.set32(0x24, 0xfd00_0000 | 0b100); // 64-bit in slot 5
    f.memory_bar32(2, 0xfc00_0000, 0x1000);
    config.insert(at(0, 1, 0), f);
    assert_eq!(memory_bar_addresses(&config, at(0, 1, 0)), [0xfc00_0000]);
}

#[test]
fn a_virtio_capability_costs_four_reads_at_most() {
    let config = FakeConfig::default();
    let mut f = FakeFunction::new(0x1af4, 0x1042, (1, 0, 0));
    f.add_capability(0x84, CAP_ID_VENDOR, &virtio_cap(1, 4, 0, 0x1000, &[]));
    f.add_capability(0x70, CAP_ID_VENDOR, &virtio_cap(3, 4, 0x1000, 0x1000, &[]));
    f.add_capability(
        0x4c,
        CAP_ID_VENDOR,
        &virtio_cap(2, 4, 0x3000, 0x1000, &4u32.to_le_bytes()),
    );
    // 8 bytes long: too short for a virtio capability.
    f.add_capability(0x40, CAP_ID_VENDOR, &[8, 4, 4, 0, 0, 0]);
    let a = at(0, 4, 0);
    config.insert(a, f);
    config.take_accesses();
    let caps: Vec<_> = virtio_capabilities(&config, a).collect();
    assert_eq!(caps.len(), 3, "the one shorter than 16 bytes is skipped");
    // Status and pointer (2), then per capability its header (1), BAR (1), offset and
    // length (2), the notify multiplier (1); the short one only its header.
    assert_eq!(config.take_accesses(), 2 + 3 * 4 + 1 + 1);
}
