// SPDX-License-Identifier: MIT OR Apache-2.0
//! README.md's command-line reference lists exactly the keys the kernel reads
//! (`bootconfig::KEYS`), and keeps the test hooks out of the settings' table.
//!
//! A command-line table is a markdown table whose rows start with a key in backticks
//! (`` `key` ``, `` `key=<value>` ``, several in one cell allowed) and which names at
//! least one key of the list; which section holds it does not matter.

use bootconfig::{Role, KEYS};
use std::collections::BTreeSet;

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The first cell of a table row (`|` escaped as `\|` does not end it).
fn first_cell(row: &str) -> &str {
    let row = row.trim().strip_prefix('|').unwrap_or_default();
    let mut escaped = false;
    for (at, c) in row.char_indices() {
        match c {
            '|' if !escaped => return &row[..at],
            _ => escaped = c == '\\',
        }
    }
    row
}

/// What looks like a command-line key: lowercase words of letters, digits and `-`,
/// joined by dots.
fn looks_like_key(text: &str) -> bool {
    !text.is_empty()
        && text.split('.').all(|word| {
            word.starts_with(|c: char| c.is_ascii_lowercase())
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The keys a first cell names: each `` `key` `` or `` `key=...` `` in it.
fn keys_in(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|code| code.split('=').next().unwrap_or_default().trim())
        .filter(|key| looks_like_key(key))
        .map(str::to_string)
        .collect()
}

/// Every markdown table of `text`, as the keys of each row's first cell.
fn tables(text: &str) -> Vec<Vec<String>> {
    let mut tables = Vec::new();
    let mut table: Option<Vec<String>> = None;
    for line in text.lines() {
        if line.trim_start().starts_with('|') {
            table
                .get_or_insert_with(Vec::new)
                .extend(keys_in(first_cell(line)));
        } else if let Some(done) = table.take() {
            tables.push(done);
        }
    }
    tables.extend(table);
    tables
}

/// The tables that name a key of the list: README's command-line reference.
fn command_line_tables(text: &str) -> Vec<Vec<String>> {
    let known: BTreeSet<&str> = KEYS.iter().map(|k| k.name).collect();
    tables(text)
        .into_iter()
        .filter(|keys| keys.iter().any(|key| known.contains(key.as_str())))
        .collect()
}

#[test]
fn readme_lists_every_key_and_no_other() {
    let tables = command_line_tables(&readme());
    assert!(
        !tables.is_empty(),
        "README.md has no table of command-line keys"
    );
    let documented: BTreeSet<&str> = tables.iter().flatten().map(String::as_str).collect();
    let known: BTreeSet<&str> = KEYS.iter().map(|k| k.name).collect();
    let missing: Vec<&&str> = known.difference(&documented).collect();
    let unknown: Vec<&&str> = documented.difference(&known).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's command-line tables and bootconfig::KEYS differ:\n  \
         read by the kernel, not in README: {missing:?}\n  \
         in README, not read by the kernel: {unknown:?}"
    );
}

/// The cells of a table row, `\|` kept inside a cell.
fn cells(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut rest = row.trim();
    while let Some(after) = rest.strip_prefix('|') {
        let cell = first_cell(rest);
        if after.trim().is_empty() {
            break;
        }
        cells.push(cell.trim().to_string());
        rest = &after[cell.len()..];
    }
    cells
}

#[test]
fn readme_gives_each_setting_the_default_in_use() {
    let text = readme();
    let mut default_column = None;
    let mut checked = 0;
    for line in text.lines() {
        if !line.trim_start().starts_with('|') {
            default_column = None;
            continue;
        }
        let row = cells(line);
        if default_column.is_none() {
            default_column = row.iter().position(|cell| cell == "default");
            continue;
        }
        let (Some(column), [key, ..]) = (default_column, row.as_slice()) else {
            continue;
        };
        let Some(doc) = keys_in(key)
            .first()
            .and_then(|name| KEYS.iter().find(|k| k.name == name))
            .filter(|doc| doc.role == Role::Setting)
        else {
            continue;
        };
        let shown = row.get(column).map_or("", |cell| cell.trim_matches('`'));
        assert_eq!(
            shown, doc.default,
            "README.md gives {} the default {shown:?}; the kernel uses {:?}",
            doc.name, doc.default
        );
        checked += 1;
    }
    let settings = KEYS.iter().filter(|k| k.role == Role::Setting).count();
    assert_eq!(
        checked, settings,
        "README.md's settings table has no default column for every setting"
    );
}

#[test]
fn readme_keeps_test_hooks_out_of_the_settings_table() {
    for table in command_line_tables(&readme()) {
        let kinds: BTreeSet<bool> = table
            .iter()
            .filter_map(|key| KEYS.iter().find(|k| k.name == key))
            .map(|k| k.role == Role::Setting)
            .collect();
        assert!(
            kinds.len() == 1,
            "README.md has settings and test hooks in one table: {table:?}"
        );
    }
}

#[test]
fn tables_are_found_wherever_they_are() {
    let text = "\
# Reference\n\
\n\
| key | default | what |\n\
|---|---|---|\n\
| `loglevel` | `info` | console log level |\n\
| `poll.idle=auto\\|pause` | `auto` | a \\| b |\n\
\n\
Statistics:\n\
\n\
| statistic | what |\n\
|---|---|\n\
| `mapped-pages` | pages |\n\
\n\
| hook | what |\n\
|---|---|\n\
| `selftest`, `selftest.await-dom0` | x |\n\
| `disktest=<target>` | y |\n";
    let found = command_line_tables(text);
    assert_eq!(
        found,
        [
            vec!["loglevel", "poll.idle"],
            vec!["selftest", "selftest.await-dom0", "disktest"]
        ]
    );
    assert_eq!(first_cell("| `a\\|b` | c |"), " `a\\|b` ");
    assert!(!looks_like_key("nvme:1"));
    assert!(!looks_like_key("Pause"));
    assert!(looks_like_key("grants.max-per-ring"));
}
