// SPDX-License-Identifier: MIT OR Apache-2.0
//! The kernel command line: space-separated `key` or `key=value` words; the last word of
//! a key wins. Only the keys of [`crate::keys::KEYS`] can be read: every reader takes a
//! [`Key`].

use crate::keys::Key;

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
    fn words(&self) -> impl Iterator<Item = (&'a str, Option<&'a str>)> {
        self.text
            .split_ascii_whitespace()
            .map(|word| match word.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (word, None),
            })
    }

    /// The value of the last `key=value` for `key` (later words override earlier ones).
    pub fn value(&self, key: Key) -> Option<&'a str> {
        self.words()
            .filter(|(k, _)| *k == key.name())
            .filter_map(|(_, v)| v)
            .last()
    }

    /// Whether `key` appears, bare or with a value.
    pub fn has(&self, key: Key) -> bool {
        self.words().any(|(k, _)| k == key.name())
    }

    /// The value of `key` as a whole number up to `max`: `None` when `key` has none,
    /// `Err` with the text when it is not such a number.
    pub fn number_up_to(&self, key: Key, max: u64) -> Result<Option<u64>, &'a str> {
        let Some(text) = self.value(key) else {
            return Ok(None);
        };
        match text.parse::<u64>() {
            Ok(n) if n <= max => Ok(Some(n)),
            _ => Err(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cmdline = Cmdline::new("loglevel=info selftest loglevel=trace disktest.bounce=");
        assert_eq!(cmdline.value(Key::LogLevel), Some("trace"));
        assert!(cmdline.has(Key::Selftest));
        assert!(cmdline.has(Key::LogLevel));
        assert!(!cmdline.has(Key::Disktest));
        assert_eq!(cmdline.value(Key::Selftest), None);
        // `key=` has an empty value; a key is matched whole.
        assert_eq!(cmdline.value(Key::DisktestBounce), Some(""));
        assert!(!Cmdline::new("selftest.await-dom0").has(Key::Selftest));
    }

    #[test]
    fn bounded_numbers_are_whole_and_at_most_their_maximum() {
        fn number(line: &str, max: u64) -> Result<Option<u64>, &str> {
            Cmdline::new(line).number_up_to(Key::DisktestSeed, max)
        }
        assert_eq!(number("disktest.seed=7", 7), Ok(Some(7)));
        assert_eq!(number("disktest.seed=8", 7), Err("8"));
        assert_eq!(number("disktest.seed=8", u64::MAX), Ok(Some(8)));
        // A bare key, or none, has no value.
        assert_eq!(number("disktest.seed", 7), Ok(None));
        assert_eq!(number("selftest", 7), Ok(None));
        assert_eq!(number("disktest.seed=-0", 7), Err("-0"));
        assert_eq!(number("disktest.seed=07", 7), Ok(Some(7)));
        assert_eq!(number("disktest.seed=0x7", 7), Err("0x7"));
        assert_eq!(number("disktest.seed=", 7), Err(""));
    }
}
