// SPDX-License-Identifier: MIT OR Apache-2.0
//! `registrytest=<step>;<step>;...`: a step `+<target>` opens a disk as a vbd's `params`
//! would and keeps it; `-<n>` releases the disk of step `n` (counting the `+` steps
//! from 0).

/// One step of the registry test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// `+<target>`: open a disk.
    Open(&'a str),
    /// `-<n>`: release the disk of the `n`-th open.
    Release(usize),
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
        } else {
            Step::Bad(step)
        }
    })
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
    }
}
