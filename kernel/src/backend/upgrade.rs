// SPDX-License-Identifier: MIT OR Apache-2.0
//! A live upgrade's request, received on the control path (docs/design.md §4.12, 1-2):
//! the request node taken only from the toolstack, the index and image pages dom0
//! granted mapped read-only in batches into a map region, copied once, unmapped, and
//! the copy checked. The answer goes to `data/blkdom-upgrade` and the console. A good
//! image goes on to the drain (`control/upgrade.rs`). The decisions are
//! `handover::receive`'s; here are the hypercalls and the copies.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use blkback::keys::{UPGRADE, UPGRADE_ANSWER};
use handover::block::HANDOVER_VERSION;
use handover::receive::{accept, image_refs, Answer, Refusal, Staging, PAGE};
use handover::request::Perm;
use xen::abi::grant_table::RawGrantStatus;
use xen::grant::{ForeignGrants, ForeignMapping, GrantMapArea};
use xen::xenstore::{Access, Transaction};

use super::{adapters, space};
use crate::xen_domain;
use crate::xen_domain::store::Client;

/// The toolstack's domain: the only one whose grants an upgrade maps.
const DOM0: u16 = 0;

/// Answers on a client the caller holds (inside `xen_domain::store::with`, where
/// [`tell`] would find the client taken).
pub fn answer(xs: &mut Client, answer: &Answer) {
    match answer {
        Answer::Refused(_) => log::error!("upgrade: {answer}"),
        _ => log::info!("upgrade: {answer}"),
    }
    let text = format!("{answer}");
    if let Err(e) = xs.write(Transaction::NONE, UPGRADE_ANSWER, text.as_bytes()) {
        log::warn!("upgrade: {UPGRADE_ANSWER} not written: {e:?}");
    }
}

/// An image received and checked: the drain may begin.
pub struct Staged {
    /// The image's bytes, in blkdom's own memory.
    pub bytes: Vec<u8>,
    pub image: handover::image::CheckedImage,
}

/// Answers `answer` (the console and `data/blkdom-upgrade`).
pub fn tell(answer_: &Answer) {
    xen_domain::store::with(|xs| answer(xs, answer_));
}

/// Looks at the request node (its watch fired): nothing when it is empty or gone,
/// otherwise the image is received and checked: refused (answered), or staged for the
/// drain (`Draining` answered).
pub fn on_request(xs: &mut Client) -> Option<Staged> {
    let value = xs.read_string(Transaction::NONE, UPGRADE).ok();
    // The request this image was started by stays until dom0's tool reads `done` and
    // removes it; its watch fires at once when the new image watches it.
    if crate::handoff::is_served_request(value.as_deref()) {
        return None;
    }
    let perms: Vec<Perm> = match xs.get_perms(Transaction::NONE, UPGRADE) {
        Ok(perms) => perms
            .iter()
            .map(|p| Perm {
                domid: p.domid,
                read: matches!(p.access, Access::Read | Access::Both),
                write: matches!(p.access, Access::Write | Access::Both),
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let request = match accept(value.as_deref(), &perms) {
        Ok(None) => return None,
        Ok(Some(request)) => request,
        Err(refusal) => {
            answer(xs, &Answer::Refused(refusal));
            return None;
        }
    };
    answer(xs, &Answer::Checking);
    let outcome = receive(request).and_then(|staging| {
        answer(xs, &Answer::Copied);
        staging.check(HANDOVER_VERSION)
    });
    match outcome {
        Ok((bytes, image)) => {
            answer(xs, &Answer::Draining);
            Some(Staged { bytes, image })
        }
        Err(refusal) => {
            answer(xs, &Answer::Refused(refusal));
            None
        }
    }
}

/// Maps dom0's grants into one map region, `CHUNK` at a time, and gives it back.
struct Dom0Pages {
    hv: adapters::GrantHypervisor,
    grants: ForeignGrants,
    region: space::MapRegion,
}

impl Dom0Pages {
    fn new() -> Result<Self, Refusal> {
        let xen = xen_domain::get().ok_or(Refusal::Index("no Xen"))?;
        let region = space::alloc().ok_or(Refusal::Index("no map region free"))?;
        Ok(Self {
            hv: adapters::grant_hypervisor(xen.hv),
            grants: ForeignGrants::new(
                DOM0,
                GrantMapArea::new(region.grant_base >> 12, region.grant_pages),
            ),
            region,
        })
    }

    /// Maps `refs` read-only, calls `each(i, gpa)` for every page, and unmaps them:
    /// `ForeignGrants::CHUNK` at a time. A grant that does not map refuses the upgrade.
    fn copy(
        &mut self,
        refs: &[u32],
        mut each: impl FnMut(usize, u64) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        for (chunk_index, chunk) in refs.chunks(ForeignGrants::CHUNK).enumerate() {
            let first = chunk_index * ForeignGrants::CHUNK;
            let mut mapped: Vec<Option<ForeignMapping>> = vec![None; chunk.len()];
            let mut failed: Option<(u32, RawGrantStatus)> = None;
            self.grants.map(
                &self.hv,
                chunk.len(),
                |i| (chunk[i], true),
                |i, result| match result {
                    Ok(mapping) => mapped[i] = Some(mapping),
                    Err(status) => {
                        failed.get_or_insert((chunk[i], status));
                    }
                },
            );
            let result = match failed {
                Some(_) => Err(Refusal::Index("a grant of dom0's that does not map")),
                None => mapped
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, m)| each(first + i, m.map_or(0, |m| m.gpa))),
            };
            if let Some((gref, status)) = failed {
                log::error!("upgrade: dom0's grant {gref} did not map: status {status}");
            }
            let held: Vec<ForeignMapping> = mapped.iter().flatten().copied().collect();
            self.grants
                .unmap(&self.hv, held.len(), |i| held[i], |_, _| {});
            result?;
        }
        Ok(())
    }
}

impl Drop for Dom0Pages {
    fn drop(&mut self) {
        // A page whose unmap failed retires the region.
        space::release(self.region, self.grants.leaked_pages());
    }
}

/// The image the request names, copied out of dom0's grants into blkdom's memory.
fn receive(request: handover::request::Request) -> Result<Staging, Refusal> {
    let mut pages = Dom0Pages::new()?;
    let mut index = vec![0u8; request.index.len() * PAGE];
    pages.copy(&request.index, |i, gpa| {
        // SAFETY: `gpa` is a page of dom0's just mapped (read-only) in our map region,
        // identity mapped; it is read, not referenced, and unmapped after.
        unsafe { crate::physmem::read(gpa, &mut index[i * PAGE..(i + 1) * PAGE]) };
        Ok(())
    })?;
    let refs = image_refs(&index, &request)?;
    let mut staging = Staging::new(request)?;
    pages.copy(&refs, |i, gpa| {
        let page = staging
            .page_mut(i)
            .ok_or(Refusal::Index("more pages than the image"))?;
        // SAFETY: as above; each page is copied once, into the staging copy.
        unsafe { crate::physmem::read(gpa, page) };
        Ok(())
    })?;
    Ok(staging)
}
