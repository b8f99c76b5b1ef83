// SPDX-License-Identifier: MIT OR Apache-2.0
//! `registrytest=<step>;<step>;...`: a step `+<target>` opens a disk as a vbd's `params`
//! would and keeps it; `-<n>` releases the disk of step `n` (counting the `+` steps
//! from 0); `w<n>=<word>` writes `<word>` (zero-padded) to the first 4 KiB of that disk,
//! `r<n>=<word>` reads them and checks they hold it (which data a name reaches).

/// One step of the registry test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// `+<target>`: open a disk.
    Open(&'a str),
    /// `-<n>`: release the disk of the `n`-th open.
    Release(usize),
    /// `w<n>=<word>`: write `word` to the first block of the `n`-th open's disk.
    Write(usize, &'a str),
    /// `r<n>=<word>`: read the first block of the `n`-th open's disk; it must hold `word`.
    Check(usize, &'a str),
    /// Neither: the test fails.
    Bad(&'a str),
}

/// The steps of `text`, in order.
pub fn steps(text: &str) -> impl Iterator<Item = Step<'_>> {
    text.split(';').map(|step| {
        if let Some(target) = step.strip_prefix('+') {
            Step::Open(target)
        } else if let Some(n) = step.strip_prefix('-').and_then(|n| n.parse().ok()) {
            Step::Release(n)
        } else if let Some((n, word)) = io_step(step, 'w') {
            Step::Write(n, word)
        } else if let Some((n, word)) = io_step(step, 'r') {
            Step::Check(n, word)
        } else {
            Step::Bad(step)
        }
    })
}

/// `<letter><n>=<word>`, `word` 1 to 4096 bytes.
fn io_step(step: &str, letter: char) -> Option<(usize, &str)> {
    let (n, word) = step.strip_prefix(letter)?.split_once('=')?;
    let n = n.parse().ok()?;
    (!word.is_empty() && word.len() <= 4096).then_some((n, word))
}

/// The first block `w<n>=<word>` writes: `word`, then zeros.
pub fn block_of(word: &str) -> [u8; 4096] {
    let mut block = [0u8; 4096];
    block[..word.len()].copy_from_slice(word.as_bytes());
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_open_release_or_are_refused() {
        let all: Vec<_> = steps("+nvme:1:part=1;+virtio:0;-0;-x;ram:1M;-1").collect();
        assert_eq!(
            all,
            [
                Step::Open("nvme:1:part=1"),
                Step::Open("virtio:0"),
                Step::Release(0),
                Step::Bad("-x"),
                Step::Bad("ram:1M"),
                Step::Release(1),
            ]
        );
        assert_eq!(steps("").collect::<Vec<_>>(), [Step::Bad("")]);
        let io: Vec<_> = steps("w0=abc;r12=x=y;w=1;r1=;wx=1;w1").collect();
        assert_eq!(
            io,
            [
                Step::Write(0, "abc"),
                Step::Check(12, "x=y"),
                Step::Bad("w=1"),
                Step::Bad("r1="),
                Step::Bad("wx=1"),
                Step::Bad("w1"),
            ]
        );
        let block = block_of("ab");
        assert_eq!(
            (&block[..2], block[2..].iter().all(|&b| b == 0)),
            (&b"ab"[..], true)
        );
    }
}
