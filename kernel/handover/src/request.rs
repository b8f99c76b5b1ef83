// SPDX-License-Identifier: MIT OR Apache-2.0
//! The request dom0's `tools/blkdom-upgrade` writes to `control/blkdom-upgrade`:
//! `v1 size=<bytes> sha256=<64 hex digits> index=<gref>[,<gref>...]`, and who may have
//! written it (docs/design.md §4.12, 1).

use alloc::vec::Vec;

use crate::image::IMAGE_MAX;

/// Grant references one index page holds (4 KiB of u32).
pub const REFS_PER_INDEX_PAGE: usize = 1024;
/// Index pages a request may name: 8,192 image pages, 32 MiB, above `IMAGE_MAX`.
pub const MAX_INDEX_PAGES: usize = 8;
/// The domain allowed to ask for an upgrade: the toolstack's.
pub const TOOLSTACK_DOMID: u16 = 0;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub size: usize,
    pub sha256: [u8; 32],
    /// Grant references (from domid 0) of the pages listing the image's references.
    pub index: Vec<u32>,
}

impl Request {
    /// Image pages the request covers.
    pub fn pages(&self) -> usize {
        self.size.div_ceil(4096)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    Version,
    Syntax(&'static str),
    Size(usize),
    IndexPages { given: usize, needed: usize },
}

impl core::fmt::Display for RequestError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RequestError::Version => f.write_str("not a v1 request"),
            RequestError::Syntax(what) => write!(f, "bad or missing {what}"),
            RequestError::Size(n) => write!(f, "size {n}: must be 1..={IMAGE_MAX}"),
            RequestError::IndexPages { given, needed } => {
                write!(f, "{given} index pages for an image needing {needed}")
            }
        }
    }
}

impl core::error::Error for RequestError {}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Parses a request: each field once, nothing else, the index pages exactly as many as
/// the size needs.
pub fn parse(text: &str) -> Result<Request, RequestError> {
    let mut words = text.split_ascii_whitespace();
    if words.next() != Some("v1") {
        return Err(RequestError::Version);
    }
    let (mut size, mut sha, mut index) = (None, None, None);
    for word in words {
        let (key, value) = word.split_once('=').ok_or(RequestError::Syntax("field"))?;
        match key {
            "size" if size.is_none() => {
                size = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| RequestError::Syntax("size"))?,
                )
            }
            "sha256" if sha.is_none() => {
                sha = Some(hex32(value).ok_or(RequestError::Syntax("sha256"))?)
            }
            "index" if index.is_none() => {
                let refs = value
                    .split(',')
                    .take(MAX_INDEX_PAGES + 1)
                    .map(|r| r.parse::<u32>())
                    .collect::<Result<Vec<u32>, _>>()
                    .map_err(|_| RequestError::Syntax("index"))?;
                index = Some(refs);
            }
            _ => return Err(RequestError::Syntax("field")),
        }
    }
    let size = size.ok_or(RequestError::Syntax("size"))?;
    let sha256 = sha.ok_or(RequestError::Syntax("sha256"))?;
    let index = index.ok_or(RequestError::Syntax("index"))?;
    if size == 0 || size > IMAGE_MAX {
        return Err(RequestError::Size(size));
    }
    let needed = size.div_ceil(4096).div_ceil(REFS_PER_INDEX_PAGE);
    if index.len() != needed {
        return Err(RequestError::IndexPages {
            given: index.len(),
            needed,
        });
    }
    Ok(Request {
        size,
        sha256,
        index,
    })
}

/// One entry of a node's permissions (`XS_GET_PERMS`): the first names the owner, who
/// may do anything; the others what each domain may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perm {
    pub domid: u16,
    pub read: bool,
    pub write: bool,
}

/// Whether only the toolstack can have written a node with these permissions: it owns
/// it, its default for other domains has no write, and no domain is granted write. The
/// running blkdom is no exception: a node it could write is not dom0's word.
pub fn only_toolstack_writes(perms: &[Perm]) -> bool {
    match perms.split_first() {
        Some((owner, others)) => {
            owner.domid == TOOLSTACK_DOMID
                && !owner.write
                && others
                    .iter()
                    .all(|p| !p.write || p.domid == TOOLSTACK_DOMID)
        }
        None => false,
    }
}
