// SPDX-License-Identifier: MIT OR Apache-2.0
use super::*;

/// A RAM disk's size and name, if `text` names one.
fn ram(text: &str) -> Option<(u64, Option<String>)> {
    match parse_backing(text) {
        Ok(Backing::Ram { bytes, name }) => Some((bytes, name.map(|n| n.to_string()))),
        _ => None,
    }
}

#[test]
fn ram_disk_names_are_checked() {
    let long = "n".repeat(RamName::MAX_LEN);
    assert_eq!(
        ram(&format!("ram:1M:{long}")),
        Some((1 << 20, Some(long.clone())))
    );
    let too_long = format!("ram:1M:{long}x");
    assert_eq!(
        parse_backing(&too_long),
        Err(SpecError::BadName(&too_long[7..]))
    );
    for bad in [
        "ram:1M:",
        "ram:1M:a/b",
        "ram:1M:a b",
        "ram:1M:a:b",
        "ram:1M:\u{e9}",
    ] {
        assert!(
            matches!(parse_backing(bad), Err(SpecError::BadName(_))),
            "{bad}"
        );
    }
    assert_eq!(parse_backing("ram:0:x"), Err(SpecError::BadSize("0")));
    assert!(SpecError::BadName("a b")
        .to_string()
        .contains("A-Z a-z 0-9"));
}

/// The texts reach a vbd's `hotplug-error` node and the disk test's verdict line.
#[test]
fn errors_display_their_cause() {
    let text = |e: &dyn core::error::Error| e.to_string();
    assert_eq!(
        text(&SpecError::UnknownKind("scsi")),
        "unknown backing store \"scsi\"; use nvme:serial=<SN>:<nsid>, nvme:nguid=<hex>, \
         nvme:eui64=<hex>, nvme@<bb:dd.f>:<nsid>, virtio:serial=<id>, virtio@<bb:dd.f> (each \
         [:<slice>]), nvme:<nsid>, virtio:<index>, ram:<size>[K|M|G][:<name>] or nvme-tcp:<ipv4>:<port>:<nsid>:nqn=<subsystem NQN>[,<option>...]"
    );
    assert_eq!(
        text(&SpecError::BadNumber("virtio", "x")),
        "virtio: \"x\" is not a number"
    );
    assert_eq!(
        text(&SpecError::ZeroNamespace),
        "nvme: namespace ids start at 1"
    );
}

#[test]
fn parses_the_three_kinds() {
    assert_eq!(
        parse_backing("nvme:1"),
        Ok(Backing::Nvme {
            name: NvmeName::First { nsid: 1 },
            region: Region::Whole
        })
    );
    assert_eq!(
        parse_backing("nvme:4294967295"),
        Ok(Backing::Nvme {
            name: NvmeName::First { nsid: u32::MAX },
            region: Region::Whole
        })
    );
    assert_eq!(
        parse_backing("virtio:0"),
        Ok(Backing::Virtio {
            name: VirtioName::Index(0),
            region: Region::Whole
        })
    );
    assert_eq!(
        parse_backing("virtio:3"),
        Ok(Backing::Virtio {
            name: VirtioName::Index(3),
            region: Region::Whole
        })
    );
    assert_eq!(
        parse_backing("ram:64M"),
        Ok(Backing::Ram {
            bytes: 64 << 20,
            name: None
        })
    );
    assert_eq!(ram("ram:4k"), Some((4096, None)));
    assert_eq!(ram("ram:1G"), Some((1 << 30, None)));
    assert_eq!(ram("ram:1536"), Some((1536, None)));
    assert_eq!(
        ram("ram:128M:guest-1_disk.a"),
        Some((128 << 20, Some("guest-1_disk.a".into())))
    );
}

#[test]
fn malformed_names_say_what_is_wrong() {
    assert_eq!(parse_backing(""), Err(SpecError::Empty));
    assert_eq!(parse_backing("scsi:1"), Err(SpecError::UnknownKind("scsi")));
    assert_eq!(parse_backing("NVME:1"), Err(SpecError::UnknownKind("NVME")));
    assert_eq!(
        parse_backing("nvme"),
        Err(SpecError::MissingArgument("nvme"))
    );
    assert_eq!(
        parse_backing("nvme:"),
        Err(SpecError::MissingArgument("nvme"))
    );
    assert_eq!(
        parse_backing("virtio"),
        Err(SpecError::MissingArgument("virtio"))
    );
    assert_eq!(parse_backing("nvme:0"), Err(SpecError::ZeroNamespace));
    assert_eq!(
        parse_backing("nvme:-1"),
        Err(SpecError::BadNumber("nvme", "-1"))
    );
    assert_eq!(
        parse_backing("nvme:+1"),
        Err(SpecError::BadNumber("nvme", "+1"))
    );
    assert_eq!(
        parse_backing("nvme: 1"),
        Err(SpecError::BadNumber("nvme", " 1"))
    );
    assert_eq!(
        parse_backing("nvme:4294967296"),
        Err(SpecError::BadNumber("nvme", "4294967296"))
    );
    assert_eq!(
        parse_backing("virtio:x"),
        Err(SpecError::BadNumber("virtio", "x"))
    );
    assert_eq!(parse_backing("ram:0"), Err(SpecError::BadSize("0")));
    assert_eq!(parse_backing("ram:100"), Err(SpecError::BadSize("100")));
    assert_eq!(parse_backing("ram:M"), Err(SpecError::BadSize("M")));
    assert_eq!(
        parse_backing("ram:99999999999999999999G"),
        Err(SpecError::BadSize("99999999999999999999G"))
    );
    assert_eq!(
        parse_backing("ram:17179869184G"),
        Err(SpecError::BadSize("17179869184G"))
    );
    let message = format!("{}", parse_backing("disk:1").unwrap_err());
    assert!(message.contains("nvme:<nsid>"), "{message}");
}

fn region(text: &str) -> Result<Region, SpecError<'_>> {
    parse_backing(text).map(|b| b.device().expect("a device").1)
}

fn named(label: &str) -> Region {
    Region::PartitionNamed(PartName::new(label).unwrap())
}

#[test]
fn parses_every_slice_form_on_both_device_kinds() {
    assert_eq!(
        parse_backing("nvme:1:part=2"),
        Ok(Backing::Nvme {
            name: NvmeName::First { nsid: 1 },
            region: Region::Partition(2)
        })
    );
    assert_eq!(
        parse_backing("virtio:0:part=4294967295"),
        Ok(Backing::Virtio {
            name: VirtioName::Index(0),
            region: Region::Partition(u32::MAX)
        })
    );
    assert_eq!(region("nvme:2:part=name:root"), Ok(named("root")));
    assert_eq!(region("virtio:1:part=name:root"), Ok(named("root")));
    // The label is the rest of the option: spaces, ':' and '=' included.
    assert_eq!(
        region("nvme:1:part=name:Linux filesystem"),
        Ok(named("Linux filesystem"))
    );
    assert_eq!(region("nvme:1:part=name:a:b=c"), Ok(named("a:b=c")));
    let longest = "x".repeat(PartName::MAX_LEN);
    assert_eq!(
        region(&format!("nvme:1:part=name:{longest}")),
        Ok(named(&longest))
    );
    assert_eq!(
        parse_backing("nvme:1:offset=1M,size=8M"),
        Ok(Backing::Nvme {
            name: NvmeName::First { nsid: 1 },
            region: Region::Extent {
                offset: 1 << 20,
                size: 8 << 20
            }
        })
    );
    // Either order, any suffix, offset 0, sizes in whole sectors.
    assert_eq!(
        region("virtio:0:size=1536,offset=0"),
        Ok(Region::Extent {
            offset: 0,
            size: 1536
        })
    );
    assert_eq!(
        region("nvme:1:offset=4k,size=2g"),
        Ok(Region::Extent {
            offset: 4096,
            size: 2 << 30
        })
    );
    assert_eq!(
        region("nvme:1:offset=8192,size=512"),
        Ok(Region::Extent {
            offset: 8192,
            size: 512
        })
    );
    // Near the top of 64 bits: the end still fits.
    let top = u64::MAX / 4096 * 4096 - 4096;
    assert_eq!(
        region(&format!("nvme:1:offset={top},size=4096")),
        Ok(Region::Extent {
            offset: top,
            size: 4096
        })
    );
    // The whole-device forms are unchanged.
    assert_eq!(region("nvme:7"), Ok(Region::Whole));
    assert_eq!(region("virtio:0"), Ok(Region::Whole));
}

#[test]
fn every_bad_slice_says_what_is_wrong() {
    use SpecError::*;
    let cases: &[(&str, SpecError<'_>)] = &[
        ("nvme:1:", NoSlice("nvme")),
        ("virtio:0:", NoSlice("virtio")),
        ("nvme:1:,", EmptyOption("nvme")),
        ("nvme:1:part=1,", EmptyOption("nvme")),
        ("nvme:1:offset=0,,size=1M", EmptyOption("nvme")),
        (",nvme:1", UnknownKind(",nvme")),
        ("nvme:1:partition=1", UnknownOption("nvme", "partition=1")),
        ("nvme:1:Part=1", UnknownOption("nvme", "Part=1")),
        (
            "virtio:0:start=0,size=1M",
            UnknownOption("virtio", "start=0"),
        ),
        ("nvme:1:ro", UnknownOption("nvme", "ro")),
        ("nvme:1:part", MissingValue("nvme", "part")),
        ("nvme:1:part=", MissingValue("nvme", "part")),
        ("nvme:1:offset=,size=1M", MissingValue("nvme", "offset")),
        ("virtio:0:offset=0,size", MissingValue("virtio", "size")),
        ("nvme:1:part=1,part=2", DuplicateOption("nvme", "part")),
        (
            "nvme:1:offset=0,offset=4K",
            DuplicateOption("nvme", "offset"),
        ),
        (
            "nvme:1:size=1M,offset=0,size=2M",
            DuplicateOption("nvme", "size"),
        ),
        ("nvme:1:part=0", ZeroPartition("nvme")),
        ("virtio:0:part=0", ZeroPartition("virtio")),
        ("nvme:1:part=-1", BadPartition("nvme", "-1")),
        ("nvme:1:part=+1", BadPartition("nvme", "+1")),
        ("nvme:1:part=two", BadPartition("nvme", "two")),
        ("nvme:1:part=4294967296", BadPartition("nvme", "4294967296")),
        ("nvme:1:part=name", BadPartition("nvme", "name")),
        ("nvme:1:part=name:", BadPartitionName("nvme", "")),
        (
            "nvme:1:part=name:caf\u{e9}",
            BadPartitionName("nvme", "caf\u{e9}"),
        ),
        ("nvme:1:part=name:a\tb", BadPartitionName("nvme", "a\tb")),
        ("nvme:1:part=name:a,b", UnknownOption("nvme", "b")),
        ("nvme:1:part=1,offset=0", PartitionWithExtent("nvme")),
        ("nvme:1:size=1M,part=name:x", PartitionWithExtent("nvme")),
        ("nvme:1:offset=1M", MissingOption("nvme", "size")),
        ("virtio:0:size=1M", MissingOption("virtio", "offset")),
        ("nvme:1:offset=-4K,size=1M", BadOffset("nvme", "-4K")),
        ("nvme:1:offset=1000,size=1M", BadOffset("nvme", "1000")),
        ("nvme:1:offset=512,size=1M", BadOffset("nvme", "512")),
        ("nvme:1:offset=1T,size=1M", BadOffset("nvme", "1T")),
        ("nvme:1:offset=K,size=1M", BadOffset("nvme", "K")),
        (
            "nvme:1:offset=18446744073709551616,size=1M",
            BadOffset("nvme", "18446744073709551616"),
        ),
        (
            "nvme:1:offset=17179869184G,size=1M",
            BadOffset("nvme", "17179869184G"),
        ),
        ("nvme:1:offset=0,size=0", BadSliceSize("nvme", "0")),
        ("nvme:1:offset=0,size=0M", BadSliceSize("nvme", "0M")),
        ("nvme:1:offset=0,size=-1M", BadSliceSize("nvme", "-1M")),
        ("nvme:1:offset=0,size=100", BadSliceSize("nvme", "100")),
        ("virtio:0:offset=0,size= 1M", BadSliceSize("virtio", " 1M")),
        (
            "nvme:1:offset=0,size=17179869184G",
            BadSliceSize("nvme", "17179869184G"),
        ),
        ("nvme:1:offset=17179869180G,size=4G", SliceOverflows("nvme")),
        ("nvme:0:part=1", ZeroNamespace),
        ("nvme:x:part=1", BadNumber("nvme", "x")),
        ("nvme::part=1", BadNumber("nvme", "")),
        (
            "virtio:4294967296:part=1",
            BadNumber("virtio", "4294967296"),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_backing(text), Err(*expected), "{text}");
    }
}

#[test]
fn slice_errors_name_the_option_and_the_rule() {
    let text = |spec: &str| parse_backing(spec).unwrap_err().to_string();
    assert_eq!(
        text("nvme:1:offset=1000,size=1M"),
        "nvme: offset=\"1000\" must be a multiple of 4096 bytes (suffix K, M or G)"
    );
    assert_eq!(
        text("virtio:0:offset=0,size=0"),
        "virtio: size=\"0\" must be a non-zero multiple of 512 bytes (suffix K, M or G)"
    );
    assert_eq!(
        text("nvme:1:part=0"),
        "nvme: part=0: partitions are numbered from 1"
    );
    assert_eq!(
        text("nvme:1:colour=blue"),
        "nvme: unknown option \"colour=blue\"; a slice is part=<n>, part=name:<label> or offset=<size>,size=<size>"
    );
    assert_eq!(text("nvme:1:part=1,part=1"), "nvme: part= given twice");
    assert_eq!(text("nvme:1:size="), "nvme: size= needs a value");
    assert_eq!(
        text("nvme:1:offset=4K"),
        "nvme: offset= and size= go together; size= is missing"
    );
    assert_eq!(
        text("nvme:1:part=2,size=1M"),
        "nvme: part= names the slice alone; it cannot go with offset= or size="
    );
    assert!(text("nvme:1:part=name:").contains("1 to 36 printable ASCII"));
    assert!(text("nvme:1:").contains("nothing after the second ':'"));
    assert!(text("nvme:1:offset=17179869180G,size=4G").contains("beyond 2^64 bytes"));
}

#[test]
fn backings_print_as_they_parse() {
    for text in [
        "nvme:1",
        "virtio:0",
        "nvme:1:part=2",
        "virtio:3:part=name:Linux filesystem",
        "nvme:2:offset=1M,size=8M",
        "nvme:2:offset=0,size=1536",
        "virtio:0:offset=12K,size=3G",
        "ram:64M",
        "ram:1536:disk-1",
    ] {
        let backing = parse_backing(text).unwrap();
        assert_eq!(backing.to_string(), text);
        assert_eq!(parse_backing(&backing.to_string()), Ok(backing));
    }
    assert_eq!(
        parse_backing("nvme:1:size=1024K,offset=4096")
            .unwrap()
            .to_string(),
        "nvme:1:offset=4K,size=1M"
    );
}

#[test]
fn devices_and_regions() {
    let (device, region) = parse_backing("virtio:2:part=3").unwrap().device().unwrap();
    assert_eq!(device, DeviceName::Virtio(VirtioName::Index(2)));
    assert_eq!(device.to_string(), "virtio:2");
    assert!(region.needs_partition_table());
    assert!(named("x").needs_partition_table());
    assert!(!Region::Whole.needs_partition_table());
    assert!(!Region::Extent {
        offset: 0,
        size: 512
    }
    .needs_partition_table());
    assert_eq!(parse_backing("ram:1M").unwrap().device(), None);
    let at = pci::PciAddress {
        bus: 0,
        device: 4,
        function: 0,
    };
    assert_ne!(
        DeviceId::Nvme {
            controller: at,
            nsid: 1
        },
        DeviceId::Virtio { device: at }
    );
    assert_eq!(
        DeviceId::Nvme {
            controller: at,
            nsid: 1
        }
        .to_string(),
        "nvme@00:04.0:1"
    );
    assert_eq!(
        DeviceId::Virtio { device: at }.to_string(),
        "virtio@00:04.0"
    );
}

#[test]
fn partition_names_are_checked() {
    assert_eq!(PartName::new("EFI system").unwrap().as_str(), "EFI system");
    assert_eq!(PartName::new("a").unwrap().as_bytes(), b"a");
    assert!(PartName::new("").is_none());
    assert!(PartName::new(&"x".repeat(PartName::MAX_LEN + 1)).is_none());
    assert!(PartName::new("a,b").is_none());
    assert!(PartName::new("\u{7f}").is_none());
    assert!(PartName::new("~ !").is_some());
    assert_eq!(format!("{:?}", PartName::new("a b").unwrap()), "\"a b\"");
}

/// `Backing` stays a small value the registry copies freely.
#[test]
fn backing_stays_small_and_copy() {
    fn copy<T: Copy>() {}
    copy::<Backing>();
    assert!(core::mem::size_of::<Backing>() <= 80);
}

#[test]
fn nvme_tcp_targets_are_a_kind_of_their_own() {
    let nqn = "nqn.2026-01.org.example:disk1";
    assert_eq!(
        parse_backing(&format!("nvme-tcp:10.9.0.1:4420:1:nqn={nqn}")),
        Ok(Backing::NvmeTcp {
            region: Region::Whole
        })
    );
    assert_eq!(
        parse_backing(&format!(
            "nvme-tcp:10.9.0.1:4420:1:nqn={nqn},offset=1G,size=8G"
        )),
        Ok(Backing::NvmeTcp {
            region: Region::Extent {
                offset: 1 << 30,
                size: 8 << 30
            }
        })
    );
    assert_eq!(
        parse_backing(&format!(
            "nvme-tcp:10.9.0.1:4420:1:nqn={nqn},ctrl-loss-tmo=30,offset=0,size=64M"
        )),
        Ok(Backing::NvmeTcp {
            region: Region::Extent {
                offset: 0,
                size: 64 << 20
            }
        })
    );
    let text = |spec: &str| parse_backing(spec).unwrap_err().to_string();
    // The reconnect times' errors in their own words, as parse_nvme_tcp says them.
    for options in [
        "reconnect-delay=0",
        "reconnect-delay=61",
        "ctrl-loss-tmo=4",
        "ctrl-loss-tmo=3601",
        "reconnect-delay=30,ctrl-loss-tmo=20",
        "retry=1",
        "ctrl-loss-tmo=1,ctrl-loss-tmo=1",
    ] {
        let spec = format!("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.a,{options}");
        assert_eq!(
            text(&spec),
            parse_nvme_tcp(&spec).unwrap_err().to_string(),
            "{spec}"
        );
    }
    assert!(text("nvme-tcp:10.9.0:4420:1:nqn=nqn.a").contains("is not an IPv4 address"));
    assert!(text("nvme-tcp:10.9.0.1:4420:1:nqn=iqn.a").contains("is not a subsystem NQN"));
    assert!(text("nvme-tcp:10.9.0.1:4420:1").contains("nqn=<subsystem NQN>"));
    assert!(
        text("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.a,part=0").contains("part=0"),
        "{}",
        text("nvme-tcp:10.9.0.1:4420:1:nqn=nqn.a,part=0")
    );
    assert_eq!(
        Backing::NvmeTcp {
            region: Region::Whole
        }
        .device(),
        None
    );
}
