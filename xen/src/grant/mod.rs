// SPDX-License-Identifier: MIT OR Apache-2.0
//! Grant tables: our own grants (a free list of grant refs over the v1 entry table) and
//! batched map / unmap / copy of other domains' grants with every status checked.
//!
//! * `table.rs`: our own grant table ([`GrantTable`], [`map_own_table`]).
//! * `batch.rs`: foreign map / unmap / copy batches ([`map_batch`], [`unmap_batch`],
//!   [`copy_batch`]) and what their statuses say.
//! * `area.rs`: the guest-physical pages foreign grants are mapped at
//!   ([`GrantMapArea`]).
//! * `foreign.rs`: [`ForeignGrants`], a result per entry over such an area.
//! * `counted.rs`: [`CountedGrants`], a hypervisor that counts what is mapped.
//! * `free_list.rs`: [`IndexFreeList`], under the table's refs and the area's pages.

mod area;
mod batch;
mod counted;
mod foreign;
mod free_list;
mod table;

pub use area::GrantMapArea;
pub use batch::{
    copy_batch, copy_request, map_batch, map_entries, map_request, unmap_batch, unmap_request,
    BatchError, BatchFault, CopySide, GrantStatus, MapError, EAGAIN_RETRIES, INVALID_HANDLE,
};
pub use counted::CountedGrants;
pub use foreign::{ForeignGrants, ForeignMapping};
pub use free_list::{FreeError, IndexFreeList};
pub use table::{map_own_table, GrantError, GrantTable};
