//! The module rules of docs/architecture.md, checked on the source: which
//! module may name which (`crate::…` paths and `super::…` siblings in the
//! code, doc comments and test modules left out), so that a change that
//! breaks one fails here rather than in a later review.
//!
//! * no cycle between modules, at any of the first three levels of the
//!   tree (`broker` ↔ `wal`, `broker::shard` ↔ `broker::outbox`,
//!   `wal::log` ↔ `wal::repair`);
//! * the front ends do not know each other: `broker` and `text` name
//!   nothing of `zmq_io`, and the core knows its job log only through the
//!   seam: `broker` names nothing of `wal` or `jslog`; `wal`, `jslog` and
//!   `joblog` nothing of `broker` (nor `wal` and `joblog` of `jslog`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path: `["broker", "shard", "flow"]`.
type Module = Vec<String>;

/// Every `.rs` file under `dir`, tests and binaries left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" && name != "bin" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The module a file defines (`src/broker/shard/mod.rs` → `broker::shard`).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file's code: comment lines and everything from the first
/// `#[cfg(test)]` on (test modules end the files here) left out.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The names after `prefix` in `code`: `prefix a::b` gives `[a, b]`, a
/// group `prefix {a::b, c}` gives `[a, b]` and `[c]`.
fn paths_after(code: &str, prefix: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let path = path_words(item.trim());
                if !path.is_empty() {
                    out.push(path);
                }
            }
        } else {
            out.push(path_words(rest));
        }
    }
    out
}

/// The leading `a::b::c` of `text`, lower-case words only (modules, not
/// types).
fn path_words(text: &str) -> Module {
    let mut words = Vec::new();
    let mut rest = text;
    loop {
        let word: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if word.is_empty() || !word.starts_with(|c: char| c.is_ascii_lowercase()) {
            break;
        }
        rest = &rest[word.len()..];
        words.push(word);
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    words
}

/// Module → the modules it names, each cut to `depth` levels.
fn edges(depth: usize) -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let known: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let me = module_of(&src, file);
        if me.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file");
        let code = code(&text);
        let mut named: Vec<Module> = paths_after(&code, "crate::");
        let parent = &me[..me.len() - usize::from(!file.ends_with("mod.rs"))];
        for sibling in paths_after(&code, "super::") {
            let mut path = parent[..parent.len().saturating_sub(1)].to_vec();
            path.extend(sibling);
            named.push(path);
        }
        let cut = |m: &Module| m[..m.len().min(depth)].to_vec();
        for target in named {
            // The longest known module the path starts with.
            let Some(module) = (1..=target.len()).rev().map(|n| target[..n].to_vec()).find(|m| known.contains(m))
            else {
                continue;
            };
            let (from, to) = (cut(&me), cut(&module));
            if from != to && !to.starts_with(&from) && !from.starts_with(&to) {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    edges
}

/// The cycles of `edges`, each once, as `a -> b -> a`.
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    fn walk(
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        start: &Module,
        path: &mut Vec<Module>,
        found: &mut BTreeSet<Vec<Module>>,
    ) {
        let Some(next) = edges.get(path.last().expect("a start")) else { return };
        for n in next {
            if n == start {
                let low = (0..path.len()).min_by_key(|&i| &path[i]).unwrap_or(0);
                let mut cycle = path[low..].to_vec();
                cycle.extend_from_slice(&path[..low]);
                found.insert(cycle);
            } else if !path.contains(n) && path.len() < 6 {
                path.push(n.clone());
                walk(edges, start, path, found);
                path.pop();
            }
        }
    }
    let mut found = BTreeSet::new();
    for start in edges.keys() {
        walk(edges, start, &mut vec![start.clone()], &mut found);
    }
    found
        .into_iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            names.push(names[0].clone());
            names.join(" -> ")
        })
        .collect()
}

#[test]
fn no_module_imports_one_that_imports_it() {
    for depth in 1..=3 {
        assert_eq!(cycles(&edges(depth)), Vec::<String>::new(), "cycles at depth {depth}");
    }
}

#[test]
fn the_core_knows_no_front_end_and_its_log_only_through_the_seam() {
    let edges = edges(1);
    let names = |from: &str| -> Vec<String> {
        edges.get(&vec![from.to_string()]).into_iter().flatten().map(|m| m.join("::")).collect()
    };
    for (from, forbidden) in [
        ("broker", "zmq_io"),
        ("text", "zmq_io"),
        ("broker", "wal"),
        ("wal", "broker"),
        ("joblog", "broker"),
        ("joblog", "wal"),
        ("broker", "jslog"),
        ("jslog", "broker"),
        ("joblog", "jslog"),
        ("wal", "jslog"),
    ] {
        assert!(!names(from).contains(&forbidden.to_string()), "{from} names {forbidden}: {:?}", names(from));
    }
    assert!(
        names("broker").contains(&"joblog".to_string()),
        "the checker sees broker's imports: {:?}",
        names("broker")
    );
    assert!(names("router").contains(&"zmq_io".to_string()), "and router's: {:?}", names("router"));
}

#[test]
fn the_checker_reads_paths_and_finds_a_cycle() {
    let code = "use crate::{wal::log, broker::shard::Shard};\nuse super::{outbox, inbox::ShardMsg};\nlet x = crate::ids::show(b);";
    let words = |m: Vec<Module>| m.iter().map(|p| p.join("::")).collect::<Vec<_>>();
    assert_eq!(words(paths_after(code, "crate::")), ["wal::log", "broker::shard", "ids::show"]);
    assert_eq!(words(paths_after(code, "super::")), ["outbox", "inbox"]);
    let m = |s: &str| vec![s.to_string()];
    let edges = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a")])),
    ]);
    assert_eq!(cycles(&edges), ["a -> b -> c -> a"]);
}
