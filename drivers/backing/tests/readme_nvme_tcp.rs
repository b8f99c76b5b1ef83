// SPDX-License-Identifier: MIT OR Apache-2.0
//! README.md's table of `nvme-tcp:` options (the one whose header is `option | value |
//! default | what`) says what the parser does: every row's option is accepted with its
//! default, which is the parser's, and refused past the top of its range; and the
//! reconnect times it has are all there; so is `portal=`, with as many as the parser
//! takes.

use backing::{parse_nvme_tcp, ReconnectTimes};

const TARGET: &str = "nvme-tcp:10.9.0.1:4420:1:nqn=nqn.2026-12.com.example:web";

/// The rows of README's option table: (option, value, default), backticks removed.
fn rows() -> Vec<(String, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut rows = Vec::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if !line.starts_with('|') {
            inside = false;
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().replace('`', ""))
            .collect();
        if cells.len() >= 3 && cells[..3] == ["option", "value", "default"] {
            inside = true;
        } else if inside && !cells[0].starts_with("---") {
            rows.push((cells[0].clone(), cells[1].clone(), cells[2].clone()));
        }
    }
    rows
}

fn times(options: &str) -> Result<ReconnectTimes, String> {
    parse_nvme_tcp(&format!("{TARGET},{options}"))
        .map(|t| t.reconnect)
        .map_err(|e| e.to_string())
}

#[test]
fn readme_gives_each_nvme_tcp_option_its_range_and_default() {
    let rows = rows();
    let keys: Vec<&str> = rows
        .iter()
        .map(|(option, _, _)| option.split('=').next().unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        ["reconnect-delay", "ctrl-loss-tmo", "portal"],
        "README.md's nvme-tcp option table"
    );
    // portal=: "up to N", none by default.
    let (_, value, default) = &rows[2];
    assert_eq!(default, "none");
    let most: usize = value
        .strip_prefix("up to ")
        .and_then(|v| v.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("portal: value {value:?} is not 'up to <n>, ...'"));
    let portals = |n: usize| {
        let options: Vec<String> = (1..=n).map(|i| format!("portal=10.9.0.{i}:4421")).collect();
        parse_nvme_tcp(&format!("{TARGET},{}", options.join(",")))
            .map(|t| t.portals().count())
            .map_err(|e| e.to_string())
    };
    assert_eq!(portals(most), Ok(1 + most));
    assert!(portals(most + 1).is_err(), "{} portal= options", most + 1);
    assert_eq!(parse_nvme_tcp(TARGET).map(|t| t.portals().count()), Ok(1));
    for ((_, value, default), key) in rows.iter().zip(&keys).take(2) {
        assert_eq!(
            times(&format!("{key}={default}")),
            Ok(ReconnectTimes::DEFAULT),
            "{key}: README's default is not the parser's"
        );
        let (_, top) = value
            .split_once(" to ")
            .unwrap_or_else(|| panic!("{key}: value {value:?} is not <least> to <most>"));
        let top: u32 = top.parse().unwrap();
        let with_delay = |tmo: u32| format!("reconnect-delay=1,{key}={tmo}");
        let options = |n: u32| match *key {
            "ctrl-loss-tmo" => with_delay(n),
            _ => format!("{key}={n}"),
        };
        assert!(times(&options(top)).is_ok(), "{key}={top}");
        assert!(times(&options(top + 1)).is_err(), "{key}={}", top + 1);
        assert!(times(&format!("{key}=0")).is_err(), "{key}=0");
    }
    assert_eq!(
        (
            ReconnectTimes::MAX_DELAY_S,
            ReconnectTimes::MAX_CTRL_LOSS_TMO_S
        ),
        (60, 3600),
        "README's table and this test's ranges"
    );
}
