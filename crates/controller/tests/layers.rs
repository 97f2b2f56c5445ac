//! The controller's modules import each other without circles, and only
//! downwards in [`LAYERS`] (docs/architecture.md, "Inside the controller", draws the same
//! rows): each module's `crate::` paths (and a submodule's `super::` paths
//! that leave its parent) name modules in its own row or below. A module
//! and its own submodules count as one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The controller's top-level modules, top row first.
const LAYERS: &[&[&str]] = &[
    &["controller"],
    &["worker"],
    &["admin", "io"],
    &["command"],
    &["inflight"],
    &["io_request"],
    &["state"],
    &["queue"],
    &["doorbell"],
    &["subsystem", "sanitize", "self_test"],
    &["namespace"],
    &["persistent_event_log", "telemetry"],
    &["config", "regs"],
    &["vendor", "sgl"],
    &["prp"],
    &["stats"],
    &[
        "memory",
        "backend_error",
        "mailbox",
        "poll_window",
        "irq_batch",
        "uncorrectable",
        "keep_alive",
        "firmware",
        "streams",
        "background",
        "timestamp",
        "protection",
        "zoned",
        "faults",
        "reservation",
    ],
];

/// The row of `module` (by its top-level module) in [`LAYERS`].
fn row(module: &str) -> Option<usize> {
    let top = module.split('/').next().unwrap_or(module);
    LAYERS.iter().position(|r| r.contains(&top))
}

/// Module path ("worker/cq") of every source file except the crate root,
/// unit tests and test helpers, with its text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().to_str().unwrap().to_owned();
            let Some(stem) = rel.strip_suffix(".rs") else {
                continue;
            };
            if rel == "lib.rs" || rel == "testing.rs" || rel.starts_with("tests/") {
                continue;
            }
            if rel.ends_with("/tests.rs") {
                continue;
            }
            let name = stem.strip_suffix("/mod").unwrap_or(stem).to_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may reach anywhere.
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => text[..i].to_owned(),
                None => text,
            };
            out.insert(name, text);
        }
    }
    out
}

/// The longest known module that `segments` starts with.
fn resolve(known: &BTreeMap<String, String>, segments: &[&str]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("/"))
        .find(|m| known.contains_key(m))
}

/// Paths following `prefix` in `text`: `a::b::c` as ["a", "b", "c"].
fn paths<'t>(text: &'t str, prefix: &str) -> Vec<Vec<&'t str>> {
    text.match_indices(prefix)
        .filter(|(i, _)| {
            // Not the tail of a longer identifier (`mycrate::`).
            !text[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, _)| {
            let rest = &text[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            rest[..end]
                .split("::")
                .filter(|s| s.chars().next().is_some_and(|c| c.is_lowercase()))
                .collect()
        })
        .collect()
}

fn imports(known: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for (module, text) in known {
        // Comments (doc links among them) are not imports.
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect();
        let text = code.join("\n");
        let text = text.as_str();
        let mut to = BTreeSet::new();
        let parent: Vec<&str> = module.split('/').collect();
        let parent = &parent[..parent.len() - 1];
        let mut targets: Vec<Option<String>> = paths(text, "crate::")
            .iter()
            .map(|p| resolve(known, p))
            .collect();
        for p in paths(text, "super::") {
            let mut full: Vec<&str> = parent.to_vec();
            full.extend(p);
            targets.push(resolve(known, &full));
        }
        for t in targets.into_iter().flatten() {
            // Itself, its parent or its own submodules: one unit.
            let own = t == *module
                || module.starts_with(&format!("{t}/"))
                || t.starts_with(&format!("{module}/"));
            if !own {
                to.insert(t);
            }
        }
        edges.insert(module.clone(), to);
    }
    edges
}

/// A module reachable from itself, with the path back, if any.
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == m) {
            let mut c = stack[i..].to_vec();
            c.push(m.to_owned());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m.to_owned());
        for next in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

#[test]
fn controller_modules_import_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    assert!(known.len() > 20, "found only {:?}", known.keys());
    let edges = imports(&known);
    // The scan sees real imports (else an empty graph would pass).
    assert!(edges["worker"].contains("queue"), "{:?}", edges["worker"]);
    if let Some(c) = circle(&edges) {
        panic!("import circle: {}", c.join(" -> "));
    }
    for (module, to) in &edges {
        let own = row(module).unwrap_or_else(|| panic!("{module} is in no row of LAYERS"));
        for t in to {
            let theirs = row(t).unwrap_or_else(|| panic!("{t} is in no row of LAYERS"));
            assert!(theirs >= own, "{module} imports {t}, a row above it");
        }
    }
}

#[test]
fn the_scan_finds_a_circle_when_there_is_one() {
    let mut known = BTreeMap::new();
    known.insert("a".to_owned(), "use crate::b::X;".to_owned());
    known.insert("b".to_owned(), "use super::c::Y;".to_owned());
    known.insert("c".to_owned(), "fn f() { crate::a::g() }".to_owned());
    known.insert(
        "g".to_owned(),
        "/// See [`crate::a`].\nfn g() {} // crate::b".to_owned(),
    );
    known.insert("d/e".to_owned(), "use super::f;".to_owned());
    known.insert("d".to_owned(), "use crate::d::e::Z;".to_owned());
    let edges = imports(&known);
    assert_eq!(
        circle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert!(
        edges["d"].is_empty(),
        "a module's own submodules: {edges:?}"
    );
    assert!(edges["g"].is_empty(), "comments: {edges:?}");
}
