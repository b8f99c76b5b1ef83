//! The domain's budget of persistent grants (`blkback::budget`), set from the command
//! line (`grants.*`) and owned by the control path: rings join when they connect with
//! persistent grants and leave once released. The lock here is taken on vCPU 0 only, at
//! connect and disconnect; pollers read their ring's cap from its `GrantShare` (an
//! atomic) and never touch it.

use blkback::budget::{GrantBudget, GrantLimits, GrantShare};

static BUDGET: spin::Mutex<GrantBudget> = spin::Mutex::new(GrantBudget::new(GrantLimits::DEFAULT));

/// The limits from the command line (at boot, before any ring connects).
pub fn configure(limits: GrantLimits) {
    BUDGET.lock().set_limits(limits);
}

pub fn limits() -> GrantLimits {
    BUDGET.lock().limits()
}

/// A connecting ring's share; every other ring's cap drops, and their pollers are
/// woken so that they evict down to it now rather than at their next event.
pub fn join() -> GrantShare {
    let share = BUDGET.lock().join();
    super::poller::ring_all_doorbells();
    share
}

/// A released ring's grants are unmapped: the others may cache more.
pub fn leave(share: &GrantShare) {
    BUDGET.lock().leave(share);
}

/// For the pollers' statistics line: the limits, the rings caching grants, each one's cap.
pub fn summary() -> (GrantLimits, usize, u32) {
    let budget = BUDGET.lock();
    (budget.limits(), budget.rings(), budget.share())
}
