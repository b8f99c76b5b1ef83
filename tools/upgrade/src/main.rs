// SPDX-License-Identifier: MIT OR Apache-2.0
//! blkdom-upgrade: dom0's side of a live upgrade (docs/design.md §4.12). Shares IMAGE
//! read-only with blkdom through /dev/xen/gntalloc, page by page, plus index pages
//! listing the grant references; writes the request to blkdom's
//! `control/blkdom-upgrade` (`v1 size= sha256= index=`); prints each answer blkdom
//! writes to `data/blkdom-upgrade` until it refuses or is done; then removes the request
//! and ends the grants.
//!
//! Usage: `blkdom-upgrade [--sha256 HEX] [--timeout SECONDS] DOMID IMAGE`. `--sha256`
//! sends another checksum than the image's (to see a bad one refused). Exit status 0
//! when done, 2 when refused, 1 when the request could not be made.

use std::process::{Command, ExitCode};
use std::thread::sleep;
use std::time::{Duration, Instant};

use blkback::ring::RingMemory;
use handover::image::{sha256, IMAGE_MAX};
use handover::request::{self, REFS_PER_INDEX_PAGE};

// tools/hostile's devices; only gntalloc is used here.
#[allow(dead_code)]
#[path = "../../hostile/src/sys.rs"]
mod sys;

use sys::{Gntalloc, Grants, SharedPages, MAX_GRANT_PAGES};

const PAGE: usize = 4096;

fn xenstore(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `bytes` shared read-only with `domid`, `MAX_GRANT_PAGES` pages per allocation; the
/// grants (ended when dropped) and every page's reference in order.
fn share(gntalloc: &Gntalloc, domid: u16, bytes: &[u8]) -> Result<(Vec<Grants>, Vec<u32>), String> {
    let mut held = Vec::new();
    let mut refs = Vec::new();
    for chunk in bytes.chunks(MAX_GRANT_PAGES * PAGE) {
        let pages = chunk.len().div_ceil(PAGE);
        let (grants, memory): (Grants, SharedPages) = gntalloc
            .share(domid, pages, false)
            .map_err(|e| format!("gntalloc: {e}"))?;
        memory.write_bytes(0, chunk);
        refs.extend_from_slice(&grants.refs);
        held.push(grants);
    }
    Ok((held, refs))
}

fn option<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).map(String::as_str)
}

fn run(args: &[String]) -> Result<bool, String> {
    let positional: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || !args[i - 1].starts_with("--")))
        .map(|(_, a)| a)
        .collect();
    let [domid, path] = positional[..] else {
        return Err("usage: blkdom-upgrade [--sha256 HEX] [--timeout SECONDS] DOMID IMAGE".into());
    };
    let domid: u16 = domid.parse().map_err(|_| format!("domid {domid:?}"))?;
    let timeout = option(args, "--timeout")
        .map_or(Ok(60), str::parse)
        .map_err(|_| "--timeout")?;
    let image = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if image.is_empty() || image.len() > IMAGE_MAX {
        return Err(format!(
            "{path}: {} bytes; 1..={IMAGE_MAX} are sent",
            image.len()
        ));
    }
    let sha = match option(args, "--sha256") {
        Some(hex) => hex.to_string(),
        None => sha256(&image).iter().map(|b| format!("{b:02x}")).collect(),
    };

    let gntalloc = Gntalloc::open().map_err(|e| format!("{e}"))?;
    let (_image_grants, refs) = share(&gntalloc, domid, &image)?;
    let mut index = vec![0u8; refs.len().div_ceil(REFS_PER_INDEX_PAGE) * PAGE];
    for (i, r) in refs.iter().enumerate() {
        index[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
    }
    let (_index_grants, index_refs) = share(&gntalloc, domid, &index)?;
    let list: Vec<String> = index_refs.iter().map(u32::to_string).collect();
    let text = format!(
        "v1 size={} sha256={sha} index={}",
        image.len(),
        list.join(",")
    );
    // The very parser blkdom runs: a request it would refuse is not sent.
    if option(args, "--sha256").is_none() {
        request::parse(&text).map_err(|e| format!("request {text:?}: {e}"))?;
    }

    let home = format!("/local/domain/{domid}");
    let node = format!("{home}/control/blkdom-upgrade");
    let answer_node = format!("{home}/data/blkdom-upgrade");
    xenstore(&["xenstore-write", &answer_node, ""])?;
    // The node is made empty (no request), given to dom0 alone (blkdom may read it),
    // then written: blkdom takes a request only from a node no other domain can write,
    // whatever the permissions of the directory it is made in.
    xenstore(&["xenstore-write", &node, ""])?;
    xenstore(&["xenstore-chmod", &node, "n0", &format!("r{domid}")])?;
    xenstore(&["xenstore-write", &node, &text])?;
    println!("blkdom-upgrade: asked domain {domid}: {text}");
    let start = Instant::now();
    let mut last = String::new();
    let outcome = loop {
        let answer = xenstore(&["xenstore-read", &answer_node]).unwrap_or_default();
        if answer != last {
            println!("blkdom-upgrade: {answer}");
            last = answer.clone();
        }
        if answer.starts_with("done") {
            break Ok(true);
        }
        if answer.starts_with("refused") {
            break Ok(false);
        }
        if start.elapsed() > Duration::from_secs(timeout) {
            break Err(format!("no answer within {timeout} s (last: {last:?})"));
        }
        sleep(Duration::from_millis(100));
    };
    let _ = xenstore(&["xenstore-rm", &node]);
    // The grants end as they drop, once blkdom maps none of them.
    outcome
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("blkdom-upgrade: {e}");
            ExitCode::FAILURE
        }
    }
}
