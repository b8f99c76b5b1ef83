// SPDX-License-Identifier: MIT OR Apache-2.0
//! A ring's engine takes its memory from the heap's room for disks and rings
//! (`blkdev::HeapBudget`), as the kernel connects rings: never the control path's
//! reserve. RAM disks' stripes live apart (the budget's stripe arena): what a discarded
//! disk will want back is promised there, and the heap's room does not move.

use core::sync::atomic::{AtomicUsize, Ordering};

use blkdev::{BlockDevice, HeapBudget, IoOp, IoRequest, RamDisk, StripeArena};

use crate::engine::{Engine, EngineConfig, EngineError};
use crate::fake::{CountingEvents, GrantTable, GuestMemory, RingView, XenGrants};

const RESERVE: u64 = 4 << 20;
const STRIPE: u64 = 64 * 1024;

/// The free heap this test's budget sees.
static FREE: AtomicUsize = AtomicUsize::new(0);

fn free() -> usize {
    FREE.load(Ordering::SeqCst)
}

static STRIPES: StripeArena = StripeArena::new();

static HEAP: HeapBudget = HeapBudget::new(RESERVE, free, &STRIPES);

#[test]
fn a_ring_that_would_eat_into_the_reserve_is_refused_and_stripes_are_apart() {
    let config = EngineConfig::new(2, true);
    let needed = config.memory_needed();
    let disk = RamDisk::new(2048);
    // As the kernel connects a ring: the engine within the room for rings.
    let connect = || {
        let memory = GuestMemory::new(4);
        Engine::new_within(
            RingView::new(memory.clone(), (0..4).collect()),
            XenGrants(GrantTable::new(memory)),
            disk.queue(128),
            CountingEvents::default(),
            config,
            usize::try_from(HEAP.room()).unwrap(),
        )
        .map(drop)
        .map_err(|refused| refused.error)
    };
    let refused = Err(EngineError::OutOfMemory { slots: 128, needed });
    // One byte short of its memory and the reserve.
    FREE.store(RESERVE as usize + needed - 1, Ordering::SeqCst);
    assert_eq!(connect(), refused);
    FREE.store(RESERVE as usize + needed, Ordering::SeqCst);
    assert_eq!(connect(), Ok(()));

    // A RAM disk whose guest discarded it: 32 of its stripes went back to the arena
    // (16 are kept spare), free there, and promised to it: in the arena, so the heap's
    // room for rings is what it was.
    let stripes = 48;
    let region = vec![0u8; (stripes as usize + 1) * STRIPE as usize].leak();
    assert!(STRIPES.add(region) >= stripes * STRIPE);
    let ram = RamDisk::try_new(RamDisk::plain(stripes * 128), 0, None, Some(&HEAP)).unwrap();
    assert_eq!(HEAP.stripe_room(), 0, "the disk took every stripe");
    let mut queue = ram.queue(8);
    let discard = IoRequest {
        tag: 1,
        op: IoOp::Discard { secure: false },
        sector: 0,
        nr_sectors: stripes * 128,
        preflush: false,
        segments: &[],
    };
    let no_pages = XenGrants(GrantTable::new(GuestMemory::new(1)));
    queue.submit(&discard, &no_pages).unwrap();
    while queue.poll_completions(&mut |_| {}) == 0 {}
    while ram.maintain().more {}
    assert_eq!(HEAP.promised(), 32 * STRIPE);
    assert_eq!(HEAP.stripe_room(), 0, "free in the arena, but promised");
    FREE.store(RESERVE as usize + needed - 1, Ordering::SeqCst);
    assert_eq!(connect(), refused);
    FREE.store(RESERVE as usize + needed, Ordering::SeqCst);
    assert_eq!(connect(), Ok(()));
}
