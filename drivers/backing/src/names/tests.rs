// SPDX-License-Identifier: MIT OR Apache-2.0
use super::*;
use crate::spec::{parse_backing, Backing, Region, SpecError};
use alloc::string::ToString;

fn pci(bus: u8, device: u8, function: u8) -> PciAddress {
    PciAddress {
        bus,
        device,
        function,
    }
}

fn nvme(text: &str) -> Result<(NvmeName, Region), SpecError<'_>> {
    match parse_backing(text)? {
        Backing::Nvme { name, region } => Ok((name, region)),
        other => panic!("{text}: {other:?}"),
    }
}

fn virtio(text: &str) -> Result<(VirtioName, Region), SpecError<'_>> {
    match parse_backing(text)? {
        Backing::Virtio { name, region } => Ok((name, region)),
        other => panic!("{text}: {other:?}"),
    }
}

fn serial(text: &str) -> Serial {
    Serial::new(text).unwrap()
}

const NGUID: [u8; 16] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
];
const EUI64: [u8; 8] = [0x00, 0x25, 0x38, 0xb1, 0x71, 0x00, 0x00, 0x2a];

#[test]
fn stable_nvme_names_parse() {
    assert_eq!(
        nvme("nvme:serial=S3EVNX0K:1"),
        Ok((
            NvmeName::Serial {
                serial: serial("S3EVNX0K"),
                nsid: 1
            },
            Region::Whole
        ))
    );
    assert_eq!(
        nvme("nvme:serial=a-b_c.d/e+f=g:2:part=3"),
        Ok((
            NvmeName::Serial {
                serial: serial("a-b_c.d/e+f=g"),
                nsid: 2
            },
            Region::Partition(3)
        ))
    );
    assert_eq!(
        nvme("nvme:nguid=0123456789ABCDEF0011223344556677"),
        Ok((NvmeName::Nguid(NGUID), Region::Whole))
    );
    // Linux's sysfs prints an NGUID as 8-4-4-4-12.
    assert_eq!(
        nvme("nvme:nguid=01234567-89ab-cdef-0011-223344556677:offset=1M,size=4M"),
        Ok((
            NvmeName::Nguid(NGUID),
            Region::Extent {
                offset: 1 << 20,
                size: 4 << 20
            }
        ))
    );
    assert_eq!(
        nvme("nvme:eui64=002538b17100002a:part=name:data"),
        Ok((
            NvmeName::Eui64(EUI64),
            Region::PartitionNamed(crate::PartName::new("data").unwrap())
        ))
    );
    assert_eq!(
        nvme("nvme@00:04.0:1"),
        Ok((
            NvmeName::Pci {
                address: pci(0, 4, 0),
                nsid: 1
            },
            Region::Whole
        ))
    );
    assert_eq!(
        nvme("nvme@ff:1F.7:4294967295:part=1"),
        Ok((
            NvmeName::Pci {
                address: pci(0xff, 0x1f, 7),
                nsid: u32::MAX
            },
            Region::Partition(1)
        ))
    );
    assert_eq!(
        nvme("nvme:7"),
        Ok((NvmeName::First { nsid: 7 }, Region::Whole))
    );
}

#[test]
fn stable_virtio_names_parse() {
    assert_eq!(
        virtio("virtio:serial=disk-a"),
        Ok((VirtioName::Serial(serial("disk-a")), Region::Whole))
    );
    assert_eq!(
        virtio("virtio:serial=12345678901234567890:part=2"),
        Ok((
            VirtioName::Serial(serial("12345678901234567890")),
            Region::Partition(2)
        ))
    );
    assert_eq!(
        virtio("virtio@00:05.0"),
        Ok((VirtioName::Pci(pci(0, 5, 0)), Region::Whole))
    );
    assert_eq!(
        virtio("virtio@1:2.3:offset=0,size=1M"),
        Ok((
            VirtioName::Pci(pci(1, 2, 3)),
            Region::Extent {
                offset: 0,
                size: 1 << 20
            }
        ))
    );
    assert_eq!(
        virtio("virtio:2"),
        Ok((VirtioName::Index(2), Region::Whole))
    );
}

#[test]
fn stable_names_print_as_they_parse() {
    for text in [
        "nvme:serial=SN-1:1",
        "nvme:serial=SN-1:2:part=3",
        "nvme:nguid=0123456789abcdef0011223344556677",
        "nvme:nguid=0123456789abcdef0011223344556677:offset=4K,size=1M",
        "nvme:eui64=002538b17100002a:part=name:a b",
        "nvme@00:04.0:1",
        "nvme@0a:1f.7:3:part=1",
        "virtio:serial=vd-b",
        "virtio:serial=vd-b:part=2",
        "virtio@00:05.0",
        "virtio@00:05.0:offset=0,size=512",
    ] {
        let backing = parse_backing(text).unwrap();
        assert_eq!(backing.to_string(), text);
        assert_eq!(parse_backing(&backing.to_string()), Ok(backing));
    }
    // Upper case and dashes come back in the one canonical spelling.
    assert_eq!(
        parse_backing("nvme:eui64=0025-38B1-7100-002A")
            .unwrap()
            .to_string(),
        "nvme:eui64=002538b17100002a"
    );
}

#[test]
fn bad_stable_names_say_what_is_wrong() {
    let too_long = "nvme:serial=123456789012345678901:1";
    assert_eq!(
        parse_backing(too_long),
        Err(SpecError::BadSerial("nvme", &too_long[12..33]))
    );
    for (text, want) in [
        ("nvme:serial=:1", SpecError::BadSerial("nvme", "")),
        ("nvme:serial=a b:1", SpecError::BadSerial("nvme", "a b")),
        ("nvme:serial=a,b:1", SpecError::BadSerial("nvme", "a,b")),
        (
            "nvme:serial=\u{e9}:1",
            SpecError::BadSerial("nvme", "\u{e9}"),
        ),
        ("nvme:serial=\t:1", SpecError::BadSerial("nvme", "\t")),
        ("virtio:serial=", SpecError::BadSerial("virtio", "")),
        (
            "virtio:serial=a\u{7f}",
            SpecError::BadSerial("virtio", "a\u{7f}"),
        ),
        (
            "virtio:serial=123456789012345678901",
            SpecError::BadSerial("virtio", "123456789012345678901"),
        ),
        (
            "nvme:serial=SN",
            SpecError::MissingNamespace("nvme:serial=<SN>"),
        ),
        (
            "nvme:serial=SN:",
            SpecError::MissingNamespace("nvme:serial=<SN>"),
        ),
        ("nvme:serial=SN:0", SpecError::ZeroNamespace),
        ("nvme:serial=SN:x", SpecError::BadNumber("nvme", "x")),
        ("nvme:serial=SN:1:", SpecError::NoSlice("nvme")),
        ("nvme:nguid=0123", SpecError::BadNguid("0123")),
        (
            "nvme:nguid=0123456789abcdef00112233445566778",
            SpecError::BadNguid("0123456789abcdef00112233445566778"),
        ),
        (
            "nvme:nguid=0123456789abcdef001122334455667g",
            SpecError::BadNguid("0123456789abcdef001122334455667g"),
        ),
        (
            "nvme:nguid=00000000000000000000000000000000",
            SpecError::BadNguid("00000000000000000000000000000000"),
        ),
        (
            "nvme:nguid=-0123456789abcdef0011223344556677",
            SpecError::BadNguid("-0123456789abcdef0011223344556677"),
        ),
        (
            "nvme:nguid=01234567--89abcdef0011223344556677",
            SpecError::BadNguid("01234567--89abcdef0011223344556677"),
        ),
        ("nvme:nguid=", SpecError::BadNguid("")),
        (
            "nvme:eui64=0000000000000000",
            SpecError::BadEui64("0000000000000000"),
        ),
        (
            "nvme:eui64=002538b17100002",
            SpecError::BadEui64("002538b17100002"),
        ),
        (
            "nvme:eui64=+02538b17100002a",
            SpecError::BadEui64("+02538b17100002a"),
        ),
        ("nvme:eui64=002538b17100002a:", SpecError::NoSlice("nvme")),
        (
            "nvme@00:04.0",
            SpecError::MissingNamespace("nvme@<bb:dd.f>"),
        ),
        (
            "nvme@00:04.0:",
            SpecError::MissingNamespace("nvme@<bb:dd.f>"),
        ),
        ("nvme@00:04.0:0", SpecError::ZeroNamespace),
        (
            "nvme@00:20.0:1",
            SpecError::BadPciAddress("nvme", "00:20.0"),
        ),
        (
            "nvme@00:04.8:1",
            SpecError::BadPciAddress("nvme", "00:04.8"),
        ),
        (
            "nvme@00:04.00:1",
            SpecError::BadPciAddress("nvme", "00:04.00"),
        ),
        (
            "nvme@100:04.0:1",
            SpecError::BadPciAddress("nvme", "100:04.0"),
        ),
        ("nvme@00:04:1", SpecError::BadPciAddress("nvme", "00:04")),
        (
            "nvme@0004.0:1",
            SpecError::BadPciAddress("nvme", "0004.0:1"),
        ),
        ("nvme@:04.0:1", SpecError::BadPciAddress("nvme", ":04.0")),
        ("nvme@00:.0:1", SpecError::BadPciAddress("nvme", "00:.0")),
        (
            "nvme@0g:04.0:1",
            SpecError::BadPciAddress("nvme", "0g:04.0"),
        ),
        ("nvme@", SpecError::BadPciAddress("nvme", "")),
        ("virtio@00:05.0:", SpecError::NoSlice("virtio")),
        ("virtio@00:05", SpecError::BadPciAddress("virtio", "00:05")),
        ("virtio@00:05.0:1", SpecError::UnknownOption("virtio", "1")),
        ("nvme:wwid=1", SpecError::UnknownName("nvme", "wwid")),
        ("virtio:id=x", SpecError::UnknownName("virtio", "id")),
    ] {
        assert_eq!(parse_backing(text), Err(want), "{text}");
    }
    let text = |t: &str| parse_backing(t).unwrap_err().to_string();
    assert!(text("nvme:serial=a b:1").contains("1 to 20 printable ASCII"));
    assert!(text("nvme:nguid=1").contains("32 hex digits"));
    assert!(text("nvme:eui64=1").contains("16 hex digits"));
    assert!(text("nvme@1:2:1").contains("bb:dd.f"));
    assert!(text("nvme:serial=x").contains("needs :<nsid>"));
    assert!(text("nvme:wwid=1").contains("nvme:serial=<SN>:<nsid>"));
}

#[test]
fn device_serials_are_read_as_names_compare_them() {
    let mut raw = [b' '; 20];
    raw[..6].copy_from_slice(b"SN-001");
    assert_eq!(nvme_serial(&raw), Some("SN-001"));
    // Right-justified (some drives) and NUL padded.
    let mut raw = [b' '; 20];
    raw[14..].copy_from_slice(b"SN-002");
    assert_eq!(nvme_serial(&raw), Some("SN-002"));
    let mut raw = [0u8; 20];
    raw[..4].copy_from_slice(b"abcd");
    assert_eq!(nvme_serial(&raw), Some("abcd"));
    assert_eq!(nvme_serial(&[b'x'; 20]), Some("xxxxxxxxxxxxxxxxxxxx"));
    assert_eq!(nvme_serial(&[b' '; 20]), None);
    let mut raw = [b' '; 20];
    raw[..3].copy_from_slice(b"a:b");
    assert_eq!(nvme_serial(&raw), None);
    raw[..3].copy_from_slice(&[0xff, b'a', b'b']);
    assert_eq!(nvme_serial(&raw), None);

    let mut raw = [0u8; 20];
    raw[..5].copy_from_slice(b"vd-b1");
    assert_eq!(virtio_serial(&raw), Some("vd-b1"));
    assert_eq!(virtio_serial(&[b'7'; 20]), Some("77777777777777777777"));
    assert_eq!(virtio_serial(&[0; 20]), None);
    // What follows the first NUL is not the id.
    raw[7] = b'z';
    assert_eq!(virtio_serial(&raw), Some("vd-b1"));
    raw[..5].copy_from_slice(b"vd b1");
    assert_eq!(virtio_serial(&raw), None);
}

const A: PciAddress = PciAddress {
    bus: 0,
    device: 4,
    function: 0,
};
const B: PciAddress = PciAddress {
    bus: 0,
    device: 5,
    function: 0,
};
const C: PciAddress = PciAddress {
    bus: 1,
    device: 0,
    function: 0,
};

fn ns(nsid: u32, nguid: u8, eui: u8) -> NamespaceIds {
    NamespaceIds {
        nsid,
        nguid: [nguid; 16],
        eui64: [eui; 8],
    }
}

#[test]
fn nvme_names_reach_their_controller_wherever_it_sits() {
    let a_ns = [ns(1, 0xa1, 0xe1), ns(2, 0, 0)];
    let b_ns = [ns(1, 0xb1, 0xf1), ns(3, 0xb3, 0)];
    let controllers = [
        ControllerIds {
            address: A,
            serial: Some("SN-A"),
            namespaces: &a_ns,
        },
        ControllerIds {
            address: B,
            serial: Some("SN-B"),
            namespaces: &b_ns,
        },
    ];
    let reordered = [controllers[1], controllers[0]];
    for bus in [&controllers[..], &reordered[..]] {
        let by_serial = |s: &str, nsid| {
            resolve_nvme(
                &NvmeName::Serial {
                    serial: serial(s),
                    nsid,
                },
                bus,
            )
        };
        assert_eq!(by_serial("SN-A", 1), Ok((A, 1)));
        assert_eq!(by_serial("SN-B", 7), Ok((B, 7)));
        assert_eq!(resolve_nvme(&NvmeName::Nguid([0xb3; 16]), bus), Ok((B, 3)));
        assert_eq!(resolve_nvme(&NvmeName::Nguid([0xa1; 16]), bus), Ok((A, 1)));
        assert_eq!(resolve_nvme(&NvmeName::Eui64([0xf1; 8]), bus), Ok((B, 1)));
        assert_eq!(resolve_nvme(&NvmeName::Eui64([0xe1; 8]), bus), Ok((A, 1)));
        let at = |address, nsid| NvmeName::Pci { address, nsid };
        assert_eq!(resolve_nvme(&at(B, 2), bus), Ok((B, 2)));
        assert_eq!(resolve_nvme(&at(A, 1), bus), Ok((A, 1)));
        assert_eq!(
            resolve_nvme(&at(C, 1), bus),
            Err(NameError::NotAt {
                kind: NVME,
                address: C
            })
        );
        assert_eq!(
            by_serial("SN-C", 1),
            Err(NameError::NoMatch {
                kind: NVME,
                found: 2,
                unidentified: 0
            })
        );
        // Matches are exact: no prefixes, case counts.
        let none = Err(NameError::NoMatch {
            kind: NVME,
            found: 2,
            unidentified: 0,
        });
        assert_eq!(by_serial("SN-", 1), none);
        assert_eq!(by_serial("sn-a", 1), none);
        assert!(resolve_nvme(&NvmeName::Nguid([0xe1; 16]), bus).is_err());
        assert!(resolve_nvme(&NvmeName::Eui64([0xa1; 8]), bus).is_err());
    }
    // The positional form follows the bus order: another controller when it changes.
    let first = NvmeName::First { nsid: 1 };
    assert_eq!(resolve_nvme(&first, &controllers), Ok((A, 1)));
    assert_eq!(resolve_nvme(&first, &reordered), Ok((B, 1)));
    assert_eq!(
        resolve_nvme(&first, &[]),
        Err(NameError::NoneOnBus {
            kind: NVME,
            found: 0
        })
    );
    assert!(first.positional());
    assert!(!NvmeName::Nguid(NGUID).positional());
}

#[test]
fn a_name_two_devices_answer_to_is_refused() {
    let shared = [ns(1, 0xaa, 0xee)];
    let other = [ns(1, 0xbb, 0xff), ns(2, 0xaa, 0x11)];
    let twins = [
        ControllerIds {
            address: A,
            serial: Some("TWIN"),
            namespaces: &shared,
        },
        ControllerIds {
            address: C,
            serial: Some("ONE"),
            namespaces: &[],
        },
        ControllerIds {
            address: B,
            serial: Some("TWIN"),
            namespaces: &other,
        },
    ];
    let ambiguous = |second| {
        Err(NameError::Ambiguous {
            kind: NVME,
            first: A,
            second,
        })
    };
    assert_eq!(
        resolve_nvme(
            &NvmeName::Serial {
                serial: serial("TWIN"),
                nsid: 1
            },
            &twins
        ),
        ambiguous(B)
    );
    // A namespace reached through two controllers (one NGUID twice).
    assert_eq!(
        resolve_nvme(&NvmeName::Nguid([0xaa; 16]), &twins),
        ambiguous(B)
    );
    assert_eq!(
        resolve_nvme(&NvmeName::Eui64([0xee; 8]), &twins),
        Ok((A, 1))
    );
    assert_eq!(
        resolve_nvme(
            &NvmeName::Serial {
                serial: serial("ONE"),
                nsid: 2
            },
            &twins
        ),
        Ok((C, 2))
    );
    let serials = [
        (A, Some("TWIN")),
        (C, Some("ONE")),
        (B, Some("TWIN")),
        (C, None),
        (pci(2, 0, 0), Some("TWIX")),
        (pci(3, 0, 0), None),
    ];
    let duplicates: alloc::vec::Vec<_> = duplicate_serials(&serials).collect();
    assert_eq!(duplicates, [("TWIN", A, B)]);
    let message = NameError::Ambiguous {
        kind: NVME,
        first: A,
        second: B,
    }
    .to_string();
    assert!(message.contains("00:04.0 and 00:05.0"), "{message}");
}

#[test]
fn a_controller_that_was_not_identified_matches_no_stable_name() {
    let namespaces = [ns(1, 0x11, 0x22)];
    let bus = [
        ControllerIds {
            address: A,
            serial: None,
            namespaces: &[],
        },
        ControllerIds {
            address: B,
            serial: Some("SN"),
            namespaces: &namespaces,
        },
    ];
    let no_match = NameError::NoMatch {
        kind: NVME,
        found: 2,
        unidentified: 1,
    };
    let missing = Err(no_match);
    assert_eq!(
        resolve_nvme(
            &NvmeName::Serial {
                serial: serial("X"),
                nsid: 1
            },
            &bus
        ),
        missing
    );
    assert_eq!(resolve_nvme(&NvmeName::Nguid([0x33; 16]), &bus), missing);
    // An absent (all-zero) id is never matched: the grammar refuses zeros, and a
    // namespace without one does not answer to it.
    let zero = [ns(1, 0, 0)];
    let bus = [ControllerIds {
        address: A,
        serial: Some("SN"),
        namespaces: &zero,
    }];
    assert!(resolve_nvme(&NvmeName::Nguid([0; 16]), &bus).is_err());
    assert!(resolve_nvme(&NvmeName::Eui64([0; 8]), &bus).is_err());
    // The positional and PCI forms still reach it (its open says whether it works).
    assert_eq!(resolve_nvme(&NvmeName::First { nsid: 1 }, &bus), Ok((A, 1)));
    let message = no_match.to_string();
    assert!(
        message.contains("1 of them could not be identified"),
        "{message}"
    );
    assert!(message.contains("blkdom-stat"), "{message}");
}

#[test]
fn virtio_names_reach_their_device_wherever_it_sits() {
    let devices = [
        VirtioIds {
            address: A,
            serial: Some("vd-a"),
        },
        VirtioIds {
            address: B,
            serial: None,
        },
        VirtioIds {
            address: C,
            serial: Some("vd-c"),
        },
    ];
    let reordered = [devices[2], devices[0], devices[1]];
    for bus in [&devices[..], &reordered[..]] {
        let by_serial = |s: &str| resolve_virtio(&VirtioName::Serial(serial(s)), bus);
        assert_eq!(by_serial("vd-a"), Ok(A));
        assert_eq!(by_serial("vd-c"), Ok(C));
        assert_eq!(
            by_serial("vd-b"),
            Err(NameError::NoMatch {
                kind: VIRTIO,
                found: 3,
                unidentified: 1
            })
        );
        assert_eq!(resolve_virtio(&VirtioName::Pci(B), bus), Ok(B));
        assert_eq!(
            resolve_virtio(&VirtioName::Pci(pci(2, 0, 0)), bus),
            Err(NameError::NotAt {
                kind: VIRTIO,
                address: pci(2, 0, 0)
            })
        );
    }
    assert_eq!(resolve_virtio(&VirtioName::Index(2), &devices), Ok(C));
    assert_eq!(resolve_virtio(&VirtioName::Index(2), &reordered), Ok(B));
    assert_eq!(
        resolve_virtio(&VirtioName::Index(3), &devices),
        Err(NameError::NoneOnBus {
            kind: VIRTIO,
            found: 3
        })
    );
    let twins = [
        VirtioIds {
            address: A,
            serial: Some("same"),
        },
        VirtioIds {
            address: B,
            serial: Some("same"),
        },
    ];
    assert_eq!(
        resolve_virtio(&VirtioName::Serial(serial("same")), &twins),
        Err(NameError::Ambiguous {
            kind: VIRTIO,
            first: A,
            second: B
        })
    );
}

#[test]
fn hex_ids_and_addresses() {
    assert_eq!(parse_hex_id::<2>("0a0B"), Some([0x0a, 0x0b]));
    assert_eq!(parse_hex_id::<2>("0a-0b"), Some([0x0a, 0x0b]));
    assert_eq!(parse_hex_id::<2>("0a0"), None);
    assert_eq!(parse_hex_id::<2>("0a0b0"), None);
    assert_eq!(parse_hex_id::<2>("0a0b-"), None);
    assert_eq!(parse_hex_id::<2>("0000"), None);
    assert_eq!(parse_hex_id::<2>("0x0b"), None);
    assert_eq!(Hex(&[0xde, 0xad, 0x01]).to_string(), "dead01");
    assert_eq!(parse_pci_address("00:1f.7"), Some(pci(0, 0x1f, 7)));
    assert_eq!(parse_pci_address("ab:0.1"), Some(pci(0xab, 0, 1)));
    for address in [A, B, C, pci(0xff, 0x1f, 7)] {
        assert_eq!(parse_pci_address(&address.to_string()), Some(address));
    }
    for bad in [
        "", "00:1f", "00.1f.7", "00:1f.", "0:0:0.0", "00:1f.7 ", "-1:0.0", "+1:0.0",
    ] {
        assert_eq!(parse_pci_address(bad), None, "{bad}");
    }
}
