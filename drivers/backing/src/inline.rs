// SPDX-License-Identifier: MIT OR Apache-2.0
//! Short names a `target=` carries (a serial, a RAM disk's name, a partition's label),
//! stored inline so `Backing` stays a small `Copy` value. Each kind says how long it may
//! be and which bytes it may hold; everything else about them is the same.

use core::fmt;
use core::marker::PhantomData;

/// Which bytes a kind of name may hold (all of them ASCII, so a name is always a `str`).
pub trait NameChars {
    fn valid(b: u8) -> bool;
}

/// A name of 1 to `N` bytes that `C` allows.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InlineName<const N: usize, C> {
    bytes: [u8; N],
    len: u8,
    chars: PhantomData<C>,
}

impl<const N: usize, C: NameChars> InlineName<N, C> {
    pub const MAX_LEN: usize = N;

    /// Whether `b` may appear in such a name.
    pub fn valid_byte(b: u8) -> bool {
        b.is_ascii() && C::valid(b)
    }

    pub fn new(text: &str) -> Option<Self> {
        if text.is_empty() || text.len() > N || !text.bytes().all(Self::valid_byte) {
            return None;
        }
        let mut bytes = [0; N];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(InlineName {
            bytes,
            len: text.len() as u8,
            chars: PhantomData,
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII went in (checked by `new`).
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl<const N: usize, C: NameChars> fmt::Debug for InlineName<N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl<const N: usize, C: NameChars> fmt::Display for InlineName<N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    struct Digits;
    impl NameChars for Digits {
        fn valid(b: u8) -> bool {
            b.is_ascii_digit()
        }
    }
    type Short = InlineName<3, Digits>;

    #[test]
    fn a_name_is_one_to_n_allowed_bytes_and_reads_back_as_given() {
        assert_eq!(Short::new("042").map(|n| n.to_string()), Some("042".into()));
        assert_eq!(Short::new("7").unwrap().as_bytes(), b"7");
        assert!(Short::new("").is_none());
        assert!(Short::new("1234").is_none(), "longer than N");
        assert!(Short::new("1a").is_none(), "a byte the kind does not allow");
        assert_eq!(format!("{:?}", Short::new("12").unwrap()), "\"12\"");
        // Equal names compare equal whatever was stored before (no stale bytes past len).
        assert_eq!(Short::new("12"), Short::new("12"));
        assert!(Short::new("12") < Short::new("13"));
    }
}
