//! The kernel command line: space-separated `key` or `key=value` words.
//!
//! Known keys (README.md's table has an example of each):
//! `loglevel=off|error|warn|info|debug|trace` (or 0..5), `poll.spin-us=<min>-<max>` (the
//! pollers' adaptive spin window, microseconds), `poll.idle=auto|pause|yield|spin` (what a
//! spinning poller does between looks at its rings: by default (`auto`) nothing where a
//! PAUSE is emulated, else a PAUSE; or a PAUSE, `SCHEDOP_yield`, or nothing),
//! `grants.max-total=<n>` (persistent
//! grants all rings together keep mapped, 0..=4194304, default 65536),
//! `grants.max-per-ring=<n>` (the most one ring keeps, 0..=16384, default 8448),
//! `grants.persistent=on|off` (offer frontends `feature-persistent`, default on: off
//! maps and unmaps each request's grants and spares the guest its copy to and from its
//! persistent pages),
//! `grants.idle-s=<s>` (an unused persistent grant is unmapped after this long, 0..=86400,
//! 0 never, default 60; the `grants.*` values are read by [`Cmdline::number_up_to`]
//! for `blkback::budget::GrantLimits::from_command_line`: a bad one is logged and its
//! default kept),
//! `notify.hold-us=<n>` (how long an event to a frontend may be held so it carries
//! more responses, microseconds; 0 = never, at most 20000, default
//! [`DEFAULT_NOTIFY_HOLD_US`]),
//! `device.timeout-ms=<ms>` (how long a device command may take before its device is
//! failed and stopped, 0..=3600000, 0 never, default 30000),
//! `selftest`, `selftest.expect-cpus=<n>`, `selftest.inject-failure`,
//! `selftest.await-dom0`, `crashtest=page-fault|panic|hang`, `disktest=<target>` with
//! `disktest.seed=`, `disktest.writes=`, `disktest.queues=`, `disktest.random-reads=`,
//! `disktest.sequential-mib=`, `disktest.nvme-prp-only`, `disktest.bounce`,
//! `registrytest=<step>;...`, and the fault test (a test hook, off unless named):
//! `faulttest=<target>` with `faulttest.error-sector=`, `faulttest.stall=<target>`,
//! `faulttest.stall-sector=` and `faulttest.late-ms=`.

use log::LevelFilter;

/// A parsed view of the command line. Borrowing, so it works before the heap exists.
#[derive(Clone, Copy, Debug)]
pub struct Cmdline<'a> {
    text: &'a str,
}

impl<'a> Cmdline<'a> {
    pub fn new(text: &'a str) -> Self {
        Cmdline {
            text: text.trim_matches(char::from(0)).trim(),
        }
    }

    pub fn as_str(&self) -> &'a str {
        self.text
    }

    /// Each word as `(key, value)`; a bare word has no value.
    pub fn words(&self) -> impl Iterator<Item = (&'a str, Option<&'a str>)> {
        self.text
            .split_ascii_whitespace()
            .map(|word| match word.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (word, None),
            })
    }

    /// The value of the last `key=value` for `key` (later words override earlier ones).
    pub fn value(&self, key: &str) -> Option<&'a str> {
        self.words()
            .filter(|(k, _)| *k == key)
            .filter_map(|(_, v)| v)
            .last()
    }

    /// Whether `key` appears, bare or with a value.
    pub fn has(&self, key: &str) -> bool {
        self.words().any(|(k, _)| k == key)
    }

    /// The log level asked for with `loglevel=`, if any and if it parses.
    pub fn log_level(&self) -> Result<Option<LevelFilter>, &'a str> {
        match self.value("loglevel") {
            None => Ok(None),
            Some(text) => parse_level(text).map(Some).ok_or(text),
        }
    }
}

/// The longest spin window accepted: beyond it a poller is simply a busy loop.
pub const MAX_SPIN_US: u64 = 100_000;

impl<'a> Cmdline<'a> {
    /// `poll.spin-us=<min>-<max>`: how long, in microseconds, a poller spins after its
    /// last work before it sleeps (it adapts within these bounds). `Err` holds the text
    /// when it is not two numbers with 0 < min <= max <= [`MAX_SPIN_US`].
    pub fn spin_window_us(&self) -> Result<Option<(u64, u64)>, &'a str> {
        let Some(text) = self.value("poll.spin-us") else {
            return Ok(None);
        };
        let (min, max) = text.split_once('-').ok_or(text)?;
        let (min, max) = (
            min.parse::<u64>().map_err(|_| text)?,
            max.parse::<u64>().map_err(|_| text)?,
        );
        if min == 0 || min > max || max > MAX_SPIN_US {
            return Err(text);
        }
        Ok(Some((min, max)))
    }
}

/// What an idle poller does between two looks at its rings while it spins
/// (`poll.idle=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollIdle {
    /// `pause`: a PAUSE instruction, and look again (the default on hardware; see
    /// [`PollIdle::for_pause_cost`]).
    #[default]
    Pause,
    /// `yield`: `SCHEDOP_yield`, so another vCPU on this pCPU runs first (a hypercall
    /// per look: about 0.1 ms under the nested rig).
    Yield,
    /// `spin`: nothing, look again at once. Under QEMU's TCG a PAUSE leaves the emulated
    /// CPU's execution loop, and each return to it takes QEMU's global lock, which the
    /// guests' emulated CPUs then wait for (in the nested rig their QEMU threads slept
    /// 0.94 times per I/O at QD1 beside a PAUSE-ing poller, 0.73 beside a spinning one,
    /// 0.70 under dom0 blkback); on hardware a PAUSE is what spares a sibling
    /// hyperthread.
    Spin,
}

/// Above this a PAUSE is emulated rather than executed: on hardware it takes at most
/// ~140 cycles (under 120 ns at 1.2 GHz); under QEMU's TCG it leaves the emulated CPU's
/// loop and takes QEMU's global lock (218-867 ns at boot in the nested rig).
pub const EMULATED_PAUSE_NS: u64 = 150;

impl PollIdle {
    /// Every choice, in the order of their numbers (`as u8`).
    pub const ALL: [PollIdle; 3] = [PollIdle::Pause, PollIdle::Yield, PollIdle::Spin];

    /// Its name on the command line (and in the log).
    pub fn name(self) -> &'static str {
        match self {
            PollIdle::Pause => "pause",
            PollIdle::Yield => "yield",
            PollIdle::Spin => "spin",
        }
    }

    /// The choice when `poll.idle=` is not given (or is `auto`): `spin` where a PAUSE,
    /// measured at boot, costs more than [`EMULATED_PAUSE_NS`] (an emulated CPU);
    /// `pause` where it costs less, or where its cost is unknown.
    pub fn for_pause_cost(pause_ns: Option<u64>) -> PollIdle {
        match pause_ns {
            Some(ns) if ns > EMULATED_PAUSE_NS => PollIdle::Spin,
            _ => PollIdle::Pause,
        }
    }

    /// The choice numbered `value` (`as u8`); `Pause` for any other number.
    pub fn from_u8(value: u8) -> PollIdle {
        PollIdle::ALL
            .into_iter()
            .find(|idle| *idle as u8 == value)
            .unwrap_or_default()
    }
}

impl<'a> Cmdline<'a> {
    /// `poll.idle=auto|pause|yield|spin`: `None` for `auto` or nothing given (then
    /// [`PollIdle::for_pause_cost`] chooses). `Err` holds the text when it is none of them.
    pub fn poll_idle(&self) -> Result<Option<PollIdle>, &'a str> {
        let Some(text) = self.value("poll.idle") else {
            return Ok(None);
        };
        if text == "auto" {
            return Ok(None);
        }
        PollIdle::ALL
            .into_iter()
            .find(|idle| idle.name() == text)
            .map(Some)
            .ok_or(text)
    }
}

impl<'a> Cmdline<'a> {
    /// `grants.persistent=on|off`: whether frontends are offered persistent grants.
    /// `Err` holds the text when it is neither.
    pub fn persistent_grants(&self) -> Result<Option<bool>, &'a str> {
        match self.value("grants.persistent") {
            None => Ok(None),
            Some("on") => Ok(Some(true)),
            Some("off") => Ok(Some(false)),
            Some(text) => Err(text),
        }
    }
}

/// The notification hold window by default, microseconds (`notify.hold-us=`).
pub const DEFAULT_NOTIFY_HOLD_US: u64 = 5_000;
/// The longest notification hold window accepted, microseconds.
pub const MAX_NOTIFY_HOLD_US: u64 = 20_000;

impl<'a> Cmdline<'a> {
    /// `notify.hold-us=<n>`: how long, in microseconds, a ring may hold an event to its
    /// frontend while more responses are on their way (0 = never). `Err` holds the text
    /// when it is not a number up to [`MAX_NOTIFY_HOLD_US`].
    pub fn notify_hold_us(&self) -> Result<Option<u64>, &'a str> {
        self.number_up_to("notify.hold-us", MAX_NOTIFY_HOLD_US)
    }

    /// The value of `key` as a whole number up to `max`: `None` when `key` has none,
    /// `Err` with the text when it is not such a number. Every bounded number of the
    /// command line is read here (`grants.*` through
    /// `blkback::budget::GrantLimits::from_command_line`).
    pub fn number_up_to(&self, key: &str, max: u64) -> Result<Option<u64>, &'a str> {
        let Some(text) = self.value(key) else {
            return Ok(None);
        };
        match text.parse::<u64>() {
            Ok(n) if n <= max => Ok(Some(n)),
            _ => Err(text),
        }
    }
}

/// The longest device deadline accepted, in milliseconds (an hour).
pub const MAX_DEVICE_TIMEOUT_MS: u64 = 3_600_000;

impl<'a> Cmdline<'a> {
    /// `device.timeout-ms=<ms>`: how long a device command may go without completion
    /// before its device is failed (0: forever). `Err` holds the text when it is not a
    /// whole number up to [`MAX_DEVICE_TIMEOUT_MS`].
    pub fn device_timeout_ms(&self) -> Result<Option<u64>, &'a str> {
        self.number_up_to("device.timeout-ms", MAX_DEVICE_TIMEOUT_MS)
    }
}

fn parse_level(text: &str) -> Option<LevelFilter> {
    let by_number = [
        LevelFilter::Off,
        LevelFilter::Error,
        LevelFilter::Warn,
        LevelFilter::Info,
        LevelFilter::Debug,
        LevelFilter::Trace,
    ];
    if let Ok(n) = text.parse::<usize>() {
        return by_number.get(n).copied();
    }
    by_number
        .into_iter()
        .find(|level| level.as_str().eq_ignore_ascii_case(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_window_is_two_ordered_bounds() {
        assert_eq!(Cmdline::new("x").spin_window_us(), Ok(None));
        assert_eq!(
            Cmdline::new("poll.spin-us=50-1000").spin_window_us(),
            Ok(Some((50, 1000)))
        );
        assert_eq!(
            Cmdline::new("poll.spin-us=7-7").spin_window_us(),
            Ok(Some((7, 7)))
        );
        for bad in ["0-10", "10-5", "5", "a-9", "1-100001", "-5", "5-"] {
            let line = format!("poll.spin-us={bad}");
            assert_eq!(Cmdline::new(&line).spin_window_us(), Err(bad), "{bad}");
        }
    }

    #[test]
    fn bounded_numbers_are_whole_and_at_most_their_maximum() {
        let cmdline = Cmdline::new("a=7 b=8 c d=-0 e=07 f=0x7 a.b=1");
        assert_eq!(cmdline.number_up_to("a", 7), Ok(Some(7)));
        assert_eq!(cmdline.number_up_to("b", 7), Err("8"));
        assert_eq!(cmdline.number_up_to("b", u64::MAX), Ok(Some(8)));
        // A bare key, or none, has no value.
        assert_eq!(cmdline.number_up_to("c", 7), Ok(None));
        assert_eq!(cmdline.number_up_to("z", 7), Ok(None));
        assert_eq!(cmdline.number_up_to("d", 7), Err("-0"));
        assert_eq!(cmdline.number_up_to("e", 7), Ok(Some(7)));
        assert_eq!(cmdline.number_up_to("f", 7), Err("0x7"));
        assert_eq!(cmdline.number_up_to("a.b", 0), Err("1"));
    }

    #[test]
    fn poll_idle_is_pause_yield_or_spin() {
        let cases = [
            ("x", None),
            ("poll.idle=yield", Some(PollIdle::Yield)),
            ("poll.idle=yield poll.idle=pause", Some(PollIdle::Pause)),
            ("poll.idle=spin", Some(PollIdle::Spin)),
            ("poll.idle=spin poll.idle=auto", None),
        ];
        for (line, idle) in cases {
            assert_eq!(Cmdline::new(line).poll_idle(), Ok(idle), "{line}");
        }
        for bad in ["", "spinning", "Yield", "yield,pause"] {
            let line = format!("poll.idle={bad}");
            assert_eq!(Cmdline::new(&line).poll_idle(), Err(bad), "{bad}");
        }
        for idle in PollIdle::ALL {
            assert_eq!(PollIdle::from_u8(idle as u8), idle);
        }
        assert_eq!(PollIdle::from_u8(200), PollIdle::Pause);
    }

    #[test]
    fn an_emulated_pause_means_spin_by_default() {
        // The nested rig's PAUSE (218-867 ns) and a hardware one (~40-120 ns).
        assert_eq!(PollIdle::for_pause_cost(Some(218)), PollIdle::Spin);
        assert_eq!(
            PollIdle::for_pause_cost(Some(EMULATED_PAUSE_NS + 1)),
            PollIdle::Spin
        );
        assert_eq!(
            PollIdle::for_pause_cost(Some(EMULATED_PAUSE_NS)),
            PollIdle::Pause
        );
        assert_eq!(PollIdle::for_pause_cost(Some(40)), PollIdle::Pause);
        assert_eq!(PollIdle::for_pause_cost(Some(0)), PollIdle::Pause);
        // Not measured (no TSC rate): the instruction meant for spinning.
        assert_eq!(PollIdle::for_pause_cost(None), PollIdle::Pause);
    }

    #[test]
    fn persistent_grants_are_on_or_off() {
        assert_eq!(Cmdline::new("x").persistent_grants(), Ok(None));
        assert_eq!(
            Cmdline::new("grants.persistent=off").persistent_grants(),
            Ok(Some(false))
        );
        assert_eq!(
            Cmdline::new("grants.persistent=on").persistent_grants(),
            Ok(Some(true))
        );
        for bad in ["", "0", "Off", "no"] {
            let line = format!("grants.persistent={bad}");
            assert_eq!(Cmdline::new(&line).persistent_grants(), Err(bad), "{bad}");
        }
    }

    #[test]
    fn notify_hold_is_microseconds_up_to_the_cap() {
        assert_eq!(Cmdline::new("x").notify_hold_us(), Ok(None));
        assert_eq!(
            Cmdline::new("notify.hold-us=0").notify_hold_us(),
            Ok(Some(0))
        );
        assert_eq!(
            Cmdline::new("notify.hold-us=200 notify.hold-us=20000").notify_hold_us(),
            Ok(Some(20_000))
        );
        for bad in ["", "-1", "20001", "5us", "1.5"] {
            let line = format!("notify.hold-us={bad}");
            assert_eq!(Cmdline::new(&line).notify_hold_us(), Err(bad), "{bad}");
        }
    }

    #[test]
    fn device_timeout_is_milliseconds_up_to_an_hour() {
        assert_eq!(Cmdline::new("x").device_timeout_ms(), Ok(None));
        assert_eq!(
            Cmdline::new("device.timeout-ms=2500").device_timeout_ms(),
            Ok(Some(2500))
        );
        assert_eq!(
            Cmdline::new("device.timeout-ms=0").device_timeout_ms(),
            Ok(Some(0))
        );
        assert_eq!(
            Cmdline::new("device.timeout-ms=3600000").device_timeout_ms(),
            Ok(Some(MAX_DEVICE_TIMEOUT_MS))
        );
        for bad in ["3600001", "-1", "30s", "", "1e3"] {
            let line = format!("device.timeout-ms={bad}");
            assert_eq!(Cmdline::new(&line).device_timeout_ms(), Err(bad), "{bad}");
        }
    }

    #[test]
    fn words_split_keys_and_values() {
        let cmdline = Cmdline::new("  selftest loglevel=debug  a=b=c\0");
        let words: Vec<_> = cmdline.words().collect();
        assert_eq!(
            words,
            vec![
                ("selftest", None),
                ("loglevel", Some("debug")),
                ("a", Some("b=c"))
            ]
        );
        assert_eq!(cmdline.as_str(), "selftest loglevel=debug  a=b=c");
    }

    #[test]
    fn last_value_wins_and_flags_are_found() {
        let cmdline = Cmdline::new("loglevel=info x loglevel=trace");
        assert_eq!(cmdline.value("loglevel"), Some("trace"));
        assert!(cmdline.has("x"));
        assert!(cmdline.has("loglevel"));
        assert!(!cmdline.has("selftest"));
        assert_eq!(cmdline.value("x"), None);
    }

    #[test]
    fn log_levels_by_name_and_number() {
        assert_eq!(
            Cmdline::new("loglevel=WARN").log_level(),
            Ok(Some(LevelFilter::Warn))
        );
        assert_eq!(
            Cmdline::new("loglevel=5").log_level(),
            Ok(Some(LevelFilter::Trace))
        );
        assert_eq!(
            Cmdline::new("loglevel=off").log_level(),
            Ok(Some(LevelFilter::Off))
        );
        assert_eq!(Cmdline::new("").log_level(), Ok(None));
        assert_eq!(Cmdline::new("loglevel=loud").log_level(), Err("loud"));
        assert_eq!(Cmdline::new("loglevel=6").log_level(), Err("6"));
    }
}
