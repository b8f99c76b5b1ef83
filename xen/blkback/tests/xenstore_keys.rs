// SPDX-License-Identifier: MIT OR Apache-2.0
//! README.md's "Xenstore keys" reference lists exactly the keys blkdom uses, each in the
//! table of its place: those of `xen::xenbus::keys::ALL` and `blkback::keys::ALL`, and
//! the self-tests' (`testhooks::keys::ALL`) in a table of their own. And no xenstore
//! call in blkdom's sources is given a key as a string literal, so every key it uses is
//! a constant of those lists.
//!
//! The section's tables each follow a bold line naming their place ([`TITLES`]); a row
//! names its key in backticks in its first cell, with placeholders for numbers
//! (`ring-ref<N>`, `vdevfn-<N>`).

use blkback::keys::Place;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The bold line above each table of README's section (how it starts), and the keys the
/// table lists: those of a place, or (`None`) the self-tests'.
const TITLES: &[(&str, Option<Place>)] = &[
    ("Backend directory, read", Some(Place::BackendRead)),
    ("Backend directory, written", Some(Place::BackendWritten)),
    ("Frontend directory, read", Some(Place::FrontendRead)),
    ("blkdom's own directory", Some(Place::Home)),
    ("dom0's pci backend directory", Some(Place::PciBackend)),
    ("blkdom's vif directory", Some(Place::VifFrontend)),
    ("The vif's backend directory", Some(Place::VifBackend)),
    ("The test image only", None),
];

type Listed = BTreeSet<(Option<Place>, String)>;

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// The keys of the code's lists.
fn known() -> Listed {
    let places = xen::xenbus::keys::ALL.iter().chain(blkback::keys::ALL);
    let self_tests = testhooks::keys::ALL.iter().map(|&name| (None, name));
    places
        .map(|key| (Some(key.place), key.name))
        .chain(self_tests)
        .map(|(place, name)| (place, name.to_string()))
        .collect()
}

/// README's "Xenstore keys" section: up to the next heading.
fn section(readme: &str) -> &str {
    let start = readme
        .find("\n### Xenstore keys\n")
        .expect("README.md has no \"### Xenstore keys\" section");
    let body = &readme[start + 1..];
    let body = &body[body.find('\n').map_or(body.len(), |end| end + 1)..];
    let end = body.find("\n#").map_or(body.len(), |end| end + 1);
    &body[..end]
}

/// The keys the tables of `section` list, each with the place of its table.
fn documented(section: &str) -> Listed {
    let mut listed = Listed::new();
    let mut place = None;
    for line in section.lines() {
        if let Some(bold) = line.strip_prefix("**") {
            let title = bold.split("**").next().unwrap_or_default();
            let found = TITLES.iter().find(|(start, _)| title.starts_with(start));
            let (_, found) = found.unwrap_or_else(|| {
                panic!("README.md's xenstore keys: no place for the table under {title:?}")
            });
            place = Some(*found);
        } else if line.starts_with('|') {
            let first_cell = line.split('|').nth(1).unwrap_or_default();
            // The header row and the separator name no key.
            let Some(key) = first_cell.split('`').nth(1) else {
                continue;
            };
            let place = place.unwrap_or_else(|| {
                panic!("README.md's xenstore keys: a table before any place: {line}")
            });
            listed.insert((place, key.to_string()));
        }
    }
    listed
}

#[test]
fn readme_lists_every_key_in_its_place_and_no_other() {
    let path = manifest_path("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let documented = documented(section(&readme));
    let known = known();
    let missing: Vec<_> = known.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's xenstore keys and the code's lists (xen::xenbus::keys, blkback::keys, \
         testhooks::keys) differ (None: the self-tests'):\n  \
         used by blkdom, not in README: {missing:?}\n  \
         in README, not used by blkdom: {unknown:?}"
    );
}

#[test]
fn tables_are_read_in_their_place() {
    let text = "\
### Xenstore keys\n\
\n\
**Backend directory, read** (`/local/domain/<blkdom>/backend/vbd/<domid>/<devid>/`):\n\
\n\
| key | what |\n\
|---|---|\n\
| `params` | the backing store (`target=`) |\n\
\n\
**The test image only:**\n\
\n\
| key | what |\n\
|---|---|\n\
| `data/blkdom-ack` | x |\n\
\n\
### Statistics\n\
\n\
| `queues` | y |\n";
    let expected: Listed = [
        (Some(Place::BackendRead), "params".to_string()),
        (None, "data/blkdom-ack".to_string()),
    ]
    .into();
    assert_eq!(documented(section(&format!("# x\n{text}"))), expected);
}

/// Calls that take a xenstore path (the `XenStore` trait's, the xenstore client's, and
/// negotiation's helpers): name, arguments, and which argument is the path.
const PATH_CALLS: &[(&str, usize, usize)] = &[
    ("read", 2, 1),
    ("read_string", 2, 1),
    ("read_u64", 2, 1),
    ("write", 3, 1),
    ("mkdir", 2, 1),
    ("rm", 2, 1),
    ("directory", 2, 1),
    ("watch", 2, 0),
    ("unwatch", 2, 0),
    ("read_u32", 2, 1),
    ("required_u32", 2, 1),
    ("key", 1, 0),
    ("write_in_transaction", 3, 1),
];

/// The sources that may talk to xenstore (relative to this crate), without their tests
/// and fakes.
const SOURCES: &[&str] = &["../../kernel/src", "../src", "src", "../netfront/src"];

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
}

/// Rust source as identifiers, string literals and punctuation, each with its line;
/// comments, numbers' dots, char literals and lifetimes need no more care than this.
fn tokens(source: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let (mut at, mut line) = (0, 1);
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        if c == '\n' {
            line += 1;
            at += 1;
        } else if c.is_whitespace() {
            at += 1;
        } else if c == '/' && next == Some('/') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if c == '/' && next == Some('*') {
            at += 2;
            while at + 1 < chars.len() && !(chars[at] == '*' && chars[at + 1] == '/') {
                line += usize::from(chars[at] == '\n');
                at += 1;
            }
            at += 2;
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            at += if c == 'b' { 2 } else { 1 };
            let (start_line, mut text) = (line, String::new());
            while at < chars.len() && chars[at] != '"' {
                if chars[at] == '\\' {
                    text.push(chars[at]);
                    at += 1;
                }
                line += usize::from(chars.get(at) == Some(&'\n'));
                text.extend(chars.get(at));
                at += 1;
            }
            at += 1;
            out.push((start_line, Token::Str(text)));
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && chars
                .get(at + usize::from(c == 'b') + 1..)
                .and_then(|rest| rest.iter().find(|&&c| c != '#'))
                == Some(&'"')
        {
            // A raw string: r"..", r#".."#, br"..".
            at += 1 + usize::from(c == 'b');
            let hashes = chars[at..].iter().take_while(|&&c| c == '#').count();
            at += hashes + 1;
            let end: String = core::iter::once('"')
                .chain(core::iter::repeat_n('#', hashes))
                .collect();
            let rest: String = chars[at..].iter().collect();
            let length = rest.find(&end).unwrap_or(rest.len());
            let text = &rest[..length];
            out.push((line, Token::Str(text.to_string())));
            line += text.matches('\n').count();
            at += text.chars().count() + end.chars().count();
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime's quote.
            let close = match next {
                Some('\\') => chars
                    .get(at + 3..)
                    .and_then(|rest| rest.iter().position(|&c| c == '\''))
                    .map(|p| p + 3),
                _ if chars.get(at + 2) == Some(&'\'') => Some(2),
                _ => None,
            };
            at += close.map_or(1, |close| close + 1);
        } else if c.is_alphanumeric() || c == '_' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
            out.push((line, Token::Ident(chars[start..at].iter().collect())));
        } else {
            out.push((line, Token::Punct(c)));
            at += 1;
        }
    }
    out
}

/// The arguments of the call whose `(` is at `open`, as token ranges (a trailing comma
/// makes no argument).
fn arguments(tokens: &[(usize, Token)], open: usize) -> Vec<&[(usize, Token)]> {
    let (mut args, mut start, mut depth) = (Vec::new(), open + 1, 0);
    for at in open + 1..tokens.len() {
        match tokens[at].1 {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') if depth == 0 => {
                if at > start {
                    args.push(&tokens[start..at]);
                }
                break;
            }
            Token::Punct(')' | ']' | '}') => depth -= 1,
            Token::Punct(',') if depth == 0 => {
                args.push(&tokens[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    args
}

/// `text` without its format placeholders (`{path}/params` -> `/params`).
fn without_placeholders(text: &str) -> String {
    let mut depth = 0;
    text.chars()
        .filter(|&c| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// Whether a literal names a key: what is left of it without placeholders is more than
/// the slashes that join a directory and a key.
fn names_a_key(literal: &str) -> bool {
    without_placeholders(literal).chars().any(|c| c != '/')
}

/// Whether a literal looks like a key, as the first of a (key, value) pair.
fn looks_like_a_key(literal: &str) -> bool {
    let text = without_placeholders(literal);
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_/<>".contains(c))
}

/// The names of a format string's placeholders (`{path}/{PARAMS:?}`: `path`, `PARAMS`).
fn placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.split('{')
        .skip(1)
        .filter_map(|rest| rest.split('}').next())
        .map(|inside| inside.split(':').next().unwrap_or_default())
}

/// The string constants `tokens` defines (`const NAME: &str = "..";`), by name.
fn string_constants(tokens: &[(usize, Token)]) -> BTreeMap<&str, &str> {
    let mut constants = BTreeMap::new();
    for (at, (_, token)) in tokens.iter().enumerate() {
        let (Token::Ident(keyword), Some((_, Token::Ident(name)))) = (token, tokens.get(at + 1))
        else {
            continue;
        };
        if keyword != "const" {
            continue;
        }
        let rest = tokens[at + 2..].iter().map(|(_, token)| token);
        let mut definition = rest.skip_while(|&token| *token != Token::Punct('='));
        if let (Some(_), Some(Token::Str(value)), Some(Token::Punct(';'))) =
            (definition.next(), definition.next(), definition.next())
        {
            constants.insert(name.as_str(), value.as_str());
        }
    }
    constants
}

/// Where `source` gives a xenstore call a key as a literal: the path argument of a
/// [`PATH_CALLS`] call (a literal, or a string constant of the same file, by itself or
/// in a format string), or, in a file that uses transactions, the first of a (key,
/// value) pair such as `write_in_transaction` takes (elsewhere a pair is more likely a
/// statistic's name and value).
fn literal_keys(source: &str) -> Vec<(usize, String)> {
    let pairs_are_keys = ["NO_TRANSACTION", "Transaction::", "write_in_transaction"]
        .iter()
        .any(|name| source.contains(name));
    let tokens = tokens(source);
    let constants = string_constants(&tokens);
    let mut found = Vec::new();
    for at in 0..tokens.len().saturating_sub(2) {
        let previous = at.checked_sub(1).map(|p| &tokens[p].1);
        match (&tokens[at].1, &tokens[at + 1].1, &tokens[at + 2].1) {
            (Token::Ident(name), Token::Punct('('), _)
                if previous != Some(&Token::Ident("fn".into())) =>
            {
                let args = arguments(&tokens, at + 1);
                let Some(&(_, _, path)) = PATH_CALLS
                    .iter()
                    .find(|(call, arity, _)| call == name && *arity == args.len())
                else {
                    continue;
                };
                for (line, token) in args[path] {
                    let literal = match token {
                        Token::Str(literal) if names_a_key(literal) => literal,
                        Token::Str(text) => {
                            match placeholders(text).find_map(|name| constants.get(name)) {
                                Some(literal) => *literal,
                                None => continue,
                            }
                        }
                        Token::Ident(constant) => match constants.get(constant.as_str()) {
                            Some(literal) => *literal,
                            None => continue,
                        },
                        _ => continue,
                    };
                    found.push((*line, format!("{name}(.., {literal:?}, ..)")));
                }
            }
            (Token::Punct('('), Token::Str(literal), Token::Punct(','))
                if pairs_are_keys
                    && matches!(previous, Some(Token::Punct('(' | '[' | '{' | ',' | '=')))
                    && looks_like_a_key(literal) =>
            {
                found.push((tokens[at].0, format!("({literal:?}, ..)")));
            }
            _ => {}
        }
    }
    found
}

/// The code of `file` outside its inline test module.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(tests) => text[..tests].to_string(),
        None => text,
    }
}

fn rust_files(directory: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(directory).unwrap_or_else(|e| panic!("{directory:?}: {e}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() && name != "tests" && name != "fake" {
            rust_files(&path, files);
        } else if name.ends_with(".rs") && name != "fake.rs" {
            files.push(path);
        }
    }
}

#[test]
fn no_xenstore_call_is_given_a_literal_key() {
    let mut files = Vec::new();
    for directory in SOURCES {
        rust_files(&manifest_path(directory), &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with("negotiate.rs")),
        "{files:?}"
    );
    let root = manifest_path("../..")
        .canonicalize()
        .expect("the repository");
    let found: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let canonical = file.canonicalize().expect("a source file");
            let name = canonical
                .strip_prefix(&root)
                .unwrap_or(file)
                .display()
                .to_string();
            literal_keys(&code_of(file))
                .into_iter()
                .map(move |(line, call)| format!("{name}:{line}: {call}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "xenstore keys given as literals; name them in xen::xenbus::keys or \
         blkback::keys (and README.md's \"Xenstore keys\"):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn literal_keys_are_found_in_calls_and_pairs() {
    let source = r#"
        use NO_TRANSACTION;
        fn read(&mut self, tx: TxId, path: &str) {}
        // store.read(tx, "in a comment")
        let a = store.read(NO_TRANSACTION, &format!("{path}/params"));
        let b = xs.write(Transaction::NONE, CONTROL_FEATURE_REBOOT, b"1");
        let c = xs.watch("data/blkdom-report", "report");
        let d = store.read(NO_TRANSACTION, &format!("{path}/{PARAMS}"));
        let e = self.read(queue, "header", at, len);
        let f = store.write(NO_TRANSACTION, &format!("{}/{}", dir, numbered(QUEUE_N, q)), "error");
        let keys = vec![(SECTORS, s), ("sectors", s.to_string())];
        tests.push(("xen.event-channel-loopback", f));
        let g = required_u32(store, &format!("{dir}/ring-ref{i}"));
        let h = 'x'; let i: &'static str = "(";
        let j = self.key("state");
        const STATS: &str = "blkdom-stats";
        let k = store.write(NO_TRANSACTION, STATS, &line);
        let l = store.write(NO_TRANSACTION, &format!("{path}/{STATS}"), &line);
        let m = xs.watch(PARAMS, TOKEN);
    "#;
    let lines: Vec<usize> = literal_keys(source).into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, [5, 7, 11, 13, 15, 17, 18]);
    let statistics = r#"[("refused-requests", self.refused_requests)]"#;
    assert_eq!(literal_keys(statistics), []);
}
