// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `log` backend: every record goes to the console sinks, one line each.

use core::fmt::Write;
use log::{LevelFilter, Log, Metadata, Record};
use spin::Mutex;

/// One log line, formatted before it is written so every sink gets it in one piece
/// (one console-ring notification per line, not per fragment). Longer lines are cut.
struct LineBuffer {
    bytes: [u8; 512],
    len: usize,
}

impl Write for LineBuffer {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.bytes.len() - 1 - self.len; // keep one byte for the newline
        let take = s.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

struct KernelLogger {
    /// Serialises lines from different CPUs so they do not interleave.
    line_lock: Mutex<()>,
}

static LOGGER: KernelLogger = KernelLogger {
    line_lock: Mutex::new(()),
};

impl Log for KernelLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // A fault or panic while a line is being written must still be able to log:
        // after a bounded wait, write without the lock (lines may interleave).
        let mut guard = None;
        for _ in 0..1_000_000 {
            if let Some(g) = self.line_lock.try_lock() {
                guard = Some(g);
                break;
            }
            core::hint::spin_loop();
        }
        let target = record
            .target()
            .strip_prefix("blkdom::")
            .unwrap_or(record.target());
        let mut line = LineBuffer {
            bytes: [0; 512],
            len: 0,
        };
        let _ = write!(line, "{:<5} ", record.level());
        if let Some(ns) = crate::xen_domain::uptime_ns() {
            // Under Xen: seconds since boot, so an operator can time boot and hotplug.
            let _ = write!(
                line,
                "[{:>4}.{:06}] ",
                ns / 1_000_000_000,
                ns % 1_000_000_000 / 1000
            );
        }
        let _ = write!(line, "{}: {}", target, record.args());
        line.bytes[line.len] = b'\n';
        crate::console::write_bytes(&line.bytes[..=line.len]);
        drop(guard);
    }

    fn flush(&self) {
        crate::console::flush();
    }
}

pub fn init(level: LevelFilter) {
    // Only fails if a logger is already set, which would be a boot-order bug; keep going.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}
