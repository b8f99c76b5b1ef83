// SPDX-License-Identifier: MIT OR Apache-2.0
//! The guest's Xen devices, and the only unsafe code: `/dev/xen/gntalloc` (pages granted
//! to another domain, mapped here), `/dev/xen/evtchn` (event channels) and
//! `/dev/xen/xenbus` (the kernel's xenstore connection, as a byte stream).
//!
//! The ioctl numbers and structures are those of Linux's uapi headers
//! `include/uapi/xen/gntalloc.h` and `include/uapi/xen/evtchn.h`: `_IOC(_IOC_NONE, type,
//! nr, size)`, where `_IOC_NONE` is 0, so the number is `size << 16 | type << 8 | nr`.

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use blkback::abi::PAGE_SIZE;
use blkback::fake::memory::{read_words, write_words};
use blkback::ring::RingMemory;
use xen::xenstore::{RingError, XenstoreRing};

mod ffi {
    use std::ffi::c_void;

    // The libc functions std does not wrap (glibc, linked statically).
    extern "C" {
        pub fn ioctl(fd: i32, request: u64, ...) -> i32;
        pub fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            offset: i64,
        ) -> *mut c_void;
        pub fn munmap(addr: *mut c_void, len: usize) -> i32;
        pub fn poll(fds: *mut PollFd, nfds: u64, timeout_ms: i32) -> i32;
        pub fn getrusage(who: i32, usage: *mut RUsage) -> i32;
    }

    /// `struct rusage` (x86_64): two `struct timeval`s, then 14 longs.
    #[repr(C)]
    pub struct RUsage {
        pub utime: [i64; 2],
        pub stime: [i64; 2],
        pub rest: [i64; 14],
    }
    pub const RUSAGE_SELF: i32 = 0;

    #[repr(C)]
    pub struct PollFd {
        pub fd: i32,
        pub events: i16,
        pub revents: i16,
    }

    pub const PROT_READ: i32 = 1;
    pub const PROT_WRITE: i32 = 2;
    pub const MAP_SHARED: i32 = 1;
    pub const POLLIN: i16 = 1;
    pub const O_NONBLOCK: i32 = 0o4000;
}

/// `_IOC(_IOC_NONE, kind, nr, size)`.
const fn ioc_none(kind: u8, nr: u8, size: usize) -> u64 {
    ((size as u64) << 16) | ((kind as u64) << 8) | nr as u64
}

/// `struct ioctl_gntalloc_alloc_gref` with room for `MAX_GRANT_PAGES` references (the
/// header declares one; the kernel writes `count` of them).
#[repr(C)]
struct AllocGref {
    domid: u16,
    flags: u16,
    count: u32,
    index: u64,
    gref_ids: [u32; MAX_GRANT_PAGES],
}

/// The size the ioctl number encodes: the header's struct, with one reference.
const ALLOC_GREF_SIZE: usize = 24;
const IOCTL_GNTALLOC_ALLOC_GREF: u64 = ioc_none(b'G', 5, ALLOC_GREF_SIZE);
const GNTALLOC_FLAG_WRITABLE: u16 = 1;

/// `struct ioctl_gntalloc_dealloc_gref`.
#[repr(C)]
struct DeallocGref {
    index: u64,
    count: u32,
}
const IOCTL_GNTALLOC_DEALLOC_GREF: u64 = ioc_none(b'G', 6, size_of::<DeallocGref>());

/// `struct ioctl_evtchn_bind_unbound_port`, `ioctl_evtchn_notify`, `ioctl_evtchn_unbind`:
/// one unsigned int each.
const IOCTL_EVTCHN_BIND_UNBOUND_PORT: u64 = ioc_none(b'E', 2, 4);
const IOCTL_EVTCHN_UNBIND: u64 = ioc_none(b'E', 3, 4);
const IOCTL_EVTCHN_NOTIFY: u64 = ioc_none(b'E', 4, 4);

/// Most pages one allocation grants (a ring of order 4).
pub const MAX_GRANT_PAGES: usize = 16;

const _: () = {
    assert!(IOCTL_GNTALLOC_ALLOC_GREF == 0x0018_4705);
    assert!(IOCTL_GNTALLOC_DEALLOC_GREF == 0x0010_4706);
    assert!(IOCTL_EVTCHN_BIND_UNBOUND_PORT == 0x0004_4502);
    assert!(core::mem::offset_of!(AllocGref, gref_ids) == 16);
    assert!(size_of::<ffi::RUsage>() == 144);
};

fn open(path: &str, flags: i32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// An ioctl whose argument is `arg`; its non-negative result.
fn ioctl<T>(file: &File, request: u64, arg: &mut T) -> io::Result<i32> {
    // SAFETY: `arg` is a live, exclusively borrowed value of the layout `request`
    // names (the structs above mirror the uapi headers); the kernel reads and writes
    // within it only.
    let rc = unsafe { ffi::ioctl(file.as_raw_fd(), request, arg as *mut T as *mut c_void) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// Pages mapped from gntalloc, seen as one contiguous range of shared memory (a ring, or
/// a data page the backend reads and writes). Every access is atomic: another domain
/// and a second thread of ours may touch them at any time.
pub struct SharedPages {
    words: *const AtomicU32,
    len: usize,
}

// SAFETY: the mapping stays valid until `drop`, and it is only reached through atomics.
unsafe impl Send for SharedPages {}
// SAFETY: as above: concurrent access through atomics is sound.
unsafe impl Sync for SharedPages {}

impl SharedPages {
    fn words(&self) -> &[AtomicU32] {
        // SAFETY: `words` points at `len` mapped bytes (page aligned) that live as long
        // as `self`; `AtomicU32` has the layout of `u32`.
        unsafe { std::slice::from_raw_parts(self.words, self.len / 4) }
    }
}

impl Drop for SharedPages {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `Gntalloc::share` and nothing borrows it now.
        unsafe { ffi::munmap(self.words as *mut c_void, self.len) };
    }
}

impl RingMemory for SharedPages {
    fn size_bytes(&self) -> usize {
        self.len
    }
    fn load_u32(&self, offset: usize) -> u32 {
        self.words()[offset / 4].load(Ordering::Acquire)
    }
    fn store_u32(&self, offset: usize, value: u32) {
        self.words()[offset / 4].store(value, Ordering::Release)
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        read_words(self.words(), offset, out)
    }
    fn write_bytes(&self, offset: usize, data: &[u8]) {
        write_words(self.words(), offset, data)
    }
    fn full_fence(&self) {
        fence(Ordering::SeqCst)
    }
}

/// Grant references handed out by gntalloc; ended (deallocated) on drop, which Linux
/// completes once the other domain no longer maps them.
pub struct Grants {
    pub refs: Vec<u32>,
    index: u64,
    device: Arc<File>,
}

impl Drop for Grants {
    fn drop(&mut self) {
        let mut op = DeallocGref {
            index: self.index,
            count: self.refs.len() as u32,
        };
        if let Err(e) = ioctl(&self.device, IOCTL_GNTALLOC_DEALLOC_GREF, &mut op) {
            eprintln!("hostile: ending grants {:?}: {e}", self.refs);
        }
    }
}

/// `/dev/xen/gntalloc`.
pub struct Gntalloc(Arc<File>);

impl Gntalloc {
    pub fn open() -> io::Result<Self> {
        Ok(Self(Arc::new(open("/dev/xen/gntalloc", 0)?)))
    }

    /// Grants `pages` fresh zeroed pages to `domid` (read-only unless `writable`) and
    /// maps them here.
    pub fn share(
        &self,
        domid: u16,
        pages: usize,
        writable: bool,
    ) -> io::Result<(Grants, SharedPages)> {
        assert!((1..=MAX_GRANT_PAGES).contains(&pages));
        let mut op = AllocGref {
            domid,
            flags: if writable { GNTALLOC_FLAG_WRITABLE } else { 0 },
            count: pages as u32,
            index: 0,
            gref_ids: [0; MAX_GRANT_PAGES],
        };
        ioctl(&self.0, IOCTL_GNTALLOC_ALLOC_GREF, &mut op)?;
        let grants = Grants {
            refs: op.gref_ids[..pages].to_vec(),
            index: op.index,
            device: self.0.clone(),
        };
        let len = pages * PAGE_SIZE;
        // SAFETY: maps the pages gntalloc just allocated at `index` (its mmap offset);
        // the result is checked before use and unmapped by `SharedPages::drop`.
        let addr = unsafe {
            ffi::mmap(
                std::ptr::null_mut(),
                len,
                ffi::PROT_READ | ffi::PROT_WRITE,
                ffi::MAP_SHARED,
                self.0.as_raw_fd(),
                op.index as i64,
            )
        };
        if addr as isize == -1 {
            return Err(io::Error::last_os_error());
        }
        let mem = SharedPages {
            words: addr as *const AtomicU32,
            len,
        };
        Ok((grants, mem))
    }
}

/// `/dev/xen/evtchn`: event channels of ours; closing it unbinds them all.
pub struct Evtchn(File);

impl Evtchn {
    pub fn open() -> io::Result<Self> {
        Ok(Self(open("/dev/xen/evtchn", 0)?))
    }

    /// A new port that `remote` may bind (`EVTCHNOP_alloc_unbound`).
    pub fn bind_unbound(&self, remote: u16) -> io::Result<u32> {
        let mut remote = u32::from(remote);
        ioctl(&self.0, IOCTL_EVTCHN_BIND_UNBOUND_PORT, &mut remote).map(|port| port as u32)
    }

    pub fn notify(&self, port: u32) {
        let mut port = port;
        if let Err(e) = ioctl(&self.0, IOCTL_EVTCHN_NOTIFY, &mut port) {
            eprintln!("hostile: notify port {port}: {e}");
        }
    }

    pub fn unbind(&self, port: u32) {
        let mut port = port;
        if let Err(e) = ioctl(&self.0, IOCTL_EVTCHN_UNBIND, &mut port) {
            eprintln!("hostile: unbind port {port}: {e}");
        }
    }
}

/// User plus system CPU time this process has used, seconds (`getrusage`).
pub fn cpu_seconds() -> f64 {
    let mut usage = ffi::RUsage {
        utime: [0; 2],
        stime: [0; 2],
        rest: [0; 14],
    };
    // SAFETY: `usage` is a live `struct rusage` the call fills in.
    if unsafe { ffi::getrusage(ffi::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: [i64; 2]| t[0] as f64 + t[1] as f64 / 1e6;
    seconds(usage.utime) + seconds(usage.stime)
}

/// `/dev/xen/xenbus`: whole xenstore messages in, replies out, in the wire format
/// (`xen::xenstore::XenstoreClient` speaks it). Watches are not used: Linux answers
/// those itself, without the request id.
pub struct Xenbus(File);

/// How long a reply may take.
const XENBUS_TIMEOUT_MS: i32 = 20_000;

impl Xenbus {
    pub fn open() -> io::Result<Self> {
        Ok(Self(open("/dev/xen/xenbus", ffi::O_NONBLOCK)?))
    }
}

impl XenstoreRing for Xenbus {
    fn write_some(&mut self, data: &[u8]) -> Result<usize, RingError> {
        match self.0.write(data) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => {
                eprintln!("hostile: xenbus write: {e}");
                Err(RingError::Corrupt)
            }
        }
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, RingError> {
        match self.0.read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => {
                eprintln!("hostile: xenbus read: {e}");
                Err(RingError::Corrupt)
            }
        }
    }

    fn notify(&mut self) {}

    fn wait(&mut self) -> Result<(), RingError> {
        let mut fd = ffi::PollFd {
            fd: self.0.as_raw_fd(),
            events: ffi::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, borrowed for the call.
        match unsafe { ffi::poll(&mut fd, 1, XENBUS_TIMEOUT_MS) } {
            0 => Err(RingError::Timeout),
            _ => Ok(()),
        }
    }
}
