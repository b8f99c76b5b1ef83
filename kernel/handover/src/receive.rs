// SPDX-License-Identifier: MIT OR Apache-2.0
//! Receiving an image (docs/design.md §4.12, 1 and 2), as the control path will do it:
//! the request node's value and permissions accepted or refused, the grant references
//! read from the index pages, the granted pages copied once into staging memory, and the
//! staged copy checked. What blkdom answers in `data/blkdom-upgrade` is [`Answer`].
//! The kernel maps and unmaps; everything decided is here.

use alloc::string::String;
use alloc::vec::Vec;

use crate::image::{self, BuildId, CheckedImage, Expected, ImageError};
use crate::request::{self, Perm, Request, RequestError, REFS_PER_INDEX_PAGE};

pub const PAGE: usize = 4096;

/// What blkdom says in `data/blkdom-upgrade`, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A request was read; the image is being copied and checked.
    Checking,
    /// Refused; blkdom goes on serving with the running image.
    Refused(Refusal),
    /// The image is copied: dom0 may end its grants.
    Copied,
    /// Checked; the rings are draining for the switch.
    Draining,
    /// The new image serves (written by it).
    Done(BuildId),
}

impl core::fmt::Display for Answer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Answer::Checking => f.write_str("checking"),
            Answer::Refused(why) => write!(f, "refused: {why}"),
            Answer::Copied => f.write_str("copied"),
            Answer::Draining => f.write_str("draining"),
            Answer::Done(id) => write!(f, "done {id}"),
        }
    }
}

/// Why an upgrade is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request node could have been written by a domain other than the toolstack.
    NotToolstack,
    Request(RequestError),
    /// An index page lists fewer references than the image has pages, a 0, one twice,
    /// or something after the last.
    Index(&'static str),
    /// No memory to stage an image of this size.
    NoMemory(usize),
    Image(ImageError),
    /// The image passed every check, but this blkdom cannot switch to it: the drain,
    /// the handover and the jump are not built yet (docs/design.md §4.12).
    SwitchNotBuilt(BuildId),
    /// The switch could not be made (the reason); nothing was given up.
    Switch(String),
    /// A vbd was negotiating or being torn down past the wait (its backend path).
    Busy(String),
    /// The drain or the handover block failed (the reason); every drained ring was
    /// re-attached.
    Drain(String),
}

impl core::fmt::Display for Refusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Refusal::NotToolstack => {
                f.write_str("the request node is writable by a domain other than dom0")
            }
            Refusal::Request(e) => write!(f, "request: {e}"),
            Refusal::Index(why) => write!(f, "index pages: {why}"),
            Refusal::NoMemory(size) => write!(f, "no memory to stage {size} bytes"),
            Refusal::Image(e) => write!(f, "image: {e}"),
            Refusal::SwitchNotBuilt(id) => write!(
                f,
                "image checked (build {id}), but this blkdom cannot switch images yet"
            ),
            Refusal::Switch(why) => write!(f, "switch: {why}"),
            Refusal::Busy(path) => write!(f, "vbd {path} busy"),
            Refusal::Drain(why) => write!(f, "drain: {why}"),
        }
    }
}

/// The request a new image was started by: its node keeps it until dom0's tool reads
/// `done` and removes it, and the new image's watch on the node fires at once, so it
/// must not be taken again. Only until the node is seen holding anything else: the same
/// text may come back as a new request (the same image, shared in the same grant
/// references, is the usual retry after a refusal).
#[derive(Default)]
pub struct ServedRequest(Option<String>);

impl ServedRequest {
    pub const fn new() -> Self {
        ServedRequest(None)
    }

    /// The request that started this image, as the node holds it when `done` is said.
    pub fn set(&mut self, value: &str) {
        let value = value.trim();
        self.0 = (!value.is_empty()).then(|| value.into());
    }

    /// Whether the node's value now is the served request (to be ignored). Anything
    /// else forgets it.
    pub fn holds(&mut self, value: Option<&str>) -> bool {
        let value = value.map(str::trim).filter(|v| !v.is_empty());
        let same = value.is_some() && value == self.0.as_deref();
        if !same {
            self.0 = None;
        }
        same
    }
}

/// The request node changed: `Ok(None)` when it is empty or gone (dom0's tool removes it
/// when done), the request when only the toolstack can have written it and it parses.
pub fn accept(value: Option<&str>, perms: &[Perm]) -> Result<Option<Request>, Refusal> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if !request::only_toolstack_writes(perms) {
        return Err(Refusal::NotToolstack);
    }
    request::parse(value).map(Some).map_err(Refusal::Request)
}

/// The image's grant references, from the bytes of the request's index pages (in order):
/// exactly one non-zero, distinct reference per image page, and zeroes after the last.
pub fn image_refs(index: &[u8], request: &Request) -> Result<Vec<u32>, Refusal> {
    if index.len() != request.index.len() * PAGE {
        return Err(Refusal::Index("not the pages the request names"));
    }
    let pages = request.pages();
    let mut refs = Vec::new();
    refs.try_reserve_exact(pages)
        .map_err(|_| Refusal::NoMemory(pages * 4))?;
    for (i, word) in index.chunks_exact(4).enumerate() {
        let gref = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        match (i < pages, gref) {
            (true, 0) => return Err(Refusal::Index("a page without a reference")),
            (true, gref) => refs.push(gref),
            (false, 0) => {}
            (false, _) => return Err(Refusal::Index("references past the image's last page")),
        }
    }
    debug_assert!(pages <= request.index.len() * REFS_PER_INDEX_PAGE);
    let mut sorted = refs.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(Refusal::Index("a reference given twice"));
    }
    Ok(refs)
}

/// The image, copied once out of the granted pages into blkdom's own memory (dom0 could
/// change a granted page after a check), then checked.
pub struct Staging {
    bytes: Vec<u8>,
    request: Request,
}

impl Staging {
    /// Room for the request's image, allocated fallibly.
    pub fn new(request: Request) -> Result<Self, Refusal> {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(request.size)
            .map_err(|_| Refusal::NoMemory(request.size))?;
        bytes.resize(request.size, 0);
        Ok(Self { bytes, request })
    }

    /// Where image page `index` is copied to (the last one may be short).
    pub fn page_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let start = index.checked_mul(PAGE)?;
        let end = start.saturating_add(PAGE).min(self.bytes.len());
        self.bytes.get_mut(start..end)
    }

    /// The staged image checked against the request and `handover_version`.
    pub fn check(self, handover_version: u32) -> Result<(Vec<u8>, CheckedImage), Refusal> {
        let expected = Expected {
            size: self.request.size,
            sha256: self.request.sha256,
            handover_version,
        };
        let checked = image::check(&self.bytes, &expected).map_err(Refusal::Image)?;
        Ok((self.bytes, checked))
    }
}
