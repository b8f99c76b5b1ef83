// SPDX-License-Identifier: MIT OR Apache-2.0
//! Per-CPU GDT and TSS. The TSS carries the interrupt stacks (IST) that the double-fault,
//! NMI and machine-check gates switch to, so a blown kernel stack still gets reported.

use x86_64::instructions::segmentation::{Segment, CS, DS, ES, SS};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;
use x86_64::VirtAddr;

/// IST slots (1-based in the IDT, 0-based in the TSS array).
pub const IST_DOUBLE_FAULT: u16 = 1;
pub const IST_NMI: u16 = 2;
pub const IST_MACHINE_CHECK: u16 = 3;
pub const IST_STACK_SIZE: usize = 16 * 1024;

/// Stack memory the CPU itself writes on an IST switch; Rust code never reads it.
pub type IstStacks = [[u8; IST_STACK_SIZE]; 3];

pub struct Selectors {
    pub code: SegmentSelector,
    pub data: SegmentSelector,
    pub tss: SegmentSelector,
}

/// A TSS whose IST entries point at the tops of the three stacks at `stacks`.
pub fn new_tss(stacks: *const IstStacks) -> TaskStateSegment {
    let mut tss = TaskStateSegment::new();
    let base = VirtAddr::from_ptr(stacks);
    for (i, slot) in [IST_DOUBLE_FAULT, IST_NMI, IST_MACHINE_CHECK]
        .into_iter()
        .enumerate()
    {
        // Stacks grow down: each IST entry is the end of its 16-byte aligned stack.
        let top = base + ((i + 1) * IST_STACK_SIZE) as u64;
        tss.interrupt_stack_table[usize::from(slot - 1)] = top.align_down(16u64);
    }
    tss
}

pub fn new_gdt(tss: &'static TaskStateSegment) -> (GlobalDescriptorTable, Selectors) {
    let mut gdt = GlobalDescriptorTable::new();
    let code = gdt.append(Descriptor::kernel_code_segment());
    let data = gdt.append(Descriptor::kernel_data_segment());
    let tss = gdt.append(Descriptor::tss_segment(tss));
    (gdt, Selectors { code, data, tss })
}

/// Loads `gdt` on this CPU and reloads every segment register and the task register.
pub fn load(gdt: &'static GlobalDescriptorTable, selectors: &Selectors) {
    gdt.load();
    // SAFETY: the selectors index descriptors of the GDT just loaded (flat 64-bit code,
    // flat data, and a TSS that lives for the program's lifetime).
    unsafe {
        CS::set_reg(selectors.code);
        SS::set_reg(selectors.data);
        DS::set_reg(selectors.data);
        ES::set_reg(selectors.data);
        load_tss(selectors.tss);
    }
}

static mut BSP_IST_STACKS: IstStacks = [[0; IST_STACK_SIZE]; 3];
static BSP_TSS: spin::Once<TaskStateSegment> = spin::Once::new();
static BSP_GDT: spin::Once<(GlobalDescriptorTable, Selectors)> = spin::Once::new();

/// GDT and TSS of the boot CPU, from static storage (it runs before the heap exists).
pub fn init_boot_cpu() {
    let tss = BSP_TSS.call_once(|| new_tss(&raw const BSP_IST_STACKS));
    let (gdt, selectors) = BSP_GDT.call_once(|| new_gdt(tss));
    load(gdt, selectors);
}
