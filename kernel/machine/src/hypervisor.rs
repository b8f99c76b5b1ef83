// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which hypervisor runs us, from the CPUID leaves 0x40000000 + k·0x100.
//!
//! Xen moves its leaves to 0x40000100 when it also offers Viridian (Hyper-V) leaves, so
//! the kernel scans the range and reports the first signature it knows, preferring Xen.

/// CPUID leaves where hypervisors publish a signature: 0x40000000, 0x40000100, ...
pub const HYPERVISOR_LEAF_BASE: u32 = 0x4000_0000;
pub const HYPERVISOR_LEAF_STEP: u32 = 0x100;
pub const HYPERVISOR_LEAF_COUNT: u32 = 0x100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hypervisor {
    /// Xen, with its base leaf (0x40000000 or 0x40000100 ...) and that leaf's max leaf.
    Xen {
        base_leaf: u32,
        max_leaf: u32,
    },
    Kvm,
    QemuTcg,
    HyperV,
    Other([u8; 12]),
    /// No hypervisor leaves (or the CPUID hypervisor bit is clear).
    None,
}

impl Hypervisor {
    pub fn name(&self) -> &'static str {
        match self {
            Hypervisor::Xen { .. } => "Xen",
            Hypervisor::Kvm => "KVM",
            Hypervisor::QemuTcg => "QEMU TCG",
            Hypervisor::HyperV => "Hyper-V",
            Hypervisor::Other(_) => "unknown hypervisor",
            Hypervisor::None => "none (bare metal or no hypervisor leaves)",
        }
    }

    pub fn is_xen(&self) -> bool {
        matches!(self, Hypervisor::Xen { .. })
    }
}

/// The 12 signature bytes of a hypervisor leaf, in EBX, ECX, EDX order.
pub fn signature(ebx: u32, ecx: u32, edx: u32) -> [u8; 12] {
    let mut sig = [0u8; 12];
    sig[0..4].copy_from_slice(&ebx.to_le_bytes());
    sig[4..8].copy_from_slice(&ecx.to_le_bytes());
    sig[8..12].copy_from_slice(&edx.to_le_bytes());
    sig
}

fn classify_one(leaf: u32, max_leaf: u32, sig: [u8; 12]) -> Option<Hypervisor> {
    match &sig {
        b"XenVMMXenVMM" => Some(Hypervisor::Xen {
            base_leaf: leaf,
            max_leaf,
        }),
        b"KVMKVMKVM\0\0\0" => Some(Hypervisor::Kvm),
        b"TCGTCGTCGTCG" => Some(Hypervisor::QemuTcg),
        b"Microsoft Hv" => Some(Hypervisor::HyperV),
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] => None,
        _ => Some(Hypervisor::Other(sig)),
    }
}

/// Scans the hypervisor leaves through `cpuid(leaf) -> (eax, ebx, ecx, edx)`.
/// `hypervisor_bit` is CPUID.1:ECX[31]; without it the leaves mean nothing.
pub fn detect(
    hypervisor_bit: bool,
    mut cpuid: impl FnMut(u32) -> (u32, u32, u32, u32),
) -> Hypervisor {
    if !hypervisor_bit {
        return Hypervisor::None;
    }
    let mut first_known = None;
    for k in 0..HYPERVISOR_LEAF_COUNT {
        let leaf = HYPERVISOR_LEAF_BASE + k * HYPERVISOR_LEAF_STEP;
        let (eax, ebx, ecx, edx) = cpuid(leaf);
        // A valid base leaf reports a max leaf inside its own 0x100 block.
        if eax < leaf || eax >= leaf + HYPERVISOR_LEAF_STEP {
            continue;
        }
        match classify_one(leaf, eax, signature(ebx, ecx, edx)) {
            Some(found @ Hypervisor::Xen { .. }) => return found,
            Some(other) if first_known.is_none() => first_known = Some(other),
            _ => {}
        }
    }
    first_known.unwrap_or(Hypervisor::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(sig: &[u8; 12]) -> (u32, u32, u32) {
        let word = |i: usize| u32::from_le_bytes([sig[i], sig[i + 1], sig[i + 2], sig[i + 3]]);
        (word(0), word(4), word(8))
    }

    fn fake(leaves: Vec<(u32, u32, [u8; 12])>) -> impl FnMut(u32) -> (u32, u32, u32, u32) {
        move |leaf| {
            leaves
                .iter()
                .find(|(l, _, _)| *l == leaf)
                .map(|(_, max, sig)| {
                    let (b, c, d) = regs(sig);
                    (*max, b, c, d)
                })
                .unwrap_or((0, 0, 0, 0))
        }
    }

    #[test]
    fn finds_xen_at_the_base_leaf() {
        let found = detect(
            true,
            fake(vec![(0x4000_0000, 0x4000_0005, *b"XenVMMXenVMM")]),
        );
        assert_eq!(
            found,
            Hypervisor::Xen {
                base_leaf: 0x4000_0000,
                max_leaf: 0x4000_0005
            }
        );
        assert!(found.is_xen());
    }

    #[test]
    fn prefers_xen_behind_viridian_leaves() {
        let found = detect(
            true,
            fake(vec![
                (0x4000_0000, 0x4000_0006, *b"Microsoft Hv"),
                (0x4000_0100, 0x4000_0105, *b"XenVMMXenVMM"),
            ]),
        );
        assert_eq!(
            found,
            Hypervisor::Xen {
                base_leaf: 0x4000_0100,
                max_leaf: 0x4000_0105
            }
        );
    }

    #[test]
    fn recognises_tcg_kvm_and_unknown() {
        assert_eq!(
            detect(
                true,
                fake(vec![(0x4000_0000, 0x4000_0001, *b"TCGTCGTCGTCG")])
            ),
            Hypervisor::QemuTcg
        );
        assert_eq!(
            detect(
                true,
                fake(vec![(0x4000_0000, 0x4000_0001, *b"KVMKVMKVM\0\0\0")])
            ),
            Hypervisor::Kvm
        );
        assert_eq!(
            detect(
                true,
                fake(vec![(0x4000_0000, 0x4000_0001, *b"SomethingNew")])
            ),
            Hypervisor::Other(*b"SomethingNew")
        );
    }

    #[test]
    fn no_hypervisor_bit_or_no_leaves_means_none() {
        assert_eq!(
            detect(
                false,
                fake(vec![(0x4000_0000, 0x4000_0001, *b"XenVMMXenVMM")])
            ),
            Hypervisor::None
        );
        assert_eq!(detect(true, fake(vec![])), Hypervisor::None);
    }

    #[test]
    fn ignores_leaves_whose_max_leaf_is_outside_their_block() {
        // Some CPUs echo the last basic leaf for unknown leaves: that is no signature.
        assert_eq!(
            detect(
                true,
                fake(vec![(0x4000_0000, 0x0000_000d, *b"XenVMMXenVMM")])
            ),
            Hypervisor::None
        );
    }
}
