// SPDX-License-Identifier: MIT OR Apache-2.0
//! Every key of the kernel command line, in one list. A [`Key`] is the only way to read
//! a value from a [`crate::Cmdline`], and the macro below declares each key and its entry
//! of [`KEYS`] together, so no code can read a key the list does not have. README.md's
//! command-line tables list the same keys (`tests/readme.rs` compares them).

/// What a key is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A setting of the service ([`crate::Config`]).
    Setting,
    /// A test hook: runs a test instead of the service, reports and powers off. Only an
    /// image built with the `test-hooks` feature (tier 2's) has them; the production
    /// image says so and serves as if the key were not there.
    TestHook,
    /// An option of a test hook, read only while that hook runs.
    TestOption,
}

/// One key as README.md documents it.
#[derive(Clone, Copy, Debug)]
pub struct KeyDoc {
    pub key: Key,
    /// As written on the command line.
    pub name: &'static str,
    pub role: Role,
    /// Its value when not given ("" for a switch, which is off unless given).
    pub default: &'static str,
    /// What it takes ("" for a switch: the key alone).
    pub range: &'static str,
    pub what: &'static str,
}

macro_rules! command_line_keys {
    ($($key:ident $name:literal $role:ident,
       default $default:literal, range $range:literal, $what:literal;)*) => {
        /// A key of the kernel command line: each has its entry in [`KEYS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Key {
            $($key,)*
        }

        impl Key {
            /// Every key, in the order of [`KEYS`].
            pub const ALL: &[Key] = &[$(Key::$key,)*];

            /// As written on the command line.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Key::$key => $name,)*
                }
            }

            /// What it is for.
            pub const fn role(self) -> Role {
                match self {
                    $(Key::$key => Role::$role,)*
                }
            }
        }

        /// Every key, in the order of [`Key`], with what README.md says of it.
        pub const KEYS: &[KeyDoc] = &[$(KeyDoc {
            key: Key::$key,
            name: $name,
            role: Role::$role,
            default: $default,
            range: $range,
            what: $what,
        },)*];
    };
}

command_line_keys! {
    LogLevel "loglevel" Setting,
        default "info", range "off, error, warn, info, debug, trace, or 0 to 5",
        "console log level";
    PollSpinUs "poll.spin-us" Setting,
        default "200-1000", range "<min>-<max> microseconds, 0 < min <= max <= 100000",
        "how long a poller spins after its last work before it sleeps: twice the average \
         gap between its bursts of work within these bounds, and only while that average \
         is at most half of max";
    PollIdle "poll.idle" Setting,
        default "auto", range "auto, pause, yield, spin",
        "what a spinning poller does between looks at its rings; auto: spin where the \
         PAUSE timed at boot is emulated, else pause";
    GrantsMaxTotal "grants.max-total" Setting,
        default "65536", range "0 to 4194304",
        "persistent grants all rings together keep mapped";
    GrantsMaxPerRing "grants.max-per-ring" Setting,
        default "8448", range "0 to 16384",
        "persistent grants one ring keeps mapped";
    GrantsIdleS "grants.idle-s" Setting,
        default "60", range "0 (never) to 86400 seconds",
        "a persistent grant unused this long is unmapped";
    GrantsPersistent "grants.persistent" Setting,
        default "on", range "on, off",
        "offer frontends persistent grants";
    NotifyHoldUs "notify.hold-us" Setting,
        default "5000", range "0 (never) to 20000 microseconds",
        "how long an event to a frontend may be held while more of its responses are on \
         their way";
    DeviceTimeoutMs "device.timeout-ms" Setting,
        default "30000", range "0 (never) to 3600000 milliseconds",
        "how long a device command may take before it is aborted and, if that does not \
         bring it back, its device reset";
    DeviceMaxResets "device.max-resets" Setting,
        default "3", range "0 (never reset: fail at once) to 100",
        "resets in a row, without a command completed between them, before a device is \
         given up (stopped, every request failed)";
    NetIp "net.ip" Setting,
        default "none", range "<a.b.c.d>/<prefix>, prefix 1 to 30; or dhcp",
        "blkdom's IPv4 address and subnet on its vif, the storage network, or dhcp: a \
         DHCPv4 lease gives address, subnet and router; without it blkdom uses no vif";
    NetGw "net.gw" Setting,
        default "none", range "<a.b.c.d>, inside net.ip's subnet (static net.ip only)",
        "the IPv4 router towards targets outside net.ip's subnet (with net.ip=dhcp, the \
         lease's router)";
    NetHostnqn "net.hostnqn" Setting,
        default "none", range "nqn.<...>, up to 223 printable ASCII characters other than ','",
        "blkdom's NVMe host NQN, what NVMe/TCP targets know it by (their allowed hosts); \
         without it no nvme-tcp: disk is served";
    NetDigest "net.digest" Setting,
        default "none", range "none, header, data, or header,data",
        "CRC32C digests on every NVMe/TCP connection, over PDU headers, over data or both \
         (Linux's nvme connect --hdr-digest and --data-digest); a target that does not \
         agree is refused";

    Selftest "selftest" TestHook,
        default "", range "",
        "run the in-kernel self-tests, report, power off";
    SelftestExpectCpus "selftest.expect-cpus" TestOption,
        default "", range "a number of CPUs",
        "the self-tests also check that this many CPUs came up";
    SelftestInjectFailure "selftest.inject-failure" TestOption,
        default "", range "",
        "add a self-test that fails (the runner must catch it)";
    SelftestAwaitDom0 "selftest.await-dom0" TestOption,
        default "", range "",
        "under Xen, also wait for a xenstore write from dom0";
    Crashtest "crashtest" TestHook,
        default "", range "page-fault, panic, hang",
        "fail on purpose (the runner must catch it)";
    Disktest "disktest" TestHook,
        default "", range "a target (as a vbd's params)",
        "drive a disk from every CPU, check what comes back, power off";
    DisktestSeed "disktest.seed" TestOption,
        default "1", range "a number",
        "the seed of the disk test's writes";
    DisktestWrites "disktest.writes" TestOption,
        default "24", range "a number",
        "seeded writes per queue";
    DisktestQueues "disktest.queues" TestOption,
        default "one per CPU", range "1 to the CPUs",
        "queues driven at once";
    DisktestRandomReads "disktest.random-reads" TestOption,
        default "2000", range "a number",
        "random 4 KiB reads per queue";
    DisktestSequentialMib "disktest.sequential-mib" TestOption,
        default "16", range "a number of MiB",
        "MiB read sequentially per queue";
    DisktestNvmePrpOnly "disktest.nvme-prp-only" TestOption,
        default "", range "",
        "the disk test without NVMe SGLs";
    DisktestBounce "disktest.bounce" TestOption,
        default "", range "",
        "the disk test through bounce buffers, as an emulated device under Xen";
    DisktestShutdown "disktest.shutdown" TestOption,
        default "", range "",
        "after the disk test, shut the device down as xl shutdown does (flush, NVMe \
         shutdown notification, virtio reset)";
    Upgradetest "upgradetest" TestHook,
        default "", range "a number of upgrades, 1 to 10",
        "upgrade to the image given as a module (QEMU's -initrd) that many times, each new \
         image checking it booted from the handover; power off";
    UpgradetestCorrupt "upgradetest.corrupt" TestOption,
        default "", range "",
        "the old image flips a byte of the handover block's body before the jump: the new \
         image must refuse the block and boot cold";
    UpgradetestFailSwitch "upgradetest.fail-switch" TestOption,
        default "", range "",
        "the service's next live upgrade fails on purpose after the vif was closed and \
         before the devices stop: the vif must connect again and every drained ring be \
         re-attached";
    UpgradetestDevices "upgradetest.devices" TestOption,
        default "", range "",
        "each image also checks and rewrites the first block of nvme:1 and virtio:0, \
         then flushes and stops both devices before the jump, as a live upgrade does";
    Registrytest "registrytest" TestHook,
        default "", range "<step>;...: +<target> opens, -<n> releases the n-th opened",
        "open and release disks through the device registry, log each outcome, power off";
    Faulttest "faulttest" TestHook,
        default "", range "a target",
        "device faults on a disk whose device fails a sector (and, with faulttest.stall, \
         one that stalls)";
    FaulttestErrorSector "faulttest.error-sector" TestOption,
        default "2048", range "a sector",
        "the sector the failing device fails";
    FaulttestStall "faulttest.stall" TestOption,
        default "", range "a target",
        "the disk whose device never completes in time";
    FaulttestStallSector "faulttest.stall-sector" TestOption,
        default "0", range "a sector",
        "where the stalled read goes";
    FaulttestAfterReset "faulttest.after-reset" TestOption,
        default "", range "a target",
        "a disk on the stalling device read after its reset, with device.max-resets > 0";
    FaulttestLateMs "faulttest.late-ms" TestOption,
        default "0", range "milliseconds",
        "how late the stalling device completes";
    FaulttestBounce "faulttest.bounce" TestOption,
        default "", range "",
        "the fault test through bounce buffers";
    FaulttestHeapLeftKib "faulttest.heap-left-kib" TestOption,
        default "", range "KiB",
        "at boot, take heap (for good) until this much is left for disks and rings, so that \
         attaches meet the refusals of a short heap; then serve";
    Nettest "nettest" TestHook,
        default "", range "an nvme-tcp: target",
        "bring the vif up (net.ip), connect to an NVMe/TCP target, bring its controller \
         up, read block 0, write block 1 and read it back; power off";
    NettestHostnqn "nettest.hostnqn" TestOption,
        default "a fixed test NQN", range "an NQN",
        "the host NQN the network test connects with";
}

impl Key {
    /// Its entry in [`KEYS`] (the kernel itself needs only [`Key::name`] and
    /// [`Key::role`], which leave the descriptions out of the image).
    pub fn doc(self) -> &'static KeyDoc {
        &KEYS[self as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_its_own_entry_and_name() {
        assert_eq!(Key::ALL.len(), KEYS.len());
        for (at, doc) in KEYS.iter().enumerate() {
            assert_eq!(doc.key as usize, at, "{}", doc.name);
            assert_eq!(Key::ALL[at], doc.key);
            assert_eq!((doc.key.name(), doc.key.role()), (doc.name, doc.role));
            assert!(
                KEYS[..at].iter().all(|other| other.name != doc.name),
                "{} twice",
                doc.name
            );
            assert!(
                doc.name.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'.'
                    || b == b'-'),
                "{}",
                doc.name
            );
            assert!(!doc.what.is_empty(), "{}", doc.name);
        }
    }

    #[test]
    fn test_options_belong_to_a_test_hook() {
        for doc in KEYS.iter().filter(|doc| doc.role == Role::TestOption) {
            let (hook, _) = doc.name.split_once('.').expect("hook.option");
            let owner = KEYS.iter().find(|k| k.name == hook);
            assert_eq!(owner.map(|k| k.role), Some(Role::TestHook), "{}", doc.name);
        }
        // A setting's key never starts like a test hook's.
        for doc in KEYS.iter().filter(|doc| doc.role == Role::Setting) {
            let first = doc.name.split('.').next().unwrap_or_default();
            assert!(
                KEYS.iter()
                    .all(|k| k.role != Role::TestHook || k.name != first),
                "{}",
                doc.name
            );
        }
    }
}
